"""Dropout driven by an explicit seed tensor.

Recomputation runs a block's forward pass twice. Keras' `Dropout` draws from a
stateful generator, so the second pass would draw new masks and the gradients
would be silently wrong. A stateless draw from a seed fixed before the first
pass gives the same mask both times.

Data parallelism splits the batch: under `tf.distribute` replica r holds rows
[r*b, (r+1)*b) of the global batch and draws the same seed as every other replica.
Philox is counter-based, so replica r skips the r*size(x) numbers the replicas
before it use: every replica's mask is its rows of the mask one device would
draw for the whole batch, and training on N replicas equals training on one.
"""

import tensorflow as tf
from tensorflow.python.ops import gen_stateless_random_ops_v2 as stateless_v2

_AUTO_SELECT = 3  # tf.random's default algorithm (Philox on CPU and GPU): 4 float32 per counter step


def _replica_offset(size):
    """How many numbers of the global draw come before this replica's (None on one device)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return tf.cast(context.replica_id_in_sync_group, tf.int64) * size


def replica_uniform(shape, seed):
    """Uniform [0, 1) floats of `shape` (batch first): this replica's rows of the draw
    one device would make for the whole batch."""
    size = tf.reduce_prod(tf.cast(shape, tf.int64))
    offset = _replica_offset(size)
    if offset is None:
        return tf.random.stateless_uniform(shape, seed=seed)
    key, counter = stateless_v2.stateless_random_get_key_counter(seed)
    lead = offset % 4  # a counter step yields 4 numbers: draw from the step's start, drop the lead
    counter = counter + tf.stack([tf.cast(offset // 4, tf.uint64), tf.constant(0, tf.uint64)])
    flat = stateless_v2.stateless_random_uniform_v2(
        tf.reshape(size + lead, [1]), key=key, counter=counter, alg=_AUTO_SELECT, dtype=tf.float32)
    return tf.reshape(flat[lead:], shape)


def stateless_dropout(x, rate, seed, site=0):
    """Inverted dropout of `x`; `site` separates the masks of one layer's dropout points."""
    if not rate or seed is None:
        return x
    seed = tf.random.experimental.stateless_fold_in(seed, site)
    keep = replica_uniform(tf.shape(x), seed) >= rate
    # A scalar 0, broadcast: Grappler folds `zeros_like` of a static shape into a constant that lives
    # as long as the function (one per dropout site and layer).
    return tf.where(keep, x / tf.cast(1.0 - rate, x.dtype), tf.zeros([], x.dtype))
