"""Making TensorFlow's graph executor wait: `after(x, *deps)`.

The executor runs an op as soon as its inputs exist, so a recomputation that only needs a saved
input (a block's replay, a loss chunk) would run during the forward pass, all of them at once.
Control dependencies do not hold back lowered loops, and `x + 0 * d` is folded away by Grappler's
constant folding (0 * d is a constant zero when the shapes match). What survives is TF's own
trick in `tf.recompute_grad`: a zero that depends on d's value through a comparison Grappler
cannot decide (`where(b == b, 0, nan)` of d's first element cast to bool; NaN casts to True, so
the zero is a zero whatever d holds).

The same zero, broadcast, makes large zeros that Grappler cannot fold into constants
(`unfolded_zeros`); read from a tensor, it gives that tensor a second reader (`residual`).
"""

import tensorflow as tf


def _zero(*deps):
    """A float32 scalar 0 that Grappler cannot compute ahead of `deps`."""
    first = [tf.reduce_max(tf.cast(tf.reshape(d, [-1])[:1], tf.float32)) for d in deps]
    flag = tf.cast(tf.add_n(first), tf.bool)
    return tf.where(tf.equal(flag, flag), 0.0, float("nan"))


def after(x, *deps):
    """`x`, available only once every tensor of `deps` exists (a data dependency; values unchanged)."""
    if not deps:
        return x
    return x + tf.cast(_zero(*deps), x.dtype)


def unfolded_zeros(shape, dtype, like):
    """Zeros of `shape` made when the step runs. `tf.zeros` of a static shape is folded by Grappler
    into a graph constant, whose buffer lives as long as the function: a loop accumulator of a
    layer's size, once per layer and per recomputation, stayed allocated for the whole run."""
    return tf.broadcast_to(tf.cast(_zero(like), dtype), shape)


def residual(x, h):
    """`x + h` (a residual connection), kept an add of two. Where `h` is itself a sum read by nothing else (a LoRA
    projection on a quantized base returns base + s·A·B), Grappler's arithmetic optimizer merges the two adds into
    one AddN of three, and for a float32 or float16 AddN of three or more that it finds live at its estimated peak,
    its memory optimizer accumulates into a temporary variable instead, initialised from a ZerosLike that constant
    folding turns into a graph constant of the block's output size, held as long as the traced step exists: one
    per block (dec-base float32 at 16 x 256: 9.6 MiB a block, 0.28 GiB at 30 blocks, measured with TensorFlow's
    profiler). Reading `h` once more (its first element, for `after`'s zero) keeps it an add of its own. Only where
    `h` is an add in a graph: elsewhere there is no merge to prevent, so the extra read is left out (no suite-time
    change was measured either way: 10:29 with it everywhere, 10:27 before it)."""
    if _is_graph_sum(h):
        return after(x + h, h)
    return x + h


_SUMS = ("Add", "AddV2", "AddN")


def _is_graph_sum(t):
    """Whether `t` is a traced tensor made by an add (through identities), which Grappler could merge into ours."""
    if tf.executing_eagerly() or not hasattr(t, "op"):
        return False
    op = t.op
    while op.type == "Identity":
        op = op.inputs[0].op
    return op.type in _SUMS
