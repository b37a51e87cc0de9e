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

from zoo.ops.ordering import after

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


def dropout_keep(shape, rate, seed, site=0):
    """The keep-mask `stateless_dropout` draws for `x` of `shape`."""
    return replica_uniform(shape, tf.random.experimental.stateless_fold_in(seed, site)) >= rate


def stateless_dropout(x, rate, seed, site=0, keep=None):
    """Inverted dropout of `x`; `site` separates the masks of one layer's dropout points; `keep`:
    the mask, drawn ahead (`Masks`), instead of drawing it here."""
    if not rate or (seed is None and keep is None):
        return x
    keep = dropout_keep(tf.shape(x), rate, seed, site) if keep is None else keep
    # A scalar 0, broadcast: Grappler folds `zeros_like` of a static shape into a constant that lives
    # as long as the function (one per dropout site and layer).
    return tf.where(keep, x / tf.cast(1.0 - rate, x.dtype), tf.zeros([], x.dtype))


class Masks:
    """One block call's dropout: the seed its masks are drawn from, and the masks drawn ahead and held
    as bits (`hold`, `held`).

    A block that runs more than once with the same draws (its forward pass and its replay under
    "full"; the fused update's forward, norm and update passes) reads a held mask back instead of
    drawing it again: unpacking enc-base's 4 x 12 x 512² attention mask took 4 ms on this CPU,
    drawing it 27 ms (Philox is the cost), packing it 3 ms. A held mask costs 1 bit per element,
    1/32 of the float32 scores it masks."""

    def __init__(self, seed):
        self.seed, self._held = seed, {}

    def hold(self, site, keep):
        self._held[site] = (pack_bits(keep), tf.shape(keep), keep.shape)

    def held(self, site, when):
        """The mask held for `site`, as booleans, unpacked once `when` exists (the tensor it masks:
        with the held bits as its only input, TF's executor could unpack every block's masks for the
        backward pass as soon as they are drawn, in the forward pass, and hold them all); None where
        it is drawn from the seed."""
        if site not in self._held:
            return None
        bits, shape, static = self._held[site]
        keep = unpack_bits(after(bits, when), shape)
        keep.set_shape(static)
        return keep


# Eight booleans (bytes of 0 or 1) read as one little-endian uint64 times this constant have their
# bits gathered, in order, in the top byte (each byte's 1 lands on its own bit, no carries). The
# reverse: one byte times _SPREAD is that byte eight times; _SELECT keeps bit k of byte k.
_GATHER = 0x0102040810204080
_SPREAD = 0x0101010101010101
_SELECT = 0x8040201008040201


def pack_bits(keep):
    """A boolean tensor as uint8 bits, 8 elements per byte (padded to a multiple of 8)."""
    flat = tf.cast(tf.reshape(keep, [-1]), tf.uint8)
    pad = (-tf.size(flat)) % 8
    flat = tf.pad(flat, [[0, pad]])
    words = tf.bitcast(tf.reshape(flat, [-1, 8]), tf.uint64)
    return tf.cast(tf.bitwise.right_shift(words * tf.constant(_GATHER, tf.uint64), tf.constant(56, tf.uint64)),
                   tf.uint8)


def unpack_bits(bits, shape):
    """`pack_bits`' booleans again, reshaped to `shape`."""
    words = tf.bitwise.bitwise_and(tf.cast(bits, tf.uint64) * tf.constant(_SPREAD, tf.uint64),
                                   tf.constant(_SELECT, tf.uint64))
    flat = tf.reshape(tf.bitcast(words, tf.uint8) > 0, [-1])
    return tf.reshape(flat[: tf.reduce_prod(shape)], shape)
