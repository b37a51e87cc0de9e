"""Stochastic rounding of float32 into bfloat16 (Zamirai et al. 2020; torchao's
`bf16_stochastic_round`): add 16 random low bits to the float32 bit pattern and truncate them.
Why the zoo's optimizers round this way: docs/design-notes.md (bfloat16 weights)."""

import tensorflow as tf

_LOW_BITS = 1 << 16  # a float32 has 16 more significand bits than a bfloat16
_HIGH_MASK = -_LOW_BITS  # 0xFFFF0000 as an int32


def stochastic_round(x, seed):
    """`x` (float32) rounded to bfloat16, up with probability equal to the fraction of a bfloat16
    step it drops: unbiased, exact on values bfloat16 represents, NaN and Inf kept. `seed`: shape
    [2] integers, a stateless Philox key; the same seed gives the same bits on every run."""
    x = tf.convert_to_tensor(x)
    if x.dtype != tf.float32:
        raise TypeError(f"stochastic_round rounds float32 into bfloat16; got {x.dtype.name}. Cast to float32 first.")
    with tf.control_dependencies([x]):  # drawn when x exists, not when the step starts (held until then)
        noise = tf.random.stateless_uniform(tf.shape(x), seed, minval=0, maxval=_LOW_BITS, dtype=tf.int32,
                                            alg="philox")
    # Adding to the bit pattern adds to the magnitude whatever the sign (sign-magnitude), so a
    # negative value rounds away from zero as often as a positive one: unbiased.
    bits = tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32) + noise, _HIGH_MASK)
    rounded = tf.bitcast(bits, tf.float32)  # the low 16 bits are zero: the cast below is exact
    # A NaN whose payload is only in the low bits could truncate to Inf: NaN and Inf stay as they are.
    return tf.cast(tf.where(tf.math.is_finite(x), rounded, x), tf.bfloat16)
