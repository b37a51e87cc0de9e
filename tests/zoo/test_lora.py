"""LoRA through Keras' own Dense.enable_lora on tiny zoo models of both families: a zero B
changes nothing, the forward is base + (alpha/r)·x·A·B as numpy computes it, only the
adapters (and a new classifier) train, recomputation is exact, merging is exact (in float32
under mixed_bfloat16 too); a quantized base (Keras' Model.quantize, weight-only) trains
with LoRA, its gradients stay those of the float base, and its error to float is bounded;
every refusal names the problem."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY, TINY_DEC, mlp_in_chunks
from zoo import lora, memory, quantization, shapes
from zoo.memory.lora import plan as lora_plan

SHAPES = {"enc-mini": dict(TINY, dropout=0.1), "dec-base": dict(TINY_DEC, dropout=0.1)}
TASKS = {"enc-mini": "classifier", "dec-base": "causal_lm"}
BATCH, SEQ = 2, 12


def build(name, policy="none", dtype=None, seed=0, **overrides):
    keras.utils.set_random_seed(seed)  # the same weights, dropout seeds and A draws for every build
    kwargs = dict(num_classes=3) if TASKS[name] == "classifier" else {}
    return zoo.get(name, task=TASKS[name], checkpointing=policy, dtype=dtype, **{**SHAPES[name], **overrides},
                   **kwargs)


def inputs(model, seed=0):
    rng = np.random.default_rng(seed)
    x = {"token_ids": rng.integers(1, TINY["vocab_size"], (BATCH, SEQ)).astype("int32"),
         "padding_mask": np.ones((BATCH, SEQ), "int32")}
    x["padding_mask"][1, -3:] = 0
    if "segment_ids" in model.input:
        x["segment_ids"] = np.zeros((BATCH, SEQ), "int32")
    return x


def labels(model, x):
    return x["token_ids"] if model.task == "causal_lm" else np.arange(BATCH) % 3


def random_b(model, seed=1, std=0.05):
    """B drawn non-zero (its init is zero), so that the adapters change the outputs."""
    rng = np.random.default_rng(seed)
    for layer in lora.adapters(model).values():
        layer.lora_kernel_b.assign(rng.normal(0, std, layer.lora_kernel_b.shape).astype("float32"))


def logits(model, x):
    return model(x)["logits"].numpy()


# --- what enable_lora does --------------------------------------------------------------
@pytest.mark.parametrize("name", SHAPES)
def test_adapters_compute_base_plus_scaled_x_a_b_and_merge_exactly(name):
    """On one model (the builds are the test's time): a zero B leaves the logits exactly as they were; each
    projection computes base + (alpha/r)·x·A·B as numpy does; the model equals one with the kernels merged in
    numpy, and merge_lora equals both and leaves a plain model."""
    model, reference = build(name), build(name)
    x = inputs(model)
    trainable_before = {v.path for v in model.trainable_variables}
    base = logits(model, x)
    projections = list(lora.projections(model))
    assert lora.enable_lora(model, rank=4, alpha=8, targets="all-linear") == projections
    np.testing.assert_array_equal(logits(model, x), base)  # B is zero
    random_b(model)

    rng = np.random.default_rng(3)
    for layer_name, layer in lora.adapters(model).items():
        h = rng.normal(size=(2, 5, layer._kernel.shape[0])).astype("float32")
        a, b = layer.lora_kernel_a.numpy(), layer.lora_kernel_b.numpy()
        expected = h @ layer._kernel.numpy() + (8 / 4) * (h @ a) @ b
        if layer.bias is not None:
            expected += layer.bias.numpy()
        activation = keras.activations.serialize(layer.activation)
        assert activation in ("linear", "tanh"), activation
        expected = np.tanh(expected) if activation == "tanh" else expected  # BERT's pooler
        error = np.abs(layer(h).numpy() - expected).max() / np.abs(expected).max()
        assert error <= 1e-6, (layer_name, error)

    targets = lora.projections(reference)  # the same names
    for layer_name, layer in lora.adapters(model).items():
        merged = layer._kernel.numpy() + 2.0 * layer.lora_kernel_a.numpy() @ layer.lora_kernel_b.numpy()
        targets[layer_name].kernel.assign(merged)
    adapted, numpy_merged = logits(model, x), logits(reference, x)
    scale = np.abs(adapted).max()
    assert np.abs(adapted - base).max() > 0.1 * scale  # the adapters matter
    np.testing.assert_allclose(adapted, numpy_merged, atol=1e-5 * scale, rtol=0)
    assert len(lora.merge_lora(model)) == len(targets)
    np.testing.assert_allclose(logits(model, x), adapted, atol=1e-5 * scale, rtol=0)
    assert not any("lora" in v.path for v in model.weights) and not lora.has_lora(model)
    assert {v.path for v in model.trainable_variables} == trainable_before  # a plain model again


def test_merge_under_mixed_bfloat16_keeps_the_float32_kernel():
    """Keras' own merged kernel (`Dense.kernel`) is cast to the compute dtype: merged through it, a
    mixed_bfloat16 model's float32 kernels would be rounded to bfloat16 whole."""
    model = build("dec-base", dtype="mixed_bfloat16")
    lora.enable_lora(model, rank=4, alpha=8, targets=["q_proj"])
    random_b(model)
    layer = next(iter(lora.adapters(model).values()))
    expected = layer._kernel.numpy() + 2.0 * layer.lora_kernel_a.numpy() @ layer.lora_kernel_b.numpy()
    keras_merge = keras.ops.convert_to_numpy(layer.kernel).astype("float32")
    lora.merge_lora(model)
    assert layer._kernel.dtype == "float32"
    np.testing.assert_allclose(layer._kernel.numpy(), expected, rtol=1e-6, atol=1e-7)
    assert np.abs(keras_merge - expected).max() > 1e-5  # what the rounding would have cost


def test_targets_follow_peft_names_and_defaults():
    dec = build("dec-base")
    projections = lora.projections(dec)
    assert [n.rsplit(".", 1)[-1] for n in lora.enable_lora(dec)] == ["q_proj", "v_proj"] * 2  # PEFT's llama default
    enc = zoo.get("enc-mini", **TINY)  # a BertModel backbone: it has the pooler
    enc_projections = lora.projections(enc)
    assert [n.rsplit(".", 1)[-1] for n in lora.enable_lora(enc)] == ["query", "value"] * 2  # PEFT's bert default
    names = lora.match(enc_projections, ["dense"], "bert")
    # PEFT's suffix rule: "dense" is the attention output, intermediate and output projections and the pooler
    assert names == [f"encoder.layer.{i}.{m}" for i in range(2)
                     for m in ("attention.output.dense", "intermediate.dense", "output.dense")] + ["pooler.dense"]
    names = lora.match(enc_projections, ["attention.output.dense"], "bert")
    assert names == ["encoder.layer.0.attention.output.dense", "encoder.layer.1.attention.output.dense"]
    assert lora.match(projections, r".*\.1\.mlp\..*", "llama") == [
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj"]


@pytest.mark.parametrize("name, overrides", [("qwen2.5-0.5b", TINY_DEC), ("gemma3-1b", dict(TINY_DEC, head_dim=32))])
def test_new_decoder_families_take_peft_defaults_and_the_planner_agrees(name, overrides):
    """Qwen2 (Q/K/V biases) and Gemma 3 (Q/K norms, sandwich norms): PEFT's default targets (q_proj,
    v_proj), the projections are the shapes module's, and the planner's adapters are the built ones."""
    model = zoo.get(name, **overrides)
    names = [n.rsplit(".", 1)[-1] for n in lora.projections(model)]
    assert sorted(names) == sorted([tag for tag, _ in shapes.block_projections(model.spec)] * 2)
    assert [n.rsplit(".", 1)[-1] for n in lora.enable_lora(model, rank=4)] == ["q_proj", "v_proj"] * 2
    built = [tuple(v.shape) for layer in lora.adapters(model).values()
             for v in (layer.lora_kernel_a, layer.lora_kernel_b)]
    assert sorted(built) == sorted(lora_plan(model.spec, "causal_lm", 4).adapter_shapes)
    assert {v.path.split("/")[-1] for v in model.trainable_variables} == {"lora_kernel_a", "lora_kernel_b"}


def test_lora_on_modernbert_is_refused_naming_the_supported_families():
    model = zoo.get("modernbert-base", task="classifier", **TINY)
    message = r"LoRA is not supported on the modernbert family: .*Wqkv.*bert, llama, qwen2, qwen3, gemma3 families"
    with pytest.raises(ValueError, match=message):
        lora.enable_lora(model)
    with pytest.raises(ValueError, match=message):
        lora.check_targets(model.spec, "classifier", ["Wo"])
    with pytest.raises(ValueError, match=message):
        memory.estimate(model.spec, 2, 16, task="classifier", lora_rank=4)
    assert not lora.has_lora(model)


# --- training ---------------------------------------------------------------------------
def test_fit_on_a_quantized_base_trains_only_the_adapters_and_a_new_classifier():
    """`full` checkpointing and mixed_bfloat16 on an int8 encoder. A decoder on an int4 base with the
    chunked LM loss trains the same way through the recipes (tests/recipes/test_lora_runs.py)."""
    model = build("enc-mini", policy="full", dtype="mixed_bfloat16")
    x = inputs(model)
    quantization.quantize_base(model, "int8")
    lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
    trainable = {v.path for v in model.trainable_variables}
    head = {"classifier/kernel", "classifier/bias"}
    assert trainable == {v.path for v in model.weights if "lora_kernel" in v.path} | head
    before = {v.path: v.numpy().copy() for v in model.weights}
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, jit_compile=False)
    history = model.fit(x, {"logits": labels(model, x)}, epochs=4, batch_size=BATCH, verbose=0).history["loss"]
    assert history[-1] < history[0] - 0.05, history
    for v in model.weights:
        moved = not np.array_equal(v.numpy(), before[v.path])
        if v.path in trainable and "lora_kernel_a" not in v.path:  # A moves once B has (B starts at zero)
            assert moved, f"{v.path} is trainable but did not change"
        elif v.path not in trainable and "seed" not in v.path:
            assert not moved, f"{v.path} is frozen but changed"


def gradients(model, x, y):
    """One eager step's gradients (cheaper than tracing a function that runs once)."""
    with tf.GradientTape() as tape:
        out = model(x, training=True)["logits"]
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return {v.path: g.numpy() for v, g in zip(model.trainable_variables, grads)}


def adapter_gradients(name, mode, policy):
    """One eager step's gradients of r4 adapters on every linear layer (B drawn non-zero), under `policy`, on a float
    base or one quantized to `mode`."""
    model = build(name, policy=policy)
    if mode:
        quantization.quantize_base(model, mode)
    lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
    random_b(model)
    x = inputs(model)
    return gradients(model, x, labels(model, x))


def assert_same_gradients(reference, other):
    for path, expected in reference.items():
        scale = np.abs(expected).max()
        assert scale > 0, path
        assert np.abs(other[path] - expected).max() <= 1e-5 * scale, path


@pytest.mark.parametrize("name,mode", [("enc-mini", None), ("dec-base", "int4")])
def test_full_recomputation_gives_the_same_adapter_gradients(name, mode):
    """Dropout 0.1 on: the recomputed block (adapters included) redraws the same masks. A float Dense
    merges its adapter into the kernel inside the recomputed block; an int4 one runs Keras'
    custom-gradient matmul inside tf.recompute_grad."""
    assert_same_gradients(adapter_gradients(name, mode, "none"), adapter_gradients(name, mode, "full"))


def test_the_mlp_in_chunks_gives_the_same_adapter_gradients_on_int4(monkeypatch):
    """`full` with the MLP in chunks of 3 positions (zoo.ops.position_chunks, a long sequence's replay): its own
    backward recomputes each chunk's adapters and int4 kernels and sums the adapters' gradients over the chunks."""
    reference = adapter_gradients("dec-base", "int4", "none")
    chunks = mlp_in_chunks(monkeypatch, 3, SHAPES["dec-base"]["intermediate_dim"])
    assert_same_gradients(reference, adapter_gradients("dec-base", "int4", "full"))
    assert set(chunks) == {(3, SEQ)}, chunks


def test_a_tape_watches_only_what_trains_so_recomputation_skips_frozen_kernels():
    """tf.recompute_grad takes the gradient of every variable a tape watched in the block. Keras'
    `trainable = False` leaves the tf.Variable under it trainable, so each frozen kernel got a
    kernel-sized gradient, held to the end of the backward (dec-base LoRA at 1 x 64: +0.49 GiB on a
    0.25 GiB model). enable_lora freezes both flags; merge_lora thaws both."""
    model = build("dec-base", policy="full")
    lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
    x = inputs(model)

    def watched():
        with tf.GradientTape() as tape:
            model(x, training=True)
        return {id(v) for v in tape.watched_variables()}

    def handles(variables):
        return {id(v._value) for v in variables if v.dtype.startswith("float")}

    assert watched() == handles(model.trainable_variables)
    assert len(model.trainable_variables) == 2 * len(lora.adapters(model))
    lora.merge_lora(model)
    assert watched() == handles(model.trainable_variables) == handles(model.variables)


# --- a quantized base -------------------------------------------------------------------
# max |logits - float logits| / max |float logits| measured on these tiny models (random weights): int8
# 5.9e-3 (dec) and 4.9e-3 (enc), int4 (its tables int8) 4.8e-2 and 1.6e-1 (hidden 64: one 4-bit block of 128 is a
# whole column).
BOUNDS = {"int8": 1e-2, "int4": 2.5e-1}


def quantized_close_to(model, mode, reference, x, capsys):
    """Quantizes `model` (built like the float one that gave the `reference` logits) and checks what it became:
    the layers quantized, a new head kept float, and its logits' error to float. Returns the quantized layers."""
    name = "enc-mini" if model.task == "classifier" else "dec-base"
    quantized = quantization.quantize_base(model, mode)
    kinds = {type(layer).__name__ for layer in model._flatten_layers() if layer.path in quantized}
    # decoders: keras-hub's ReversibleEmbedding as zoo's ScaledEmbedding (Gemma's x sqrt(h); None here)
    assert kinds == {"Dense"} | ({"Embedding", "ReversibleEmbedding"} if name == "enc-mini" else {"ScaledEmbedding"})
    if name == "enc-mini":
        assert model.classifier.quantization_mode is None  # the new head stays float and trainable
        assert {v.path for v in model.trainable_variables} >= {"classifier/kernel", "classifier/bias"}
    error = np.abs(logits(model, x) - reference).max() / np.abs(reference).max()
    with capsys.disabled():
        print(f"\n{name} {mode}: max |logits - float| / max |float logits| = {error:.2e}")
    assert 0 < error <= BOUNDS[mode], (name, mode, error)
    return quantized


def test_quantized_encoder_is_close_to_float_and_keeps_a_new_head_float(capsys):
    """The decoder's closeness: test_quantized_decoder_is_close_and_gives_the_float_base_gradients."""
    float_model = build("enc-mini", dropout=0.0)
    x = inputs(float_model)
    reference = logits(float_model, x)
    for mode in lora.QUANTIZATION_MODES:
        quantized_close_to(build("enc-mini", dropout=0.0), mode, reference, x, capsys)


def test_a_quantized_gemma3_keeps_its_embedding_scale(capsys):
    """Keras calls a quantized layer's `quantized_call`, not its `call`: Gemma's x sqrt(hidden) token
    embedding (zoo.layers.embedding.ScaledEmbedding) must scale there too. Measured: 1.8e-2 of the largest
    logit with the scale, 0.23 without it (Keras' quantized_call alone)."""
    keras.utils.set_random_seed(0)
    model = zoo.get("gemma3-1b", **TINY_DEC, head_dim=32)
    x = inputs(model)
    reference = logits(model, x)
    quantized = quantization.quantize_base(model, "int8")
    assert "ScaledEmbedding" in {type(layer).__name__ for layer in model._flatten_layers() if layer.path in quantized}
    error = np.abs(logits(model, x) - reference).max() / np.abs(reference).max()
    with capsys.disabled():
        print(f"\ngemma3 int8: max |logits - float| / max |float logits| = {error:.2e}")
    assert 0 < error <= 3e-2, error


@pytest.mark.memory
def test_deleted_and_quantized_models_free_their_float_kernels():
    """The scratch graphs Keras traces while building a model held all its variables (through the
    custom gradients TensorFlow registers for good): a deleted model was never freed, and
    quantizing saved nothing. Measured on TensorFlow's allocator."""
    def current():
        gc.collect()
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    def model():
        return zoo.get("dec-base", num_layers=2, hidden_dim=256, num_heads=4, num_kv_heads=2, intermediate_dim=1024,
                       vocab_size=128)

    start = current()
    built = model()
    size = current() - start
    del built
    assert size > 7e6 and current() - start <= 2**20  # 7.9 MB of float32 kernels, all freed
    quantized = model()
    quantization.quantize_base(quantized, "int8")
    stored = sum(np.asarray(v.numpy()).nbytes for v in quantized.weights)
    assert stored < 0.3 * size  # a quarter of it in int8
    assert current() - start <= stored + 2**20


def test_quantized_decoder_is_close_and_gives_the_float_base_gradients_and_merges_requantized(capsys):
    """On the same three decoders (float, int8, int4; the builds are the test's time): each quantized base is close
    to float; the same adapters on a float and a quantized decoder get gradients that point the same way (with
    Keras' default int8 config, which also quantizes the input of the tied LM head (ReversibleEmbedding) without a
    straight-through gradient, the cosine was 0.12); and merging into the int8 kernels is Keras'
    dequantize-merge-requantize: one more int8 rounding, bounded."""
    def adapted(mode, reference=None):
        """(the model with random-B adapters, its inputs, its logits before them, its adapter gradients)."""
        model = build("dec-base", dropout=0.0)
        x = inputs(model)
        if mode:
            quantized_close_to(model, mode, reference, x, capsys)
        before = logits(model, x)
        lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")  # the same A draws: set_random_seed
        random_b(model)
        grads = gradients(model, x, labels(model, x))
        return model, x, before, np.concatenate([g.ravel() for g in grads.values()])

    _, x, reference, float_grads = adapted(None)
    for mode, bound in (("int8", 0.999), ("int4", 0.98)):  # measured 1.0000 and 0.9917
        model, _, _, g = adapted(mode, reference)
        cosine = g @ float_grads / np.linalg.norm(g) / np.linalg.norm(float_grads)
        with capsys.disabled():
            print(f"\ndec-base {mode}: cosine of the adapter gradients to the float base's = {cosine:.4f}")
        assert cosine > bound, (mode, cosine)
        if mode == "int8":
            before = logits(model, x)
            lora.merge_lora(model)
            assert {layer.quantization_mode for layer in lora.projections(model).values()} == {"int8"}
            assert not lora.has_lora(model)
            assert np.abs(logits(model, x) - before).max() / np.abs(before).max() <= 1e-2


# --- refusals ---------------------------------------------------------------------------
def test_bad_input_is_refused_with_the_fix():
    model = build("dec-base")
    with pytest.raises(ValueError, match=r"Unknown LoRA target 'q'.*known: q_proj, k_proj, v_proj, o_proj, "
                                         r"gate_proj, up_proj, down_proj"):
        lora.enable_lora(model, targets=["q"])
    with pytest.raises(ValueError, match="Unknown LoRA target 'query'"):
        lora.enable_lora(model, targets=["query"])  # a BERT name on a Llama model
    with pytest.raises(ValueError, match="matches none"):
        lora.enable_lora(model, targets=r"layers\.9\..*")
    for rank in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="lora_rank must be a positive whole number"):
            lora.enable_lora(model, rank=rank)
    with pytest.raises(ValueError, match="lora_alpha must be a positive number"):
        lora.enable_lora(model, alpha=0)
    with pytest.raises(ValueError, match="dropout=0.1 is not supported"):
        lora.enable_lora(model, dropout=0.1)
    with pytest.raises(ValueError, match="no LoRA adapters to merge"):
        lora.merge_lora(model)
    with pytest.raises(ValueError, match="Unknown quantization mode 'int2'"):
        quantization.quantize_base(model, "int2")
    assert not lora.has_lora(model) and all(v.trainable for v in model.weights if "seed" not in v.path)
    lora.enable_lora(model)
    with pytest.raises(ValueError, match="fused update is not combined with LoRA"):
        model.set_fused_update(True)
    with pytest.raises(ValueError, match="already has LoRA"):
        lora.enable_lora(model, targets=["o_proj"])
    with pytest.raises(ValueError, match="before enable_lora"):
        quantization.quantize_base(model, "int8")
