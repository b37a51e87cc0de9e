"""Activation recomputation: what users call "gradient checkpointing" (`checkpointing=`).

Not to be confused with training checkpoints (`recipes`, `Recipe.checkpoint_every`),
which save weights to disk.

`keras.RematScope`/`keras.remat` are unusable on TensorFlow (they crash in
`tf.function`/`fit`/XLA and drop gradients of keyword arguments in eager mode;
see docs/design-notes.md). `tf.recompute_grad` is exact everywhere as long as the
function it wraps takes its tensors positionally, so that is the one wrapper used
here: everything else a recomputed function needs (masks, seeds, flags) is
captured in a closure.

Policies:
  "none"       keep every activation for the backward pass.
  "full"       keep only each block's input; recompute the whole block.
  "selective"  recompute only the attention core (QKᵀ, softmax, dropout, ·V),
               the s²-sized part of a block's activations. The chunked core (the
               default, zoo/layers/attention_core.py) never keeps that part in the
               first place, so under it "selective" runs the same graph as "none".
"""

import tensorflow as tf

POLICIES = ("none", "full", "selective")


def resolve(policy) -> str:
    """Normalise a user's `checkpointing=` argument to a policy name.

    Args:
        policy: one of `POLICIES`, `True` (= "full"), or `False`/`None` (= "none").

    Returns:
        The policy name.

    Example:
    >>> resolve(True)
    'full'
    """
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
    """`fn(*tensors)`, keeping none of fn's intermediate activations for the backward pass."""
    return tf.recompute_grad(fn)(*tensors)
