"""Activation recomputation: what users call "gradient checkpointing" (`checkpointing=`), not
to be confused with training checkpoints on disk.

`tf.recompute_grad` is the one wrapper: it is exact in eager, `tf.function`, XLA and `fit` as long
as the wrapped function takes its tensors positionally (masks, seeds and flags go in a closure).
`keras.RematScope` is not usable on TensorFlow (docs/design-notes.md: Recomputation).

Policies: "none" keeps every activation; "full" keeps each block's input and recomputes the
block; "selective" recomputes only the attention core (QKᵀ, softmax, dropout, ·V), which the
chunked core never keeps anyway, so under it "selective" runs the same graph as "none".
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
    """`fn(*tensors)`, keeping none of fn's intermediate activations for the backward pass."""
    return tf.recompute_grad(fn)(*tensors)
