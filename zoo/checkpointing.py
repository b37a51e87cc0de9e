"""Activation recomputation (gradient checkpointing) policies.

`keras.RematScope`/`keras.remat` are unusable on TensorFlow (they crash in
`tf.function`/`fit`/XLA and drop gradients of keyword arguments in eager mode;
see DESIGN.md). `tf.recompute_grad` is exact everywhere as long as the function
it wraps takes its tensors positionally, so that is the one wrapper used here:
everything else a recomputed function needs (masks, seeds, flags) is captured
in a closure.

Policies:
  "none"       keep every activation for the backward pass.
  "full"       keep only each block's input; recompute the whole block.
  "selective"  recompute only the attention core (QKᵀ, softmax, dropout, ·V),
               the s²-sized part of a block's activations.
"""

POLICIES = ("none", "full", "selective")


def resolve(policy) -> str:
    """Normalise a user's `checkpointing=` argument to a policy name."""
    if policy is True:
        return "full"
    if policy is None or policy is False:
        return "none"
    if isinstance(policy, str) and policy in POLICIES:
        return policy
    raise ValueError(
        f"Unknown checkpointing policy {policy!r}; known policies: {', '.join(POLICIES)} "
        "(or True for 'full', False/None for 'none')."
    )


def recompute(fn, *tensors):
    """fn(*tensors), keeping none of fn's intermediate activations for the backward pass."""
    import tensorflow as tf  # here, so that `zoo list` / `zoo plan` start without TensorFlow

    return tf.recompute_grad(fn)(*tensors)


def set_policy(model, policy) -> str:
    """Switch every block of a built model to `policy`, without rebuilding it.

    Compiled train/predict functions are dropped so that the next call retraces
    with the new policy; weights and optimizer state are untouched.
    """
    policy = resolve(policy)
    blocks = _blocks(model)
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no checkpointable blocks.")
    for layer in blocks:
        layer.checkpointing = policy
    for attr in ("train_function", "test_function", "predict_function"):
        if hasattr(model, attr):
            setattr(model, attr, None)
    return policy


def get_policy(model) -> str:
    policies = {block.checkpointing for block in _blocks(model)}
    return policies.pop() if len(policies) == 1 else "mixed"


def _blocks(model):
    from zoo.layers.block import TransformerBlock  # layers import this module

    return [layer for layer in model._flatten_layers() if isinstance(layer, TransformerBlock)]
