"""Activation recomputation: what users call "gradient checkpointing" (`checkpointing=`), not
to be confused with training checkpoints on disk.

`tf.recompute_grad` is the one wrapper: it is exact in eager, `tf.function`, XLA and `fit` as long
as the wrapped function takes its tensors positionally (masks, seeds and flags go in a closure).
`keras.RematScope` is not usable on TensorFlow (docs/design-notes.md: Recomputation).

Policies, speed against memory: "none" keeps every activation (and, with the default attention
core, the s×s probabilities of a one-tile sequence: the fastest); "selective" drops exactly the
attention core's s×s working set (QKᵀ, softmax, dropout: the chunked core recomputes them per tile
in its own backward; a chosen plain core is recomputed here); "full" keeps each block's input and
recomputes the block.
"""

import tensorflow as tf

POLICIES = ("none", "full", "selective")


def policy_name(policy) -> str:
    """A user's `checkpointing=` as a policy name: one of `POLICIES`, True (= "full"), or
    False/None (= "none")."""
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
    """`fn(*tensors)`, keeping none of fn's intermediate activations for the backward pass.

    What fn computes from variables alone (a LoRA layer's merged kernel W + s·A·B, a quantized
    kernel dequantized, a mixed-precision cast) has no data input from the block, so TensorFlow's
    graph executor would compute every block's at the start of the step and hold them all to the
    block's backward: about a float32 copy of the frozen weights. A control dependency on the
    block's input makes them wait for it (in the replay, for the output gradient, through
    tf.recompute_grad's own data dependency)."""

    def when_inputs_exist(*args):
        with tf.control_dependencies(args[:1]):
            return fn(*args)

    return tf.recompute_grad(when_inputs_exist)(*tensors)
