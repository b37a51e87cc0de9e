"""Hugging Face format in and out on tiny models: exact round trips, the Hugging
Face tensor names and shapes, keras-hub reading what zoo writes, sharding,
streaming, the Hub cache, push, and every refusal the issue lists; parity with
folders transformers itself wrote (tests/fixtures/hf, made by tools/make_hf_fixtures.py)
in each config format; atomic writes that survive a failure part-way."""

import json
import os
import shutil
import tracemalloc
from pathlib import Path

import keras_hub
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import zoo
from tests.common import REPO, exact_gelu, llama_cpp_permute
from zoo import hub

FIXTURES = REPO / "tests" / "fixtures" / "hf"
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

TINY_BERT = dict(num_layers=2, hidden_dim=32, num_heads=4, intermediate_dim=64, vocab_size=120,
                 max_sequence_length=64, dropout=0.0)
TINY_LLAMA = dict(num_layers=2, hidden_dim=32, num_heads=4, num_kv_heads=2, intermediate_dim=64,
                  vocab_size=150, max_sequence_length=64)


def bert(task="backbone", **kw):
    return zoo.get("enc-mini", task=task, **{**TINY_BERT, **kw})


def llama(task="causal_lm", **kw):
    return zoo.get("dec-base", task=task, **{**TINY_LLAMA, **kw})


def inputs(model, batch=2, length=7, seed=0):
    rng = np.random.default_rng(seed)
    vocab = model.spec.vocab_size
    x = {"token_ids": rng.integers(1, vocab, (batch, length)).astype("int32"),
         "padding_mask": np.ones((batch, length), "int32")}
    x["padding_mask"][1, -2:] = 0
    if "segment_ids" in model.input:
        x["segment_ids"] = np.zeros((batch, length), "int32")
    if "mask_positions" in model.input:
        x["mask_positions"] = np.array([[1, 3], [0, 2]], "int32")
    return x


def randomise(model, seed=0):
    """Give every variable (biases and norms too) distinct values, so a swapped tensor shows."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, 0.2, v.shape).astype(v.dtype) + (1.0 if "gamma" in v.path or "scale" in v.path else 0))
    return model


def keys_and_shapes(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(folder, name), framework="numpy") as f:
                out.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return out


def assert_same_weights(a, b):
    assert len(a.weights) == len(b.weights)
    for va, vb in zip(a.weights, b.weights):
        assert va.path == vb.path
        np.testing.assert_array_equal(va.numpy(), vb.numpy(), err_msg=va.path)


CASES = [
    ("bert", "backbone", {}), ("bert", "masked_lm", {}), ("bert", "classifier", {"num_classes": 3}),
    ("llama", "causal_lm", {}), ("llama", "causal_lm", {"tie_embeddings": False}), ("llama", "backbone", {}),
    ("llama", "causal_lm", {"rope_scaling": LLAMA3, "head_dim": 16}),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`saved(family, task, **kw)` -> (model, folder): a CASES model with random weights, built and saved once
    for the module (building is most of a tiny model's cost). Tests only read both; one that edits a
    folder edits a copy (`copied`)."""
    root, cache = tmp_path_factory.mktemp("saved"), {}

    def get(family, task, **kw):
        key = (family, task, json.dumps(kw, sort_keys=True))
        if key not in cache:
            model = randomise((bert if family == "bert" else llama)(task, **kw), seed=len(cache))
            cache[key] = model, hub.save(model, root / str(len(cache)))
        return cache[key]

    return get


def copied(folder, to):
    """A copy of a shared folder, for a test that edits one."""
    return Path(shutil.copytree(folder, to))


@pytest.mark.parametrize("family,task,kw", CASES, ids=lambda c: str(c))
def test_round_trip_is_bit_exact(saved, family, task, kw):
    model, folder = saved(family, task, **kw)
    loaded = hub.load(folder)
    assert type(loaded) is type(model) and loaded.spec.replace(description="") == model.spec.replace(description="")
    assert_same_weights(model, loaded)
    x = inputs(model)
    for key, value in model(x).items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(loaded(x)[key]))


def test_bert_names_and_shapes_are_transformers(saved):
    """The tensors transformers' BertForMaskedLM / BertForSequenceClassification / BertModel hold."""
    h, f, v = 32, 64, 120
    layer = {
        "attention.self.query.weight": (h, h), "attention.self.query.bias": (h,),
        "attention.self.key.weight": (h, h), "attention.self.key.bias": (h,),
        "attention.self.value.weight": (h, h), "attention.self.value.bias": (h,),
        "attention.output.dense.weight": (h, h), "attention.output.dense.bias": (h,),
        "attention.output.LayerNorm.weight": (h,), "attention.output.LayerNorm.bias": (h,),
        "intermediate.dense.weight": (f, h), "intermediate.dense.bias": (f,),
        "output.dense.weight": (h, f), "output.dense.bias": (h,),
        "output.LayerNorm.weight": (h,), "output.LayerNorm.bias": (h,),
    }
    base = {"embeddings.word_embeddings.weight": (v, h), "embeddings.position_embeddings.weight": (64, h),
            "embeddings.token_type_embeddings.weight": (2, h), "embeddings.LayerNorm.weight": (h,),
            "embeddings.LayerNorm.bias": (h,)}
    base.update({f"encoder.layer.{i}.{k}": s for i in range(2) for k, s in layer.items()})
    pooler = {"pooler.dense.weight": (h, h), "pooler.dense.bias": (h,)}
    mlm = {"cls.predictions.transform.dense.weight": (h, h), "cls.predictions.transform.dense.bias": (h,),
           "cls.predictions.transform.LayerNorm.weight": (h,), "cls.predictions.transform.LayerNorm.bias": (h,),
           "cls.predictions.bias": (v,)}

    def prefixed(d):
        return {"bert." + k: s for k, s in d.items()}

    expected = {
        "backbone": ({**base, **pooler}, "BertModel"),
        "masked_lm": ({**prefixed(base), **mlm}, "BertForMaskedLM"),
        "classifier": ({**prefixed({**base, **pooler}), "classifier.weight": (3, h), "classifier.bias": (3,)},
                       "BertForSequenceClassification"),
    }
    for task, (names, arch) in expected.items():
        _, folder = saved("bert", task, **({"num_classes": 3} if task == "classifier" else {}))
        assert keys_and_shapes(folder) == names
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == [arch] and config["hidden_act"] == "gelu"


def test_llama_names_and_shapes_are_transformers(saved):
    h, f, v, kv = 32, 64, 150, 2 * 8
    layer = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h),
             "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, h),
             "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f),
             "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    names = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    names.update({f"model.layers.{i}.{k}": s for i in range(2) for k, s in layer.items()})
    _, folder = saved("llama", "causal_lm")
    assert keys_and_shapes(folder) == names
    _, folder = saved("llama", "causal_lm", tie_embeddings=False)
    assert keys_and_shapes(folder) == {**names, "lm_head.weight": (v, h)}
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    assert (config["num_key_value_heads"], config["head_dim"]) == (2, 8)


def test_keras_hub_reads_what_zoo_writes(saved):
    """An independent loader (keras-hub's Hugging Face converters) gets the same outputs."""
    model, folder = saved("bert", "backbone")
    reference = exact_gelu(keras_hub.models.BertBackbone.from_preset(str(folder)))
    x = inputs(model)
    ours, theirs = model(x), reference(x)
    np.testing.assert_allclose(ours["sequence_output"], theirs["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(ours["pooled_output"], theirs["pooled_output"], atol=1e-5)

    model, folder = saved("llama", "causal_lm", tie_embeddings=False)
    reference = keras_hub.models.Llama3Backbone.from_preset(
        str(folder), layer_norm_epsilon=model.spec.layer_norm_epsilon)
    x = inputs(model)
    x["padding_mask"][:] = 1
    logits = reference.token_embedding(reference(x), reverse=True)
    np.testing.assert_allclose(model(x)["logits"], logits, atol=1e-4)


def test_bfloat16_checkpoints_load_and_save(saved, tmp_path):
    """Hub checkpoints are often bfloat16: they load into float32 variables (exactly, bf16 ⊂ f32),
    and a bfloat16 model saves BF16 tensors that round-trip bit-exactly."""
    import ml_dtypes

    model, folder = saved("llama", "causal_lm")
    folder = copied(folder, tmp_path / "f32")
    _edit(folder, lambda t: t.update({k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}))
    loaded = hub.load(folder)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy().astype(ml_dtypes.bfloat16).astype("float32"), b.numpy())
    half = hub.load(folder, dtype="bfloat16")
    assert half.weights[0].dtype == "bfloat16"
    again = hub.load(hub.save(half, tmp_path / "bf16"), dtype="bfloat16")
    assert keys_and_shapes(tmp_path / "bf16") == keys_and_shapes(folder)
    assert_same_weights(half, again)


def test_sharded_checkpoint_with_index(saved, tmp_path):
    model, _ = saved("llama", "causal_lm", tie_embeddings=False)
    folder = hub.save(model, tmp_path / "sharded", max_shard_size=20_000)
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (folder / "model.safetensors").exists()
    index = json.loads((folder / hub.INDEX).read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert_same_weights(model, hub.load(folder))


def test_loading_streams_one_tensor_at_a_time(tmp_path):
    """Extra memory while loading is about one tensor, not the checkpoint."""
    model = randomise(bert(num_layers=4, hidden_dim=128, intermediate_dim=512, vocab_size=2000,
                           max_sequence_length=128))
    folder = hub.save(model, tmp_path / "m")
    saved_values = [v.numpy() for v in model.weights]
    randomise(model, seed=1)  # the same model as the target: loading must bring every saved value back
    total = sum(np.prod(v.shape) * 4 for v in model.weights)
    largest = max(np.prod(v.shape) * 4 for v in model.weights)
    tracemalloc.start()
    try:
        hub.load_weights(model, folder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for v, value in zip(model.weights, saved_values):
        np.testing.assert_array_equal(v.numpy(), value, err_msg=v.path)
    assert peak < 3 * largest < total, (peak, largest, total)


def test_prefixes_and_legacy_layernorm_names_load(saved, tmp_path):
    """`bert.`-prefixed BertModel weights and TF-era LayerNorm gamma/beta names load the same."""
    model, folder = saved("bert", "backbone")
    folder = copied(folder, tmp_path / "legacy")
    with safe_open(folder / "model.safetensors", framework="numpy") as f:
        legacy = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
        tensors = {}
        for k in f.keys():
            name = k
            for new, old in legacy.items():
                name = name.replace(new, old)
            tensors["bert." + name] = f.get_tensor(k)
    tensors["bert.embeddings.position_ids"] = np.arange(64)[None]  # a buffer old checkpoints carry
    save_file(tensors, folder / "model.safetensors")
    assert_same_weights(model, hub.load(folder))


def test_new_head_on_a_bare_backbone_checkpoint(saved, caplog):
    """A BertModel checkpoint fine-tunes as a classifier: backbone loaded, head fresh (and said so)."""
    model, folder = saved("bert", "backbone")
    classifier = hub.load(folder, task="classifier", num_classes=5)
    assert classifier.output["logits"].shape[-1] == 5
    assert_same_weights(model, classifier.backbone)
    assert "classifier.weight" in caplog.text
    # A masked-LM checkpoint loads as a backbone (its MLM head is dropped, its missing pooler is fresh).
    mlm, folder = saved("bert", "masked_lm")
    backbone = hub.load(folder, task="backbone")
    for v in mlm.backbone.weights:
        np.testing.assert_array_equal(v.numpy(), _variable(backbone, v.path).numpy(), err_msg=v.path)


def _variable(model, path):
    return next(w for w in model.weights if w.path == path)


def test_registered_name_must_match_the_checkpoint(saved):
    _, folder = saved("bert", "backbone")
    with pytest.raises(ValueError, match=r"not a 'enc-base' checkpoint.*num_layers: checkpoint 2, enc-base 12"):
        zoo.get("enc-base", weights=str(folder))


def test_tokenizers_round_trip(saved, tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "on", "mat"]
    wordpiece = keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=True)
    bpe = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary={"<|endoftext|>": 0, "t": 1, "h": 2, "e": 3, "Ġ": 4, "c": 5, "a": 6, "th": 7, "the": 8, "Ġc": 9,
                    "at": 10, "Ġcat": 11},
        merges=["t h", "th e", "Ġ c", "a t", "Ġc at"], unsplittable_tokens=["<|endoftext|>"])
    for tokenizer, (model, _), text in ((wordpiece, saved("bert", "backbone"), "The cats sat on the mat"),
                                        (bpe, saved("llama", "causal_lm"), "the cat<|endoftext|>")):
        folder = hub.save(model, tmp_path / type(tokenizer).__name__, tokenizer=tokenizer)
        again = hub.load(folder).tokenizer
        assert type(again) is type(tokenizer)
        assert np.asarray(again(text)).tolist() == np.asarray(tokenizer(text)).tolist()
        assert len(np.asarray(tokenizer(text))) > 2


def test_save_refuses_to_overwrite_and_writes_atomically(saved, tmp_path):
    model, _ = saved("bert", "backbone")
    folder = hub.save(model, tmp_path / "m")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        hub.save(model, folder)
    other, _ = saved("bert", "masked_lm")
    hub.save(other, folder, overwrite=True)
    assert_same_weights(other, hub.load(folder))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp siblings left behind


def snapshot(folder) -> dict:
    """Every file of a folder (recursively) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def fail_on_second_call(monkeypatch, module, name):
    """Make `module.name` write its first file as usual, then raise: a failure half-way through a write."""
    real, calls = getattr(module, name), []

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) > 1:
            raise OSError("disk full (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, flaky)
    return calls


def test_a_failed_overwrite_leaves_the_earlier_folder_intact(saved, tmp_path, monkeypatch):
    """A save that dies after writing part of the new folder (config.json and the first shard)
    keeps the earlier folder byte for byte, and leaves no temporary folder behind."""
    import safetensors.numpy

    folder = hub.save(saved("llama", "causal_lm")[0], tmp_path / "m", tokenizer=None)
    before = snapshot(folder)
    calls = fail_on_second_call(monkeypatch, safetensors.numpy, "save_file")
    with pytest.raises(OSError, match="injected"):
        hub.save(saved("llama", "causal_lm", tie_embeddings=False)[0], folder, overwrite=True,
                 max_shard_size=20_000)
    assert len(calls) == 2  # the first shard was written before the failure
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_failed_gguf_conversion_leaves_the_earlier_folder_intact(tmp_path, monkeypatch):
    """The same for convert_gguf: it fails after model.safetensors, while writing config.json."""
    gguf_file = write_gguf(FIXTURES / "llama-rope-parameters", tmp_path / "tiny.gguf")
    folder = hub.convert_gguf(gguf_file, tmp_path / "converted")
    before = snapshot(folder)
    real_write_text = Path.write_text

    def failing_write_text(self, *args, **kwargs):
        if self.name == "config.json":
            raise OSError("disk full (injected)")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing_write_text)
    with pytest.raises(OSError, match="injected"):
        hub.convert_gguf(gguf_file, folder, overwrite=True)
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted", "tiny.gguf"]


def test_classifier_labels_are_written_as_id2label(saved, tmp_path):
    model, _ = saved("bert", "classifier", num_classes=3)
    folder = hub.save(model, tmp_path / "m", labels=["earn", "acq", "crude"])
    config = json.loads((folder / "config.json").read_text())
    assert config["id2label"] == {"0": "earn", "1": "acq", "2": "crude"} and config["label2id"]["crude"] == 2
    assert hub.load(folder).classifier.units == 3
    with pytest.raises(ValueError, match="labels has 2 names.*num_classes 3"):
        hub.save(model, tmp_path / "n", labels=["a", "b"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_push_uploads_the_saved_folder(saved, tmp_path, monkeypatch):
    import huggingface_hub

    model, _ = saved("llama", "causal_lm")
    calls = {}

    def create_repo(self, repo_id, **kw):
        calls["repo"] = repo_id

    def upload_folder(self, repo_id, folder_path, **kw):
        shutil.copytree(folder_path, tmp_path / "uploaded")
        calls["upload"] = repo_id

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    hub.push(model, "someone/tiny-llama")
    assert calls == {"repo": "someone/tiny-llama", "upload": "someone/tiny-llama"}
    assert sorted(os.listdir(tmp_path / "uploaded")) == ["config.json", "model.safetensors"]
    assert_same_weights(model, hub.load(tmp_path / "uploaded"))


def hf_cache(tmp_path, monkeypatch):
    import huggingface_hub

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_repo_id_resolves_from_the_cache_offline(saved, tmp_path, monkeypatch):
    cache = hf_cache(tmp_path, monkeypatch)
    model, folder = saved("bert", "backbone")
    repo = cache / "models--someone--tiny-bert"
    copied(folder, repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    assert_same_weights(model, hub.load("someone/tiny-bert"))


def test_hub_repo_id_without_network_or_cache_says_so(tmp_path, monkeypatch):
    hf_cache(tmp_path, monkeypatch)
    with pytest.raises(OSError, match="unreachable.*not in the local cache"):
        hub.load("someone/not-cached")


def test_pickle_only_folder_is_refused(saved, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hub.config_from_spec(saved("bert", "backbone")[0].spec,
                                                                          "backbone")))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(ValueError, match="pytorch_model.bin.*never unpickles.*safe_serialization=True"):
        hub.load(tmp_path)


def _edit(folder, fn):
    with safe_open(folder / "model.safetensors", framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    fn(tensors)
    save_file(tensors, folder / "model.safetensors")


def test_missing_unexpected_and_misshapen_tensors_are_named(saved, tmp_path):
    _, original = saved("bert", "backbone")
    folder = copied(original, tmp_path / "missing")
    _edit(folder, lambda t: t.pop("encoder.layer.1.output.dense.bias"))
    with pytest.raises(ValueError, match=r"Missing tensor 'encoder.layer.1.output.dense.bias'.*\(32,\)"):
        hub.load(folder)
    folder = copied(original, tmp_path / "unexpected")
    _edit(folder, lambda t: t.update({"encoder.layer.0.attention.self.rotary.weight": np.zeros(3, "float32")}))
    with pytest.raises(ValueError, match="Unexpected tensor 'encoder.layer.0.attention.self.rotary.weight'"):
        hub.load(folder)
    folder = copied(original, tmp_path / "misshapen")
    _edit(folder, lambda t: t.update({"encoder.layer.0.intermediate.dense.weight": np.zeros((60, 32), "float32")}))
    with pytest.raises(ValueError, match=r"'encoder.layer.0.intermediate.dense.weight'.*\(60, 32\).*\(64, 32\)"):
        hub.load(folder)


def test_unsupported_architecture_lists_the_supported_ones(saved, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*BertModel, BertForMaskedLM.*LlamaForCausalLM"):
        hub.load(tmp_path)
    config = hub.config_from_spec(saved("bert", "backbone")[0].spec, "backbone")
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_new"}))
    with pytest.raises(ValueError, match="gelu_new"):
        hub.load(tmp_path)


def test_registered_shapes_are_recognised():
    config = hub.config_from_spec(zoo.spec("dec-base"), "causal_lm")
    spec, task, _ = hub.spec_from_config(config)
    assert hub.match_registered(spec) == "dec-base" and task == "causal_lm"
    assert hub.match_registered(spec.replace(num_layers=3)) is None


# --- folders transformers wrote: parity in each config format ----------------------------
def fixture_inputs(expected, model):
    x = {"token_ids": expected["input_ids"].astype("int32"), "padding_mask": expected["attention_mask"].astype("int32")}
    if "segment_ids" in model.input:
        x["segment_ids"] = expected["token_type_ids"].astype("int32")
    if "mask_positions" in model.input:  # every position, to compare with transformers' full logits
        x["mask_positions"] = np.tile(np.arange(x["token_ids"].shape[1], dtype="int32"), (len(x["token_ids"]), 1))
    return x


def parity(model, folder):
    """Max |zoo - transformers| over real (unpadded) positions: (logits, last hidden states)."""
    expected = np.load(Path(folder) / "expected.npz", allow_pickle=False)
    x = fixture_inputs(expected, model)
    real = expected["attention_mask"].astype(bool)
    logits = np.asarray(model(x)["logits"])
    hidden = np.asarray(model.backbone({k: v for k, v in x.items() if k != "mask_positions"})["sequence_output"])
    return (float(np.abs(logits - expected["logits"])[real].max()),
            float(np.abs(hidden - expected["hidden"])[real].max()))


@pytest.mark.parametrize("name", ["llama-legacy", "llama-rope-parameters", "llama32", "bert-mlm"])
def test_transformers_folders_match_transformers_outputs(name, loaded):
    """Each folder was written by transformers' save_pretrained with its outputs beside it:
    top-level rope_theta (transformers 4 files), rope_parameters (transformers 5), llama3
    scaling with GQA, head_dim != hidden/heads and tied embeddings, and BertForMaskedLM
    (whose MLM logits pin the cls.predictions.transform layout)."""
    model = loaded(name)
    config = json.loads((FIXTURES / name / "config.json").read_text())
    assert model.task == ("masked_lm" if name.startswith("bert") else "causal_lm")
    if name.startswith("llama"):
        theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
        assert model.spec.rope_theta == theta != 10000.0
        assert model.spec.layer_norm_epsilon == config["rms_norm_eps"]
        assert model.spec.tie_embeddings is config["tie_word_embeddings"]
    logits, hidden = parity(model, FIXTURES / name)
    assert logits < 1e-4 and hidden < 1e-4, (logits, hidden)


@pytest.mark.parametrize("name", ["llama-legacy", "llama-rope-parameters", "llama32"])
def test_rotary_frequencies_are_transformers(name, loaded):
    """The inverse frequencies of every block are transformers' own (llama3 bands included)."""
    model = loaded(name)
    expected = np.load(FIXTURES / name / "expected.npz", allow_pickle=False)["inv_freq"]
    for block in model.backbone.blocks:
        ours = np.asarray(block.attention.rotary._get_inverse_freq(model.spec.head_dim))
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=0)


def test_llama3_decodes_with_the_cache_and_rebuilds_from_its_config(loaded):
    """Positions past the prompt go through the same scaled rotary layer (start_index), and a
    saved Keras config (the spec as a dict) rebuilds the scaling."""
    model = loaded("llama32")
    expected = np.load(FIXTURES / "llama32" / "expected.npz", allow_pickle=False)
    ids = expected["input_ids"][:1].astype("int32")
    cache = model.init_cache(1, ids.shape[1])
    first, _, cache = model.call_with_cache(ids[:, :30], cache, 0)
    rest, _, _ = model.call_with_cache(ids[:, 30:], cache, 30)
    stepwise = np.concatenate([np.asarray(first), np.asarray(rest)], axis=1)
    np.testing.assert_allclose(stepwise, expected["logits"][:1], atol=1e-4, rtol=0)
    rebuilt = type(model).from_config(json.loads(json.dumps(model.get_config())))
    assert rebuilt.spec == model.spec and rebuilt.spec.rope_scaling == model.spec.rope_scaling


def legacy_copy(tmp_path, name, edit):
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_llama3_in_the_legacy_rope_scaling_format(tmp_path):
    """Llama 3.2's own files: top-level rope_theta and "rope_scaling" (with `type` in older ones)."""

    def legacy(key):
        def edit(config):
            rope = config.pop("rope_parameters")
            config["rope_theta"] = rope.pop("rope_theta")
            config["rope_scaling"] = {**{k: v for k, v in rope.items() if k != "rope_type"}, key: "llama3"}
        return edit

    for key in ("rope_type", "type"):
        folder = legacy_copy(tmp_path, "llama32", legacy(key))
        model = hub.load(folder)
        assert dict(model.spec.rope_scaling)["factor"] == 32.0 and model.spec.rope_theta == 500000.0
        logits, _ = parity(model, folder)
        assert logits < 1e-4, (key, logits)
        shutil.rmtree(folder)


def test_rope_precedence_is_transformers(tmp_path):
    """As transformers 5: rope_scaling over rope_parameters, a top-level original_max_position_embeddings
    over the dict's, max_position_embeddings last."""
    from zoo.hub.llama import rope_from_config

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    base = {"max_position_embeddings": 512, "rope_theta": 1234.0}
    assert rope_from_config({**base, "rope_parameters": {"rope_type": "default"}}) == (1234.0, None)
    assert rope_from_config({"max_position_embeddings": 512}) == (10000.0, None)
    _, scaling = rope_from_config({**base, "rope_parameters": rope})
    assert scaling["original_max_position_embeddings"] == 512
    _, scaling = rope_from_config({**base, "rope_parameters": {**rope, "original_max_position_embeddings": 256}})
    assert scaling["original_max_position_embeddings"] == 256
    _, scaling = rope_from_config({**base, "original_max_position_embeddings": 128,
                                   "rope_parameters": {**rope, "original_max_position_embeddings": 256}})
    assert scaling["original_max_position_embeddings"] == 128
    theta, scaling = rope_from_config({**base, "rope_scaling": rope,
                                       "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}})
    assert (theta, scaling["factor"]) == (1234.0, 8.0)


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "longrope"])
@pytest.mark.parametrize("where", ["rope_parameters", "rope_scaling"])
def test_other_rope_types_are_refused_by_name(tmp_path, rope_type, where):
    def edit(config):
        config.pop("rope_parameters")
        config[where] = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}

    folder = legacy_copy(tmp_path, "llama-rope-parameters", edit)
    with pytest.raises(ValueError, match=f"rope_type='{rope_type}' is not supported.*'default' and 'llama3'"):
        hub.load(folder)


def test_saved_config_is_transformers_5_and_reloads(saved, loaded, tmp_path):
    """zoo writes rope_parameters as transformers 5 does (plus the transformers 4 keys, which
    transformers 5 reads without a warning: tools/make_hf_fixtures.py check), and reloads it exactly."""
    model = loaded("llama32")
    folder = hub.save(model, tmp_path / "again")
    config = json.loads((folder / "config.json").read_text())
    original = json.loads((FIXTURES / "llama32" / "config.json").read_text())
    assert config["rope_parameters"] == original["rope_parameters"]
    assert config["rope_theta"] == 500000.0 and "rope_theta" not in config["rope_scaling"]
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    for key in ("head_dim", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "num_key_value_heads"):
        assert config[key] == original[key], key
    again = hub.load(folder)
    assert again.spec == model.spec.replace(description=again.spec.description)
    assert_same_weights(model, again)
    config = json.loads((saved("llama", "causal_lm")[1] / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0}
    assert config["rope_scaling"] is None


# --- GGUF: llama.cpp's Q/K permutation, checked against transformers ---------------------
def write_gguf(folder, path):
    """A float32 llama GGUF of a Hugging Face Llama folder, as llama.cpp's converter lays it out."""
    import gguf

    config = json.loads((Path(folder) / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    # a byte-level BPE vocabulary of the model's size: the end-of-text token, 94 characters, 33 merges
    merges = [f"{chr(97 + i)} {chr(98 + i)}" for i in range(25)] + [f"{chr(65 + i)} {chr(66 + i)}" for i in range(8)]
    tokens = ["<|endoftext|>"] + [chr(c) for c in range(33, 127)] + [m.replace(" ", "") for m in merges]
    assert len(tokens) == config["vocab_size"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (len(tokens) - 1))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    with safe_open(Path(folder) / "model.safetensors", framework="numpy") as f:
        for key in f.keys():
            weight = f.get_tensor(key)
            if key.startswith("model.layers."):
                layer, rest = key[len("model.layers."):].split(".", 1)
                part, kind = rest.rsplit(".", 1)
                if part == "self_attn.q_proj":
                    weight = llama_cpp_permute(weight, heads)
                elif part == "self_attn.k_proj":
                    weight = llama_cpp_permute(weight, kv_heads)
                name = f"blk.{layer}.{names[part]}.{kind}"
            else:
                name = names[key]
            writer.add_tensor(name, np.ascontiguousarray(weight, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_conversion_matches_transformers(tmp_path):
    """transformers' tiny Llama (GQA: 4 query heads, 2 KV heads) written as llama.cpp writes GGUF
    (Q/K rows permuted), converted back by zoo: logits equal transformers' own, so convert_gguf's
    un-permutation is checked against an independent reference, not against its own output."""
    folder = hub.convert_gguf(write_gguf(FIXTURES / "llama-rope-parameters", tmp_path / "tiny.gguf"),
                              tmp_path / "converted")
    model = hub.load(folder)
    assert isinstance(model.tokenizer, keras_hub.tokenizers.BytePairTokenizer)
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    logits, hidden = parity(model, FIXTURES / "llama-rope-parameters")
    assert logits < 1e-4 and hidden < 1e-4, (logits, hidden)
