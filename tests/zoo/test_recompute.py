"""Checkpointing is exact: every trainable variable gets the same gradient with
and without recomputation, with dropout 0.1 active, wherever Keras trains. The
chunked attention core (the default, here cut into 6-position tiles so that 16
positions make uneven chunks and a causal model skips tiles) equals the plain
one that holds the whole score matrix."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY, TINY_DEC, allocator_peak, mlp_in_chunks
from zoo.ops import recompute

FAMILIES = {"enc-base": dict(TINY, dropout=0.1), "dec-base": dict(TINY_DEC, dropout=0.1)}
# Issue 23's families, each with a local layer whose 5-position window straddles the 6-position tiles, and
# what sets each apart (Q/K/V bias, Q/K norm with head_dim != hidden/heads, Gemma's sandwich (1 + w) norms,
# scaled embeddings and scores, ModernBERT's block 0 without attention norm and bidirectional windows).
WINDOWED = {
    "qwen2.5-0.5b": dict(TINY_DEC, dropout=0.1, layer_kinds=("global", "local"), sliding_window=5),
    "qwen3-0.6b": dict(TINY_DEC, dropout=0.1, head_dim=8, layer_kinds=("local", "global"), sliding_window=5),
    "gemma3-1b": dict(TINY, dropout=0.1, num_kv_heads=1, head_dim=16, layer_kinds=("local", "global"),
                      sliding_window=5, query_pre_attn_scalar=24),
    # the classifier: a backbone's output after a LayerNorm has a mean square that does not depend on its input
    "modernbert-base": dict(TINY, dropout=0.1, sliding_window=5, task="classifier"),
}
BATCH, SEQ = 2, 16
CHUNK = 6  # 16 positions: three uneven query and key chunks


def make_inputs(name, masked):
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, TINY["vocab_size"], (BATCH, SEQ)).astype("int32"),
         "padding_mask": np.ones((BATCH, SEQ), "int32")}
    if masked:
        x["padding_mask"][1, SEQ // 2:] = 0
    if zoo.spec(name).family == "bert":
        x["segment_ids"] = np.zeros((BATCH, SEQ), "int32")
    return x


def build(name, policy, dtype=None, core="chunked"):
    """The family's model under `policy` and `core`, at the state it was built in: one model per family and
    dtype, built once (keras.utils.set_random_seed(0): the same weights and dropout seeds for every policy)
    and switched with set_checkpointing / set_attention, every variable (the dropout seed generators' state
    included) set back to its value when built, so that each policy draws the same masks from the same weights."""
    key = (name, dtype)
    if key not in MODELS:
        keras.utils.set_random_seed(0)
        model = zoo.get(name, dtype=dtype, **{**FAMILIES, **WINDOWED}[name])
        MODELS[key] = model, [v.numpy() for v in model.variables]
    model, initial = MODELS[key]
    for variable, value in zip(model.variables, initial):
        variable.assign(value)
    model.set_checkpointing(policy)
    model.set_attention(core, chunk_size=CHUNK)
    return model


MODELS = {}


def gradients(name, policy, mode, masked=True, dtype=None, core="chunked"):
    """{variable path: float32 gradient} of one training step (each case computed once per process: the
    float32 references of the mixed-precision tests are the float32 tests' own; a copy of the dict, so that
    a caller replacing an entry changes nothing shared)."""
    key = (name, policy, mode, masked, dtype, core)
    if key not in GRADIENTS:
        GRADIENTS[key] = _gradients(*key)
    return dict(GRADIENTS[key])


GRADIENTS = {}


def _gradients(name, policy, mode, masked, dtype, core):
    model = build(name, policy, dtype, core)
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
# gradient is float noise (~1e-12 of the model's largest gradient), not a scale. Not so under
# rotary positions (Qwen2's key bias is rotated with the key: its share of a score depends on j).
ZERO_BY_CONSTRUCTION = ("attention/key/bias",)


def assert_same(reference, other, rtol, zero=1e-5, zero_by_construction=ZERO_BY_CONSTRUCTION):
    """Each variable's largest difference relative to its OWN largest reference value:
    the query bias and the query/key kernels have gradients 1e-5 of the model's
    largest, and a model-wide scale would hide them being wrong. Only variables zero
    by construction get the model-wide scale as a floor, and must be below `zero`
    times it (float32 noise is ~1e-12, float16's ~2e-6); None skips that check."""
    assert list(reference) == list(other)
    model_scale = max(np.abs(a).max() for a in reference.values())
    for path, a in reference.items():
        scale = np.abs(a).max()
        if zero_by_construction and path.endswith(zero_by_construction):
            assert zero is None or scale <= zero * model_scale, f"{path} is zero by construction, got {scale:.2e}"
            scale = model_scale
        assert scale > 0, f"{path}: the reference is all zeros, a comparison with it means nothing"
        worst = np.abs(a - other[path]).max() / scale
        assert worst <= rtol, f"{path}: max difference {worst:.2e} of its scale {scale:.2e} > {rtol:.0e}"


@pytest.mark.parametrize(
    "name, mode, masked",
    # Both families eager and traced with padding; XLA once, on the decoder (causal tile skipping, grouped-query
    # heads and RoPE are the paths that mode can break). The padded batch's row 0 is unpadded, and the traced
    # graph is the same with and without padding (the mask is an input): no separate unpadded case.
    [("enc-base", "eager", True), ("dec-base", "eager", True), ("enc-base", "function", True),
     ("dec-base", "function", True), ("dec-base", "jit", True)],
)
def test_gradients_equal_float32(name, mode, masked):
    variants = [("none", "chunked"), ("full", "chunked"), ("selective", "chunked"), ("selective", "plain")]
    if mode != "eager":
        # The replay reads every dropout mask back from the bits drawn ahead (zoo.ops.dropout.Masks;
        # with the chunked core, the residual branches' only), ordered by graph dependencies.
        variants.append(("full", "plain"))
        # selective wraps nothing around the chunked core (test_policy_switches_on_a_built_model): its traced step
        # has the same ops as none's (2,194 and 2,068 alike here, counted 2026-12-07), so it is not traced twice.
        variants.remove(("selective", "chunked"))
    if mode == "jit":  # each variant is an XLA compilation of its own: the held masks and the chunked core
        variants = [("full", "plain"), ("selective", "chunked")]
    reference = gradients(name, "none", mode, masked, core="plain")
    for policy, core in variants:
        assert_same(reference, gradients(name, policy, mode, masked, core=core), rtol=1e-5)


@pytest.mark.parametrize("name", WINDOWED)
def test_new_families_gradients_equal_float32(name):
    """full (chunked core) and selective (the plain core recomputed) against none (plain core), dropout
    active, padding masked: what the matrix above checks for BERT and Llama, eagerly (the modes are the
    wrapper's, not a family's, and tracing the chunked core costs ~10 s a model)."""
    reference = gradients(name, "none", "eager", core="plain")
    assert_same(reference, gradients(name, "full", "eager"), rtol=1e-5, zero_by_construction=())
    assert_same(reference, gradients(name, "selective", "eager", core="plain"), rtol=1e-5, zero_by_construction=())


@pytest.mark.parametrize("name, mode", [("dec-base", "function"), ("enc-base", "eager"), ("gemma3-1b", "eager")])
def test_full_with_the_mlp_in_chunks_is_exact(name, mode, monkeypatch):
    """A long sequence's replay runs the block's MLP branch a chunk of positions at a time and recomputes each chunk
    in its own backward (zoo.ops.position_chunks): here chunks of 6 positions (16 = 6 + 6 + 4), against none with
    the plain core. Each norm placement once: pre (the norm inside the chunks), post (BERT: the MLP alone), sandwich
    (Gemma 3: both norms inside); traced once (the chunks' ordering is a graph's)."""
    width = {**FAMILIES, **WINDOWED}[name].get("intermediate_dim", TINY["intermediate_dim"])
    chunks = mlp_in_chunks(monkeypatch, CHUNK, width)
    reference = gradients(name, "none", mode, core="plain")
    assert_same(reference, _gradients(name, "full", mode, True, None, "chunked"), rtol=1e-5,
                zero_by_construction=ZERO_BY_CONSTRUCTION if name in FAMILIES else ())
    assert set(chunks) == {(CHUNK, SEQ)}, chunks


@pytest.mark.parametrize("name, dtype", [("enc-base", "mixed_bfloat16"), ("dec-base", "mixed_float16")])
def test_gradients_equal_mixed_precision(name, dtype):  # each family under one half precision, each precision once
    """`full` under half precision: the recomputed pass repeats the same half-precision ops on the same inputs.
    (`selective` with the chunked core recomputes nothing: it is `none`, test_policy_switches_on_a_built_model.)"""
    reference = gradients(name, "none", "function", dtype=dtype)
    assert_same(reference, gradients(name, "full", "function", dtype=dtype), rtol=1e-5)
    # The cores round differently (the plain one its normalised probabilities, the chunked one its running
    # sums), and the differences compound over layers: each must be as close to float32 as the other.
    exact = gradients(name, "none", "function", core="plain")
    plain = gradients(name, "none", "function", dtype=dtype, core="plain")
    worst = []
    for path, a in exact.items():
        scale = np.abs(a).max() if not path.endswith(ZERO_BY_CONSTRUCTION) else max(map(np.max, exact.values()))
        chunked_error, plain_error = (np.abs(g[path] - a).max() / scale for g in (reference, plain))
        assert chunked_error <= max(3 * plain_error, 1e-2), (path, chunked_error, plain_error)
        worst.append(chunked_error / max(plain_error, 1e-6))
    print(f"{name} {dtype}: chunked/plain distance to float32, worst variable {max(worst):.2f}x")


def fit_data(name, steps=3):
    """`steps` batches of the padded inputs, random targets and the losses to fit them with."""
    x = {k: np.concatenate([v] * steps) for k, v in make_inputs(name, masked=True).items()}
    rng = np.random.default_rng(1)
    if zoo.spec(name).family == "bert":
        n, h = len(x["token_ids"]), TINY["hidden_dim"]
        targets = {"sequence_output": rng.normal(size=(n, SEQ, h)), "pooled_output": rng.normal(size=(n, h))}
        return x, targets, {"sequence_output": "mse", "pooled_output": "mse"}
    y = rng.integers(0, TINY["vocab_size"], x["token_ids"].shape)
    return x, {"logits": y}, {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


@pytest.mark.parametrize(
    "name, dtype",
    # Each family once, each under one mixed policy (float32 gradients are compared above, under
    # tf.function and XLA); the loss-scaled float16 step is the one most likely to drift.
    [("dec-base", "mixed_bfloat16"), ("enc-base", "mixed_float16")],
)
def test_fit_reaches_same_weights(name, dtype, monkeypatch):
    """`fit` under full reaches the weights it reaches under none, the policy switched on the compiled model
    (set_checkpointing) and fitted from the same weights, dropout seeds and optimizer state. (`selective` with the
    chunked core, the models' default, recomputes nothing: test_policy_switches_on_a_built_model counts it.)
    The switch drops the compiled train step, and the new trace holds one recomputation wrapper per block
    under full (the wrapper runs at trace time, so counting its calls counts what the graph contains), traced
    once and reused for every step."""
    import zoo.layers.block as block_module

    traced = []

    def counting(fn, *tensors):
        traced.append(fn)
        return recompute.recompute(fn, *tensors)

    monkeypatch.setattr(block_module, "recompute", counting)
    model = build(name, "none", dtype)
    x, targets, loss = fit_data(name)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    if dtype == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.optimizer.build(model.trainable_variables)
    state = model.variables + model.optimizer.variables  # the seed generators' and the loss scale's included
    initial, initial_weights = [v.numpy() for v in state], [v.numpy() for v in model.weights]

    def fit(policy):
        for variable, value in zip(state, initial):
            variable.assign(value)
        traced.clear()
        model.fit(x, targets, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # 3 steps
        assert len(traced) == (TINY["num_layers"] if policy == "full" else 0), (policy, len(traced))
        return {v.path: np.asarray(v).astype("float32") for v in model.weights}

    reference = fit("none")
    moved = max(np.abs(a - b).max() for a, b in zip(reference.values(), initial_weights))
    assert moved > 1e-3, "training must move the weights for the comparison to mean anything"
    assert model.train_function is not None
    assert model.set_checkpointing("full") == "full" == model.checkpointing
    assert model.train_function is None  # rebuilt, with the new policy, on the next step
    # Adam normalises a noise gradient to a step of ~lr: the key bias's weights are noise, not ~0.
    assert_same(reference, fit("full"), rtol=1e-5, zero=None)


@pytest.mark.parametrize("core, selective_wrappers", [("chunked", 0), ("plain", 2)])
def test_policy_switches_on_a_built_model(core, selective_wrappers):
    """The chunked core's own backward keeps no probabilities, so `selective` wraps
    nothing around it; the plain core is recomputed."""
    model = build("dec-base", "none", core=core)
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
        for policy, per_step in (("full", 2), ("selective", selective_wrappers), ("none", 0)):
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


def test_auto_core_follows_the_policy(monkeypatch):
    """The default core: the plain one (probabilities saved, the fastest) when training under "none", and
    in "full"'s replay of one block, on one tile of keys; the chunked one under "selective", past one
    tile, and in inference."""
    from zoo.ops import attention_core

    model = zoo.get("dec-base", **FAMILIES["dec-base"])
    assert model.attention == ("auto", None)
    x = make_inputs("dec-base", masked=True)
    used = []
    for name in ("plain_attention", "chunked_attention"):
        real = getattr(attention_core, name)
        monkeypatch.setattr(attention_core, name,
                            lambda *a, _real=real, _name=name, **k: used.append(_name.split("_")[0]) or _real(*a, **k))
    for policy, training, core, chunk in [("none", True, "plain", None), ("selective", True, "chunked", None),
                                          ("full", True, "plain", None), ("full", True, "chunked", SEQ // 2),
                                          ("none", False, "chunked", None),
                                          ("none", True, "chunked", SEQ // 2), ("none", True, "plain", SEQ)]:
        model.set_checkpointing(policy)
        model.set_attention("auto", chunk)
        used.clear()
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x, training=training)["logits"])
        tape.gradient(loss, model.trainable_variables)
        assert set(used) == {core}, (policy, training, used)
    model.set_attention("chunked")  # an explicit choice holds under every policy
    model.set_checkpointing("none")
    used.clear()
    model(x, training=True)
    assert set(used) == {"chunked"}


def step_peaks(model, policy, core, lengths, chunk_size=None):
    """Allocator peaks of one forward+backward at each of `lengths` under `policy` and `core`, switched on the
    built model (tests.common.allocator_peak). Several lengths share one trace, the length a dynamic dimension;
    one length is traced at its static shape (selective's peak was 0.06-0.12 of none's higher with the dynamic)."""
    model.set_checkpointing(policy)
    model.set_attention(core, chunk_size)
    names = ["token_ids", "padding_mask"] + (["segment_ids"] if model.spec.family == "bert" else [])

    dynamic = [{k: tf.TensorSpec((2, None), "int32") for k in names}] if len(lengths) > 1 else None

    @tf.function(input_signature=dynamic)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_mean(tf.cast(v, "float32")) for v in model(x, training=True).values()])
        return tape.gradient(loss, model.trainable_variables)

    peaks = []
    for length in lengths:
        rng = np.random.default_rng(0)
        x = {"token_ids": rng.integers(0, TINY["vocab_size"], (2, length)).astype("int32"),
             "padding_mask": np.ones((2, length), "int32"), "segment_ids": np.zeros((2, length), "int32")}
        x = {k: tf.constant(x[k]) for k in names}
        peaks.append(allocator_peak(lambda: step(x), repeats=2))  # the least of two: one call in three peaks higher
    return peaks


def memory_model(name, num_layers, length):
    """One model for a memory test, switched between policies and cores (building one costs as much as a trace)."""
    keras.utils.set_random_seed(0)
    return zoo.get(name, **dict(FAMILIES[name], num_layers=num_layers, max_sequence_length=length))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.memory
def test_recomputation_lowers_step_memory(name):
    """At a sequence long enough for the attention scores to dominate (s=512: the scores' 5·a·s/h = 160 outweigh
    the rest's 34), the plain core keeps less under full and selective recomputation, and the chunked core keeps
    less than the plain one even without recomputation; one model, switched between them.

    Each bound from what the technique saves per layer at this shape (4 layers, 2 x 512 x 64, dropout 0.1; one
    [2, 512, 64] float32 tensor is 256 KiB, one [2, 4, 512, 512] score tensor 8 MiB), against a fixed part of
    ~8 MiB (plain: the backward's score gradients) and the layer the backward is in; measured 2026-12-06 on an
    AVX-512 EPYC with oneDNN on and off (the measured ratios beside each assert)."""
    model = memory_model(name, num_layers=4, length=512)
    plain = {policy: step_peaks(model, policy, "plain", [512])[0] for policy in ("none", "selective", "full")}
    # The encoder's `full` with the chunked core is not measured: it keeps nearly as much as its `none` (at
    # 3 layers x 512 0.72 with oneDNN on, 0.86 off; at 6 layers x 256 0.74-1.02 across runs and CPUs), an open
    # retention of FFN-sized tensors a layer (docs/checkpointing.md). The plain core's rows above show its
    # recomputation saving.
    policies = ("none", "full") if zoo.spec(name).is_decoder else ("none",)
    chunked = {policy: step_peaks(model, policy, "chunked", [512], chunk_size=128)[0] for policy in policies}
    print(f"\n{name} step peaks (MiB): plain { {k: round(v / 2**20, 1) for k, v in plain.items()} }, "
          f"chunked { {k: round(v / 2**20, 1) for k, v in chunked.items()} }")
    # none keeps ~9 bytes a score (probabilities, dropout mask, dropped probabilities: 18 MiB a layer) and ~16
    # activations (4 MiB): ~8 + 4 x 22 = 96 MiB. selective drops the scores but holds the layer it recomputes
    # (22 MiB) with its score gradients (8): expected (30 + 4 x 4) / 96 = 0.48, measured 0.40-0.46; bound 0.7.
    assert plain["selective"] < 0.7 * plain["none"], plain
    # full keeps each block's input (0.25 MiB) and the block it recomputes (22 MiB) with its backward's score
    # gradients (8 to 16): expected (30 to 38 + 4 x 0.25) / 96 = 0.32-0.41; measured 0.39-0.44; bound 0.6.
    assert plain["full"] < 0.6 * plain["none"], plain
    # The chunked core holds a [2, 4, 128, 128] tile's scores (0.5 MiB), not the layer's: expected
    # (2 + 4 x 4) / 96 = 0.19, measured 0.17-0.21 (dropout's mask and dropped probabilities are what the plain
    # core adds); bound 0.35.
    assert chunked["none"] < 0.35 * plain["none"], (chunked, plain)
    if "full" in chunked:
        # full keeps the inputs (+ the held dropout bits, ~1 MiB a layer) and the block it recomputes (4 MiB) where
        # none keeps 4 x 4: expected (2 + 4 x 1.25 + 4) / (2 + 4 x 4) = 0.61; measured 0.43-0.47; bound 0.85.
        assert chunked["full"] < 0.85 * chunked["none"], chunked


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.memory
def test_chunked_core_step_memory_grows_less_than_quadratically(name):
    """Quadrupling the sequence (s=256 -> 1024, 2 layers) quadruples a linear core's step memory and would
    multiply a quadratic one's by up to 16: the chunked core (64-position tiles) must stay well below that, while
    the plain core, on the same model at the same lengths (one trace per core), does not. Measured 2026-12-06 on an
    AVX-512 EPYC with oneDNN on and off (the ratios beside each assert)."""
    model = memory_model(name, num_layers=2, length=1024)
    short, long = step_peaks(model, "none", "chunked", [256, 1024], chunk_size=64)
    plain_short, plain_long = step_peaks(model, "none", "plain", [256, 1024])
    print(f"\n{name} chunked {short / 2**20:.1f} -> {long / 2**20:.1f} MiB, "
          f"plain {plain_short / 2**20:.1f} -> {plain_long / 2**20:.1f} MiB")
    # The chunked core keeps activations linear in s (~5 MiB at 256): expected 4x, measured 3.9-4.3x; bound 6.
    assert long < 6 * short, (short, long)
    # The same test sees a quadratic core: the plain one keeps 9 bytes a score, 2 x 72 MiB of its ~185 at 1024,
    # against ~9 of ~15 at 256: expected ~12x, measured 11.1-13.7x; bound 8 (above the chunked bound and 2x linear).
    assert plain_long > 8 * plain_short, (plain_short, plain_long)


@pytest.mark.memory
def test_mlp_in_chunks_lowers_full_step_memory(monkeypatch):
    """Under full, a block replayed at a long sequence holds its MLP's intermediates through its backward; in chunks
    of positions (zoo.ops.position_chunks) it holds one chunk's. One decoder block with a wide MLP (hidden 64,
    intermediate 2,048, 2 x 512 positions: one [2, 512, 2048] float32 tensor is 8 MiB; attention tiles of 64, whose
    scores are 0.1 MiB) so that the MLP dominates the step: whole, against chunks of 64 positions (8 chunks: the
    chunks are unrolled, so fewer trace faster), on one model (step_peaks traces each anew). Measured 2026-12-07 on
    an AVX2-only EPYC, oneDNN off and on."""
    from zoo.ops import position_chunks

    model = zoo.get("dec-base", **dict(TINY_DEC, num_layers=1, intermediate_dim=2048, max_sequence_length=512))
    whole = step_peaks(model, "full", "chunked", [512], chunk_size=64)[0]
    monkeypatch.setattr(position_chunks, "CHUNK_BYTES", 64 * 4 * 2048)
    chunked = step_peaks(model, "full", "chunked", [512], chunk_size=64)[0]
    print(f"\nfull, 1 block, MLP whole {whole / 2**20:.1f} MiB, in chunks of 64 positions {chunked / 2**20:.1f} MiB")
    # Whole: gate, up, their SiLU and product and the SiLU's float32 temporaries, ~4 x 8 MiB, beside ~3 MiB of the
    # weights' gradients (and their sum over the chunks'); in chunks each is 1 MiB: expected (3 + 4 x 1) / (3 + 32)
    # = 0.2, measured 36.0-36.1 -> 8.6-9.9 MiB (0.24-0.27; chunks of 32: 6.3-6.9 MiB); bound 0.4.
    assert chunked < 0.4 * whole, (whole, chunked)
