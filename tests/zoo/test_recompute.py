"""Checkpointing is exact: every trainable variable gets the same gradient with
and without recomputation, with dropout 0.1 active, wherever Keras trains."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY, TINY_DEC
from zoo import recompute

FAMILIES = {"enc-base": dict(TINY, dropout=0.1), "dec-base": dict(TINY_DEC, dropout=0.1)}
BATCH, SEQ = 2, 16


def make_inputs(name, masked):
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, TINY["vocab_size"], (BATCH, SEQ)).astype("int32"),
         "padding_mask": np.ones((BATCH, SEQ), "int32")}
    if masked:
        x["padding_mask"][1, SEQ // 2:] = 0
    if zoo.spec(name).family == "bert":
        x["segment_ids"] = np.zeros((BATCH, SEQ), "int32")
    return x


def build(name, policy, dtype=None):
    keras.utils.set_random_seed(0)  # same weights and dropout seeds for every policy
    return zoo.get(name, checkpointing=policy, dtype=dtype, **FAMILIES[name])


def gradients(name, policy, mode, masked=True, dtype=None):
    """{variable path: float32 gradient} of one training step."""
    model = build(name, policy, dtype)
    x = make_inputs(name, masked)

    def step(x):
        with tf.GradientTape() as tape:
            outputs = model(x, training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(v, "float32"))) for v in outputs.values()])
        return tape.gradient(loss, model.trainable_variables)

    if mode != "eager":
        step = tf.function(step, jit_compile=(mode == "jit"))
    grads = step(x)
    return {v.path: tf.convert_to_tensor(g).numpy().astype("float32") for v, g in zip(model.trainable_variables, grads)}


# Gradients that are exactly zero by construction: softmax is shift-invariant along the
# keys, and the key projection's bias adds the same q·b_k to every key's score, so its
# gradient is float noise (~1e-12 of the model's largest gradient), not a scale.
ZERO_BY_CONSTRUCTION = ("attention/key/bias",)


def assert_same(reference, other, rtol, zero=1e-5):
    """Each variable's largest difference relative to its OWN largest reference value:
    the query bias and the query/key kernels have gradients 1e-5 of the model's
    largest, and a model-wide scale would hide them being wrong. Only variables zero
    by construction get the model-wide scale as a floor, and must be below `zero`
    times it (float32 noise is ~1e-12, float16's ~2e-6); None skips that check."""
    assert list(reference) == list(other)
    model_scale = max(np.abs(a).max() for a in reference.values())
    for path, a in reference.items():
        scale = np.abs(a).max()
        if path.endswith(ZERO_BY_CONSTRUCTION):
            assert zero is None or scale <= zero * model_scale, f"{path} is zero by construction, got {scale:.2e}"
            scale = model_scale
        assert scale > 0, f"{path}: the reference is all zeros, a comparison with it means nothing"
        worst = np.abs(a - other[path]).max() / scale
        assert worst <= rtol, f"{path}: max difference {worst:.2e} of its scale {scale:.2e} > {rtol:.0e}"


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode, masked", [("eager", True), ("function", True), ("function", False), ("jit", True)])
def test_gradients_equal_float32(name, mode, masked):
    reference = gradients(name, "none", mode, masked)
    for policy in ("full", "selective"):
        assert_same(reference, gradients(name, policy, mode, masked), rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", ["mixed_bfloat16", "mixed_float16"])
def test_gradients_equal_mixed_precision(name, dtype):
    reference = gradients(name, "none", "function", dtype=dtype)
    for policy in ("full", "selective"):
        # The recomputed pass repeats the same half-precision ops on the same inputs.
        assert_same(reference, gradients(name, policy, "function", dtype=dtype), rtol=1e-5)


def fit_weights(name, policy, dtype=None, steps=3):
    model = build(name, policy, dtype)
    x = {k: np.concatenate([v] * steps) for k, v in make_inputs(name, masked=True).items()}
    rng = np.random.default_rng(1)
    if zoo.spec(name).family == "bert":
        n, h = len(x["token_ids"]), TINY["hidden_dim"]
        targets = {"sequence_output": rng.normal(size=(n, SEQ, h)), "pooled_output": rng.normal(size=(n, h))}
        loss = {"sequence_output": "mse", "pooled_output": "mse"}
    else:
        y = rng.integers(0, TINY["vocab_size"], x["token_ids"].shape)
        targets, loss = {"logits": y}, {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    model.fit(x, targets, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model, {v.path: np.asarray(v).astype("float32") for v in model.weights}


@pytest.mark.parametrize(
    "name, dtype",
    # float32 for both families; each mixed policy on one family keeps the suite short.
    [("enc-base", None), ("dec-base", None), ("dec-base", "mixed_bfloat16"), ("enc-base", "mixed_float16")],
)
def test_fit_reaches_same_weights(name, dtype):
    model, reference = fit_weights(name, "none", dtype)
    if dtype == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    initial = build(name, "none", dtype).get_weights()
    moved = max(np.abs(a - b).max() for a, b in zip(reference.values(), initial))
    assert moved > 1e-3, "training must move the weights for the comparison to mean anything"
    for policy in ("full", "selective"):
        _, weights = fit_weights(name, policy, dtype)
        # Adam normalises a noise gradient to a step of ~lr: the key bias's weights are noise, not ~0.
        assert_same(reference, weights, rtol=1e-5, zero=None)


def test_policy_switches_on_a_built_model():
    model = build("dec-base", "none")
    x = make_inputs("dec-base", masked=True)
    calls = []
    real = recompute.recompute

    def counting(fn, *tensors):
        calls.append(fn)
        return real(fn, *tensors)

    import zoo.layers.attention as attention_module
    import zoo.layers.block as block_module

    for module in (block_module, attention_module):
        module.recompute = counting
    try:
        for policy, per_step in (("full", 2), ("selective", 2), ("none", 0)):
            assert model.set_checkpointing(policy) == policy == model.checkpointing
            calls.clear()
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x, training=True)["logits"])
            assert all(g is not None for g in tape.gradient(loss, model.trainable_variables))
            assert len(calls) == per_step, (policy, len(calls))  # one wrapper per block
            calls.clear()
            model(x, training=False)
            assert not calls, "inference must not run the recomputation wrapper"
    finally:
        for module in (block_module, attention_module):
            module.recompute = real
    with pytest.raises(ValueError, match="none, full, selective"):
        model.set_checkpointing("half")


def test_policy_switch_retraces_compiled_training(monkeypatch):
    """The compiled train step is traced again after a switch, and the new trace holds one
    recomputation wrapper per block (the wrapper runs at trace time, so counting its calls
    counts what the graph contains)."""
    import zoo.layers.block as block_module

    traced = []

    def counting(fn, *tensors):
        traced.append(fn)
        return recompute.recompute(fn, *tensors)

    monkeypatch.setattr(block_module, "recompute", counting)
    model = build("enc-base", "none")
    model.compile(optimizer="adam", loss={"sequence_output": "mse", "pooled_output": "mse"})
    x = make_inputs("enc-base", masked=False)
    y = {"sequence_output": np.zeros((BATCH, SEQ, TINY["hidden_dim"]), "float32"),
         "pooled_output": np.zeros((BATCH, TINY["hidden_dim"]), "float32")}
    model.train_on_batch(x, y)
    assert model.train_function is not None and traced == []
    model.set_checkpointing("full")
    assert model.train_function is None  # rebuilt (with recomputation) on the next step
    model.train_on_batch(x, y)
    assert len(traced) == TINY["num_layers"]  # the new graph recomputes every block
    model.train_on_batch(x, y)
    assert len(traced) == TINY["num_layers"]  # and is reused, not traced again


@pytest.mark.parametrize("name", FAMILIES)
def test_recomputation_lowers_step_memory(name):
    """Allocator peak of one forward+backward at a sequence long enough for the
    attention scores to dominate: full and selective must each keep less."""
    # full keeps one block's activations, none all 6; at s=256 the scores (5·a·s/h = 80) outweigh the rest (34)
    overrides = dict(FAMILIES[name], num_layers=6, max_sequence_length=256)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, TINY["vocab_size"], (2, 256)).astype("int32"),
         "padding_mask": np.ones((2, 256), "int32")}
    if zoo.spec(name).family == "bert":
        x["segment_ids"] = np.zeros((2, 256), "int32")
    peaks = {}
    for policy in ("none", "selective", "full"):
        keras.utils.set_random_seed(0)
        model = zoo.get(name, checkpointing=policy, **overrides)

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_mean(tf.cast(v, "float32")) for v in model(x, training=True).values()])
            return tape.gradient(loss, model.trainable_variables)

        step(x)  # trace outside the measurement
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        step(x)
        peaks[policy] = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
    assert peaks["selective"] < 0.8 * peaks["none"], peaks
    assert peaks["full"] < 0.5 * peaks["none"], peaks
