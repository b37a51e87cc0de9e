"""Loading straight into int8 / int4, tensor by tensor (issue 36): `zoo.hub.load(..., quantize=)` builds the
decoder quantized and quantizes each kernel as its tensor arrives, with Keras' own quantizer per layer."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

import zoo
from tests.common import TINY_DEC, allocator_peak
from zoo import hub, lora, quantization
from zoo.hub import weights


def checkpoints(folder, shards, tied=False, name="dec-1b", **shape):
    """Bfloat16 checkpoints of one model of `name`'s family with random weights, in folder/<size> for each
    largest shard size in `shards` (None: one file)."""
    model = zoo.get(name, dtype="bfloat16", **{**TINY_DEC, "tie_embeddings": tied, **shape})
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign((rng.normal(size=v.shape) * 0.05).astype("float32"))
    return [hub.save(model, folder / str(size), max_shard_size=size) for size in shards]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(tied, name) -> (sharded at 30 kB, whole) bfloat16 checkpoints of one random model, made once for the
    module (the bad-tensor tests copy the untied dec-1b's before they corrupt it)."""
    made = {}

    def get(tied, name):
        if (tied, name) not in made:
            made[tied, name] = checkpoints(tmp_path_factory.mktemp("saved"), (30_000, None), tied=tied, name=name)
        return made[tied, name]

    return get


def assert_same_model(a, b):
    wa, wb = {v.path: v for v in a.weights}, {v.path: v for v in b.weights}
    assert set(wa) == set(wb)
    for path in wa:
        assert wa[path].dtype == wb[path].dtype, path
        np.testing.assert_array_equal(np.asarray(wa[path]), np.asarray(wb[path]), err_msg=path)
    policies = [{layer.path: layer.dtype_policy.name for layer in model._flatten_layers(include_self=False)}
                for model in (a, b)]
    assert policies[0] == policies[1]


@pytest.mark.parametrize("mode, tied, dtype, name", [("int4", False, "mixed_bfloat16", "dec-1b"),
                                                     ("int8", True, "float32", "dec-1b"),
                                                     ("int4", True, "float32", "qwen2.5-0.5b")])  # Q/K/V biases
def test_sharded_bfloat16_into_int4_equals_whole_then_quantized(saved, monkeypatch, mode, tied, dtype, name):
    """Layers quantized in slices of a few rows / columns (as an 8B model's embedding is) too."""
    monkeypatch.setattr(quantization, "QUANTIZE_SLICE", 1000)
    sharded, whole = saved(tied, name)  # one model saved both ways
    assert (sharded / weights.INDEX).is_file() and len(list(sharded.glob("*.safetensors"))) > 3
    spec = zoo.spec(name).replace(**TINY_DEC, tie_embeddings=tied)
    streamed = zoo.get(spec, weights=sharded, quantize=mode, dtype=dtype, tokenizer=False)
    reference = hub.load(whole, dtype=dtype, tokenizer=False)
    quantization.quantize_base(reference, mode)
    assert_same_model(streamed, reference)
    assert quantization.quantize_base(streamed, mode)  # already quantized in this mode: nothing changes (zoo train)
    x = {"token_ids": np.arange(10, dtype="int32")[None] % 128, "padding_mask": np.ones((1, 10), "int32")}
    np.testing.assert_array_equal(np.asarray(streamed(x)["logits"]), np.asarray(reference(x)["logits"]))
    for model in (streamed, reference):  # QLoRA trains on either the same way
        lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
    for mine, theirs in zip(streamed.trainable_variables, reference.trainable_variables):
        mine.assign(theirs)  # the same adapters (Keras draws A afresh per layer)
    tapes = []
    for model in (streamed, reference):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x)["logits"] ** 2)
        tapes.append([np.asarray(g) for g in tape.gradient(loss, model.trainable_variables)])
    for ga, gb in zip(*tapes):
        np.testing.assert_array_equal(ga, gb)


def test_layers_loaded_in_slices_are_read_without_a_copy(saved, monkeypatch):
    """A variable written slice by slice in place (ResourceStridedSliceAssign) stays in TensorFlow's copy-on-read
    mode: every read of it in a training step copies it whole (llama3.2-3b's int8 head: 376 MiB a read; its QLoRA
    step with shared blocks peaked at 4.89 GiB with it, 3.53 without, docs/memory.md). Loaded layers read in place."""
    monkeypatch.setattr(quantization, "QUANTIZE_SLICE", 1000)  # every kernel and the embedding in slices
    model = hub.load(saved(False, "dec-1b")[0], quantize="int4", dtype="mixed_bfloat16", tokenizer=False)

    def in_use():
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    copied = []
    for v in model.weights:
        before = in_use()
        value = v._value.read_value()  # the tf.Variable under Keras'
        if in_use() > before:
            copied.append((v.path, v.dtype, tuple(v.shape)))
        del value
    assert not copied


# The memory tests' model: 4 layers whose every matrix (and the untied head's table with its reverse) is 1 MiB in
# float32, so that one layer is a sixteenth of the float32 model (16 MiB) and the saving stands far above the
# allocator's noise (~0.5 MiB between loads here).
BIG = dict(vocab_size=512, hidden_dim=256, num_heads=4, num_kv_heads=2, intermediate_dim=1024, num_layers=4)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """(its spec, a bfloat16 checkpoint of it in 1 MiB shards), made once for both loading-peak tests."""
    spec = zoo.spec("dec-1b").replace(**{**TINY_DEC, **BIG, "tie_embeddings": False})
    return spec, checkpoints(tmp_path_factory.mktemp("big"), [2**20], **BIG)[0]


def largest_tensor(spec):
    """Elements of the largest tensor read (a projection kernel or the embedding table)."""
    return max(spec.vocab_size, spec.intermediate_dim) * spec.hidden_dim


@pytest.mark.memory
def test_loading_peak_is_the_quantized_model_and_one_layer(big):
    """Each kernel is quantized as it arrives: the peak is the int4 model and one layer's quantization, never a
    float32 copy of the model (4 B/param). The largest layer is a 256 x 1024 projection, or the untied head's
    ReversibleEmbedding, whose table and reverse (512 x 256 each) Keras quantizes in one call: 1 MiB of float32."""
    spec, folder = big
    loaded = []

    def load():
        loaded[:] = [hub.load(folder, quantize="int4", tokenizer=False)]

    # one load after an unmeasured one (TensorFlow's first-call allocations): ten loads measured 5.1-5.9 MiB, oneDNN
    # on and off, 1.3 MiB under the bound below at worst, so the least of several (tests/common.py) is not needed
    peak = allocator_peak(load, repeats=1)
    quantized = sum(v.numpy().nbytes for v in loaded[0].weights)
    layer = 4 * max(2 * spec.vocab_size * spec.hidden_dim, largest_tensor(spec))  # float32 bytes of the largest layer
    # Expected: the int4 model (2.2 MiB) and Keras' quantizer at work on one layer's float32 kernel: the kernel, its
    # absolute values, the scaled and the rounded copies; measured 2.6-3.4 layers above the model (5.0-5.6 MiB here;
    # 20.7 MiB over an 8 MiB head at vocabulary 4096), oneDNN on and off. Bound: 4 layers and 1 MiB for the rest.
    bound = quantized + 4 * layer + 2**20
    assert peak <= bound, (peak, quantized, layer)
    assert bound < 0.5 * 4 * spec.num_params(), (bound, spec.num_params())  # 7.2 MiB against a 16 MiB float32 copy
    assert zoo.memory.loading_plan(spec, quantize="int4").model == quantized  # the planner's stored bytes


@pytest.mark.memory
def test_a_bfloat16_model_loads_with_no_float32_copy(big):
    """Built in its storage dtype: `dtype="bfloat16"` (bfloat16 weights, or a frozen LoRA base) makes bfloat16
    variables from the start, and each tensor goes in as read; nothing float32 of the model's size exists."""
    spec, folder = big
    loaded = []

    def load():
        loaded[:] = [zoo.get(spec, weights=folder, dtype="bfloat16", tokenizer=False)]

    # the least of two loads after an unmeasured one (tests/common.py): ten single loads measured 9.3-10.8 MiB,
    # oneDNN on and off, against the bound's 11 MiB
    peak = allocator_peak(load, repeats=2)
    assert {v.dtype for v in loaded[0].weights} == {"bfloat16"}
    stored = sum(v.numpy().nbytes for v in loaded[0].weights)
    assert stored == 2 * spec.num_params()
    largest = largest_tensor(spec)
    # Expected: the model (8 MiB) and one tensor as read and as cast, float32 at most (2 MiB), 1 MiB for the rest;
    # measured at most 9.8 MiB, oneDNN on and off.
    bound = stored + 2 * 4 * largest + 2**20
    assert peak <= bound, (peak, stored, largest)
    assert bound < 4 * spec.num_params()  # 11 MiB: a float32 copy of the model (16 MiB) would not fit under it
    assert zoo.memory.loading_plan(spec, precision="bfloat16").model == stored


def test_plan_prints_the_loading_peak_beside_the_step(capsys):
    from zoo.cli import main

    args = ["--lora-rank", "16", "--quantize", "int4", "--batch-size", "1", "--sequence-length", "2048",
            "--checkpointing", "full", "--precision", "mixed_bfloat16", "--lora-targets", "all-linear"]
    assert main(["plan", "llama3.1-8b", *args]) == 0
    auto = capsys.readouterr().out.splitlines()[-1]  # then the process's planned RSS (test_resident_plan.py)
    plan = zoo.memory.loading_plan("llama3.1-8b", quantize="int4", precision="mixed_bfloat16")
    assert auto.startswith("auto: full (") and f"peak {plan.total / zoo.memory.GiB:.2f} GiB" in auto
    # 7.0B parameters of the blocks at about half a byte, the two token tables' 1.05B at a byte (int8)
    assert 4.4 * zoo.memory.GiB < plan.model < 4.6 * zoo.memory.GiB


def corrupt(folder, key, array):
    """Rewrite the shard that holds `key` with `array` in its place."""
    shard = folder / json.loads((folder / weights.INDEX).read_text())["weight_map"][key]
    tensors = load_file(shard)
    tensors[key] = array
    save_file(tensors, shard, metadata={"format": "pt"})


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_a_bad_tensor_in_one_shard_is_refused_by_name_and_nothing_is_half_loaded(saved, tmp_path, bad):
    folder = shutil.copytree(saved(False, "dec-1b")[0], tmp_path / "ckpt")
    key = "model.layers.1.mlp.down_proj.weight"
    good = load_file(folder / json.loads((folder / weights.INDEX).read_text())["weight_map"][key])[key]
    corrupt(folder, key, good[:, :-1] if bad == "shape" else good.astype(np.int32))
    message = "Shape mismatch for tensor" if bad == "shape" else "is I32"
    with pytest.raises(ValueError, match=f"{message}.*|.*{key}") as error:
        hub.load(folder, quantize="int4", tokenizer=False)
    assert key in str(error.value) and message in str(error.value)
    mine = zoo.get("dec-1b", **TINY_DEC, tie_embeddings=False)  # a model the user keeps
    before = [np.asarray(v).copy() for v in mine.weights]
    with pytest.raises(ValueError, match=message):
        hub.load_weights(mine, folder)
    for old, v in zip(before, mine.weights):  # every header is read before any tensor is assigned
        np.testing.assert_array_equal(old, np.asarray(v))


def test_a_load_the_machine_cannot_hold_is_refused_before_anything_is_built(saved, monkeypatch, capsys):
    """The plan (zoo.memory.loading_plan, less the runtime this process already holds) against MemAvailable: a load
    that does not fit is refused before the model is built or a tensor read, naming both figures and the settings
    that fit; check_memory=False loads anyway; the CLI says it in one line."""
    from zoo.memory import budget

    gib = zoo.memory.GiB
    with pytest.raises(zoo.memory.DoesNotFit) as refused:  # llama3.1-8b in float32 on a 20 GiB machine
        zoo.memory.check_loading_fits("llama3.1-8b", "causal_lm", None, "float32", available=20 * gib, label="8B")
    plans = {q: zoo.memory.loading_plan("llama3.1-8b", "causal_lm", q, "float32") for q in (None, "int4", "int8")}
    needed = {q: (p.total - p.runtime) / gib for q, p in plans.items()}
    assert str(refused.value).startswith(f"Loading 8B with quantize=None, dtype='float32' needs about "
                                         f"{needed[None]:.2f} GiB (zoo.memory.loading_plan) and 20.00 GiB is available")
    assert f"Settings that fit: quantize='int4', dtype='float32': {needed['int4']:.2f} GiB; quantize='int8'" in str(
        refused.value)

    folder = saved(False, "dec-1b")[1]
    monkeypatch.setattr(budget, "available_bytes", lambda: 1000)  # bytes: the tiny model's plan is more
    with monkeypatch.context() as guard:
        guard.setattr(hub, "build", lambda *a, **k: pytest.fail("built before the memory check"))
        with pytest.raises(zoo.memory.DoesNotFit, match="GiB is available now"):
            hub.load(folder, tokenizer=False)
    assert hub.load(folder, tokenizer=False, check_memory=False).spec.vocab_size == TINY_DEC["vocab_size"]
    from zoo.cli import main

    assert main(["generate", str(folder), "hello", "--max-new-tokens", "1"]) == 2
    assert "zoo generate: error: Loading" in capsys.readouterr().err
