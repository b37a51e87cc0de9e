"""bfloat16 weights with stochastic rounding (zoo.ops.rounding, zoo.optimizers.rounding).

The rounding itself: unbiased between two bfloat16 neighbours (the mean of many roundings
within 5 standard errors), exact on values bfloat16 represents, NaN and Inf kept, the same
seed giving the same bits. Then the optimizers: round-to-nearest loses a small update that
stochastic rounding keeps on average (the failure mode), the random stream is keyed by
(step, variable), a rounded update holds one variable's temporaries at a time, and an optimizer
restored from the variables saved mid-run ends bitwise equal to the uninterrupted one.
Bad input names the fix (zoo.checks.weights)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY_DEC, allocator_peak
from zoo import checks
from zoo.ops.rounding import stochastic_round
from zoo.optimizers import Adafactor, AdamW, Lion

N = 200_000


def bf16_neighbours(x):
    """The bfloat16 values just below and above the float32 `x` (truncation and one step up)."""
    bits = np.array([x], np.float32).view(np.uint32)[0] & 0xFFFF0000
    lo = np.array([bits], np.uint32).view(np.float32)[0]
    hi = np.array([bits + 0x10000], np.uint32).view(np.float32)[0]
    return (lo, hi) if x >= 0 else (hi, lo)


@pytest.mark.parametrize("x", [1 + 0.3 * 2**-7, -(3 + 0.7 * 2**-6), 2.5e-30 * (1 + 0.9 * 2**-7), 7.0e4 + 1.0])
def test_unbiased_between_two_neighbours(x):
    x = float(np.float32(x))
    lo, hi = bf16_neighbours(x)
    assert lo < x < hi
    rounded = tf.cast(stochastic_round(tf.fill([N], x), [3, 4]), tf.float32).numpy()
    assert set(np.unique(rounded)) == {lo, hi}  # only the two neighbours
    p = (x - lo) / (hi - lo)  # the exact chance of rounding up
    standard_error = (hi - lo) * np.sqrt(p * (1 - p) / N)
    assert abs(rounded.astype(np.float64).mean() - x) < 5 * standard_error
    assert abs(np.mean(rounded == hi) - p) < 5 * np.sqrt(p * (1 - p) / N)


def test_exact_on_values_bfloat16_represents():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 1, 500) * 10.0 ** rng.integers(-30, 30, 500), [0.0, -0.0, 1.0, -2.0]])
    exact = tf.cast(tf.cast(values, tf.bfloat16), tf.float32)
    for seed in ([0, 0], [1, 2], [2**40, 7]):
        out = stochastic_round(exact, seed)
        assert np.array_equal(tf.bitcast(out, tf.uint16).numpy(), tf.bitcast(tf.cast(exact, tf.bfloat16),
                                                                             tf.uint16).numpy())


def test_nan_and_inf_are_kept():
    payload_nan = np.array([0x7F800001], np.uint32).view(np.float32)[0]  # truncating it naively gives Inf
    x = tf.constant([np.nan, payload_nan, np.inf, -np.inf, 3.4e38], tf.float32)
    out = tf.cast(stochastic_round(x, [1, 1]), tf.float32).numpy()
    assert np.isnan(out[0]) and np.isnan(out[1])
    assert out[2] == np.inf and out[3] == -np.inf
    assert out[4] in (np.inf, float(tf.bfloat16.max))  # above bfloat16's largest: rounds to it or overflows


def test_same_seed_same_bits_other_seed_other_bits():
    x = tf.constant(np.random.default_rng(1).normal(0, 1, 4096), tf.float32)
    bits = [tf.bitcast(stochastic_round(x, seed), tf.uint16).numpy() for seed in ([5, 7], [5, 7], [6, 7], [5, 8])]
    assert np.array_equal(bits[0], bits[1])
    assert not np.array_equal(bits[0], bits[2]) and not np.array_equal(bits[0], bits[3])


def test_round_to_nearest_loses_a_small_update_that_stochastic_rounding_keeps():
    """AdamW at lr 1e-4 moves a weight near 1.0 by ~1e-4 a step, under half a bfloat16 step
    (2^-9): to nearest it never moves; stochastically it follows the float32 run on average."""
    steps, shape = 100, (64, 64)
    grads = tf.ones(shape)
    finals = {}
    for rounding in ("float32", "nearest", "stochastic"):
        dtype = "float32" if rounding == "float32" else "bfloat16"
        v = keras.Variable(tf.ones(shape), dtype=dtype)
        opt = AdamW(1e-4, weight_decay=0.0, rounding=None if rounding == "float32" else rounding)
        step = tf.function(lambda: opt.apply([tf.cast(grads, dtype)], [v]))
        for _ in range(steps):
            step()
        finals[rounding] = tf.cast(v, tf.float32).numpy().astype(np.float64)
    exact = finals["float32"].mean()
    assert exact == pytest.approx(1 - steps * 1e-4, rel=1e-4)
    assert np.all(finals["nearest"] == 1.0)  # every update lost
    # Each stochastic rounding adds at most (step/2)^2 of variance: a random walk of 100 steps, averaged over 4096.
    bound = 5 * (2**-8 / 2) * np.sqrt(steps / finals["stochastic"].size)
    assert abs(finals["stochastic"].mean() - exact) < bound


def test_keras_adamw_on_bfloat16_variables_never_moves():
    """Why update_step gets a float32 view: Keras' Adam computes in the variable's dtype, where
    beta_2 = 0.999 is 1.0 and the bias correction sqrt(1 - beta_2^t) is 0 (keras PR #21238 fixed
    LAMB only). If this fails, Keras changed: revisit the rounding module's docstring."""
    v = keras.Variable(tf.ones((4, 4)), dtype="bfloat16")
    opt = keras.optimizers.AdamW(1e-1, weight_decay=0.0)
    for _ in range(3):
        opt.apply([tf.ones((4, 4), "bfloat16")], [v])
    assert np.all(v.numpy() == 1)


def test_streams_are_keyed_by_step_and_variable():
    """Two variables with the same value and gradient round differently; the same (step,
    variable) in two optimizers rounds the same; another step rounds differently."""
    start = tf.constant(np.random.default_rng(2).uniform(1, 2, (2, 256)), tf.float32)

    def run(step, seed=0):
        a, b = keras.Variable(start, dtype="bfloat16"), keras.Variable(start, dtype="bfloat16")
        opt = Lion(1e-3, rounding="stochastic", rounding_seed=seed)
        opt.build([a, b])
        opt.iterations.assign(step)
        opt.apply([tf.ones((2, 256), "bfloat16")] * 2, [a, b])
        return tf.bitcast(a.value, tf.uint16).numpy(), tf.bitcast(b.value, tf.uint16).numpy()

    a5, b5 = run(5)
    assert not np.array_equal(a5, b5)
    assert all(np.array_equal(x, y) for x, y in zip(run(5), (a5, b5)))
    assert not np.array_equal(run(6)[0], a5)
    assert not np.array_equal(run(5, seed=1)[0], a5)


@pytest.mark.parametrize("make", [lambda: AdamW(1e-3, weight_decay=0.01, global_clipnorm=1.0, rounding="stochastic"),
                                  lambda: Adafactor(weight_decay=0.01, global_clipnorm=1.0, rounding="stochastic")],
                         ids=["adamw", "adafactor"])
@pytest.mark.memory
def test_a_rounded_update_holds_one_variable_at_a_time(make):
    """Eight bfloat16 variables: TF's executor would make every variable's float32 reads, new
    values and random bits as the step starts (measured: 33 float32 copies of a variable for
    AdamW, 15 for Adafactor); each rounded update waits for the previous one's writes, which
    leaves the eight clipped bfloat16 gradients (4 copies) and one update (measured 9.5 and 7.5)."""
    n, shape = 8, (1024, 1024)
    variables = [keras.Variable(tf.random.normal(shape, seed=i) * 0.02, dtype="bfloat16") for i in range(n)]
    grads = [tf.cast(tf.random.normal(shape, seed=10 + i), "bfloat16") for i in range(n)]
    opt = make()
    opt.build(variables)
    step = tf.function(lambda: opt.apply(grads, variables))
    copies = allocator_peak(step) / (4 * shape[0] * shape[1])
    assert copies < 12, copies


def test_a_resumed_optimizer_rounds_as_the_uninterrupted_one():
    """4 steps of the factored Adafactor (momentum in bfloat16, decay, a global clip) on a bfloat16
    matrix and vector; a fresh optimizer given the variables saved after step 2 ends bitwise equal:
    the bits are keyed by (step, variable), nothing else. (A recipe killed with SIGKILL and resumed:
    tests/recipes/test_fused_recipes.py.)"""
    rng = np.random.default_rng(3)
    start = [rng.normal(size=s).astype("float32") * 0.1 for s in ((8, 16), (16,))]
    grads = [[tf.constant(rng.normal(size=w.shape), tf.bfloat16) for w in start] for _ in range(4)]

    def fresh():
        variables = [keras.Variable(w, dtype="bfloat16") for w in start]
        opt = Adafactor(beta_1=0.9, weight_decay=0.1, global_clipnorm=1.0, rounding="stochastic")
        opt.exclude_from_weight_decay(var_list=variables[1:])
        opt.build(variables)
        return variables, opt

    variables, opt = fresh()
    for g in grads[:2]:
        opt.apply(g, variables)
    saved = [v.numpy() for v in variables + opt.variables]
    for g in grads[2:]:
        opt.apply(g, variables)

    again, resumed = fresh()
    for v, value in zip(again + resumed.variables, saved, strict=True):
        v.assign(value)
    for g in grads[2:]:
        resumed.apply(g, again)
    assert {_dtype(v) for v in opt.variables if len(v.shape) >= 1} == {"float32", "bfloat16"}
    for a, b in zip(again + resumed.variables, variables + opt.variables):
        assert np.array_equal(a.numpy(), b.numpy()), b.path
    assert all(not np.array_equal(v.numpy(), saved[i]) for i, v in enumerate(variables))  # the last steps moved


def _dtype(v):
    return keras.backend.standardize_dtype(v.dtype)


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="Unknown weights dtype 'float16'; known: float32, bfloat16"):
        checks.weights("float16")
    with pytest.raises(ValueError, match="cannot be combined with precision 'mixed_float16'.*'mixed_bfloat16'"):
        checks.weights("bfloat16", "mixed_float16")
    with pytest.raises(ValueError, match="precision 'float16'"):
        checks.weights("bfloat16", "float16")
    with pytest.raises(ValueError, match="precision 'float32'"):
        checks.weights("bfloat16", "float32")
    with pytest.raises(ValueError,
                       match="precision 'bfloat16' stores bfloat16 weights.*mixed_bfloat16.*--weights-dtype"):
        checks.weights("float32", "bfloat16")
    with pytest.raises(ValueError, match="float32 weights have nothing to round.*--weights-dtype bfloat16"):
        checks.weights("float32", rounding="stochastic")
    with pytest.raises(ValueError, match=r"gradient accumulation \(accumulation_steps=4\).*--accumulation-steps 1"):
        checks.weights("bfloat16", accumulation_steps=4)
    with pytest.raises(ValueError, match="Unknown rounding 'truncate'; known: 'stochastic'"):
        checks.weights("bfloat16", rounding="truncate")
    assert [checks.weights("bfloat16", p) for p in (None, "bfloat16", "mixed_bfloat16")] == [
        ("bfloat16", "stochastic")] * 3
    assert checks.weights("bfloat16", rounding="nearest") == ("bfloat16", "nearest")  # only when asked by name
    assert checks.weights("float32", "mixed_float16") == ("mixed_float16", None)
    assert checks.weights() == ("float32", None)
    with pytest.raises(ValueError, match="Unknown rounding 'truncate'"):
        AdamW(rounding="truncate")
    with pytest.raises(TypeError, match="Cast to float32 first"):
        stochastic_round(tf.constant([1.0], tf.float64), [0, 0])

    float32_weights = keras.Variable(tf.ones((2, 2)))  # what mixed_bfloat16 keeps
    with pytest.raises(ValueError, match="Under 'mixed_bfloat16' Keras keeps float32 weights.*dtype='bfloat16'"):
        Adafactor(rounding="stochastic").build([float32_weights])
    bf16_weights = keras.Variable(tf.ones((2, 2)), dtype="bfloat16")
    with pytest.raises(ValueError, match="no rounding.*rounding='stochastic'"):
        AdamW().build([bf16_weights])
    with pytest.raises(ValueError, match="gradient accumulators"):
        Lion(rounding="stochastic", gradient_accumulation_steps=2).build([bf16_weights])


def test_a_bfloat16_model_refuses_keras_own_optimizers():
    """ZooModel's train step: bfloat16 weights with an optimizer that cannot round into them
    (Keras' AdamW never moves one) are refused at the first step, naming zoo.optimizers."""
    model = zoo.get("dec-base", task="causal_lm", dtype="bfloat16", **dict(TINY_DEC, num_layers=1, vocab_size=32))
    model.compile(optimizer=keras.optimizers.AdamW(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = {"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), "int32")}
    with pytest.raises(ValueError, match="bfloat16 weights.*Compile with zoo.optimizers.AdamW, Lion or Adafactor"):
        model.train_on_batch(x, np.ones((1, 4), "int32"))
