"""Making TensorFlow's graph executor wait: `after(x, *deps)`.

The executor runs an op as soon as its inputs exist, so a recomputation that only needs a saved
input (a block's replay, a loss chunk) would run during the forward pass, all of them at once.
Control dependencies do not hold back lowered loops, and `x + 0 * d` is folded away by Grappler's
constant folding (0 * d is a constant zero when the shapes match). What survives is TF's own
trick in `tf.recompute_grad`: a zero that depends on d's value through a comparison Grappler
cannot decide (`where(b == b, 0, nan)` of d's first element cast to bool; NaN casts to True, so
the zero is a zero whatever d holds).
"""

import tensorflow as tf


def after(x, *deps):
    """`x`, available only once every tensor of `deps` exists (a data dependency; values unchanged)."""
    if not deps:
        return x
    first = [tf.reduce_max(tf.cast(tf.reshape(d, [-1])[:1], tf.float32)) for d in deps]
    flag = tf.cast(tf.add_n(first), tf.bool)
    zero = tf.where(tf.equal(flag, flag), 0.0, float("nan"))
    return x + tf.cast(zero, x.dtype)
