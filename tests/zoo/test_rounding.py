"""bfloat16 weights with stochastic rounding (zoo.ops.rounding, zoo.optimizers.rounding).

The rounding itself: unbiased between two bfloat16 neighbours (the mean of many roundings
within 5 standard errors), exact on values bfloat16 represents, NaN and Inf kept, the same
seed giving the same bits. Then the optimizers: round-to-nearest loses a small update that
stochastic rounding keeps on average (the failure mode), the random stream is keyed by
(step, variable), a rounded update holds one variable's temporaries at a time, and a bfloat16
run restored from a checkpoint (recipes.state) ends bitwise equal to the uninterrupted run.
Bad input names the fix (zoo.checks.weights)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from recipes import state
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


VOCAB = 128


def batches(steps=4, batch=2, seq=16):
    ids = np.random.default_rng(1).integers(1, VOCAB, (steps * batch, seq + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((steps * batch, seq), "int32")}
    return tf.data.Dataset.from_tensor_slices((x, ids[:, 1:])).batch(batch)


def bf16_decoder(make_optimizer):
    keras.utils.set_random_seed(0)
    model = zoo.get("dec-base", task="causal_lm", checkpointing="full", dtype="bfloat16",
                    **dict(TINY_DEC, vocab_size=VOCAB, dropout=0.1))
    opt = make_optimizer()
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    model.compile(optimizer=opt, loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  jit_compile=False)
    return model


def make_adafactor():
    """Factored statistics (float32) and a momentum (bfloat16), decay, a global clip."""
    return Adafactor(beta_1=0.9, weight_decay=0.1, global_clipnorm=1.0, rounding="stochastic")


def test_bfloat16_run_resumed_from_a_checkpoint_is_bitwise_equal(tmp_path):
    """Saved after 2 of 4 steps (recipes.state: every model and optimizer variable by index),
    restored into a fresh model and optimizer: the random bits are keyed by (step, variable),
    so the resumed run rounds as the uninterrupted one did. (The fused update resumes bitwise
    too: tests/recipes/test_fused_recipes.py. `fit` and the fused update are not bitwise equal
    to each other: their float32 sums differ in the last bits, measured with float32 weights,
    and a rounding now and then lands on the other neighbour.)"""
    run = bf16_decoder(make_adafactor)
    start = [v.numpy() for v in run.trainable_variables]
    run.fit(batches().take(2), verbose=0)
    folder = state.save(str(tmp_path), 2, run, run.optimizer)
    run.fit(batches().skip(2), verbose=0)  # the uninterrupted run's last two steps

    resumed = bf16_decoder(make_adafactor)
    resumed.optimizer.build(resumed.trainable_variables)
    assert state.restore(folder, resumed, resumed.optimizer) == 2
    resumed.fit(batches().skip(2), verbose=0)

    assert all(v.dtype == "bfloat16" for v in run.trainable_variables)
    assert {v.dtype for v in run.optimizer.variables if len(v.shape) >= 1} == {"float32", "bfloat16"}
    for a, b in zip(resumed.variables + resumed.optimizer.variables, run.variables + run.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), b.path
    assert int(resumed.optimizer.iterations) == 4
    for v, s in zip(run.trainable_variables, start):
        assert not np.array_equal(v.numpy(), s), v.path  # every weight moved in bfloat16


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
