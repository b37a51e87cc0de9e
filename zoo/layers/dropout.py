"""Dropout driven by an explicit seed tensor.

Recomputation runs a block's forward pass twice. Keras' `Dropout` draws from a
stateful generator, so the second pass would draw new masks and the gradients
would be silently wrong. A stateless draw from a seed fixed before the first
pass gives the same mask both times.
"""

import tensorflow as tf


def stateless_dropout(x, rate, seed, site=0):
    """Inverted dropout of `x`; `site` separates the masks of one layer's dropout points."""
    if not rate or seed is None:
        return x
    seed = tf.random.experimental.stateless_fold_in(seed, site)
    keep = tf.random.stateless_uniform(tf.shape(x), seed=seed) >= rate
    return tf.where(keep, x / tf.cast(1.0 - rate, x.dtype), tf.zeros_like(x))
