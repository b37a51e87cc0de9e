"""PEFT interchange against adapters Hugging Face PEFT itself wrote (tests/fixtures/peft, made by
tools/make_peft_fixtures.py): zoo's outputs with the adapter equal PEFT's to 1e-5 (and after
merging, PEFT's merge_and_unload), save_adapter writes the very tensors PEFT wrote, an adapter
trained here reloads exactly, and a wrong base or an unsupported adapter is refused by name."""

import json
import shutil

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import zoo
from tests.common import REPO
from zoo import hub, lora, quantization
from zoo.hub import peft

FIXTURES = REPO / "tests" / "fixtures" / "peft"
# fixture -> [(PEFT's output name in expected.npz, zoo's output)]
OUTPUTS = {"llama": [("logits", "logits")], "bert": [("hidden", "sequence_output"), ("pooled", "pooled_output")],
           "bert-cls": [("logits", "logits")]}


def fixture(name):
    expected = dict(np.load(FIXTURES / name / "expected.npz", allow_pickle=False))
    x = {"token_ids": expected["input_ids"].astype("int32"), "padding_mask": expected["attention_mask"].astype("int32")}
    if "token_type_ids" in expected:
        x["segment_ids"] = expected["token_type_ids"].astype("int32")
    return x, expected


def differences(model, x, expected, prefix):
    """max |zoo - PEFT| per output, over real (unpadded) positions."""
    real = x["padding_mask"].astype(bool)
    outputs = model(x)
    result = {}
    for theirs, ours in OUTPUTS[model_name(model)]:
        got, want = outputs[ours].numpy(), expected[f"{prefix}_{theirs}"]
        result[theirs] = float(np.abs(got[real] - want[real]).max() if got.ndim == 3 else np.abs(got - want).max())
    return result


def model_name(model):
    return {"causal_lm": "llama", "backbone": "bert", "classifier": "bert-cls"}[model.task]


@pytest.mark.parametrize("name", OUTPUTS)
def test_outputs_and_saved_tensors_equal_peft_with_the_adapter_and_merged(name, tmp_path, capsys):
    """One load per fixture: save_adapter writes back the tensors PEFT wrote, the outputs with the adapter
    equal PEFT's, and after merge_lora PEFT's merge_and_unload."""
    x, expected = fixture(name)
    model = hub.load(FIXTURES / name / "base", adapter=FIXTURES / name / "adapter")
    hub.save_adapter(model, tmp_path / "out")
    with safe_open(FIXTURES / name / "adapter" / peft.WEIGHTS, "numpy") as theirs, \
            safe_open(tmp_path / "out" / peft.WEIGHTS, "numpy") as ours:
        assert sorted(ours.keys()) == sorted(theirs.keys())
        for key in theirs.keys():
            np.testing.assert_array_equal(ours.get_tensor(key), theirs.get_tensor(key), err_msg=key)
        assert ours.metadata() == theirs.metadata() == {"format": "pt"}
    theirs, ours = (json.loads((folder / peft.CONFIG).read_text()) for folder in (FIXTURES / name / "adapter",
                                                                                 tmp_path / "out"))
    assert sorted(ours["target_modules"]) == sorted(theirs["target_modules"])
    assert ours["r"] == theirs["r"] and ours["task_type"] == theirs["task_type"]
    assert lora_scale(ours) == lora_scale(theirs)
    assert set(ours["modules_to_save"] or []) <= set(theirs["modules_to_save"] or [])
    with pytest.raises(FileExistsError):
        hub.save_adapter(model, tmp_path / "out")

    adapted = differences(model, x, expected, "peft")
    effect = max(np.abs(expected[f"peft_{k}"] - expected[f"base_{k}"]).max() for k, _ in OUTPUTS[name])
    lora.merge_lora(model)
    merged = differences(model, x, expected, "merged")
    with capsys.disabled():
        print(f"\n{name}: max |zoo - PEFT| {adapted}, merged {merged} (the adapter moves them by {effect:.3f})")
    assert effect > 0.1  # the adapter matters: equal outputs are not the base's
    assert max(adapted.values()) <= 1e-5 and max(merged.values()) <= 1e-5


def test_loaded_adapter_has_peft_ranks_scaling_and_trainable_state():
    model = hub.load(FIXTURES / "bert-cls" / "base", adapter=FIXTURES / "bert-cls" / "adapter")
    layers = lora.adapters(model)
    assert sorted(layers) == sorted(f"bert.encoder.layer.{i}.attention.self.{m}" for i in range(2)
                                    for m in ("query", "value"))
    # rsLoRA: PEFT's scaling lora_alpha / sqrt(r) = 6 / 2 is Keras' lora_alpha / rank = 12 / 4
    assert {(layer.lora_rank, layer.lora_alpha) for layer in layers.values()} == {(4, 12.0)}
    trainable = {v.path for v in model.trainable_variables}
    assert trainable == {v.path for v in model.weights if "lora_kernel" in v.path} | {"classifier/kernel",
                                                                                      "classifier/bias"}


def lora_scale(config):
    return config["lora_alpha"] / (np.sqrt(config["r"]) if config["use_rslora"] else config["r"])


def test_an_adapter_made_here_reloads_exactly_onto_the_base(tmp_path):
    """Adapters on two kinds of projection, with random non-zero factors, saved and loaded onto a
    fresh base: the same outputs. (A run's adapter, trained by fit, reloads in tests/recipes/test_lora_runs.py.)"""
    base = FIXTURES / "llama" / "base"
    model = hub.load(base)
    x, _ = fixture("llama")
    without = model(x)["logits"].numpy()
    lora.enable_lora(model, rank=2, alpha=5, targets=["o_proj", "mlp.down_proj"])
    rng = np.random.default_rng(0)
    for layer in lora.adapters(model).values():
        layer.lora_kernel_b.assign(rng.normal(0, 0.1, layer.lora_kernel_b.shape).astype("float32"))
    hub.save_adapter(model, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / peft.CONFIG).read_text())
    assert config["target_modules"] == ["down_proj", "o_proj"] and (config["r"], config["lora_alpha"]) == (2, 5)
    again = hub.load(base, adapter=tmp_path / "adapter")
    expected = model(x)["logits"].numpy()
    assert np.abs(expected - without).max() > 0.01  # the adapter matters
    np.testing.assert_array_equal(again(x)["logits"].numpy(), expected)


def copy_adapter(tmp_path, name="llama", **changes):
    folder = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(FIXTURES / name / "adapter", folder)
    config = json.loads((folder / peft.CONFIG).read_text())
    (folder / peft.CONFIG).write_text(json.dumps({**config, **changes}))
    return folder


def test_an_adapter_for_another_base_is_refused_by_name():
    adapter = FIXTURES / "llama" / "adapter"
    shape = dict(num_layers=2, hidden_dim=32, num_heads=4, intermediate_dim=64, vocab_size=128)
    with pytest.raises(ValueError, match=r"down_proj\.lora_B\.weight' has shape \(32, 4\); this model needs \(48, 4\): "
                                         r"the adapter's output width 32, where this model has 48 \(hidden_dim"):
        peft.load_adapter(zoo.get("dec-base", **{**shape, "hidden_dim": 48, "num_kv_heads": 2}), adapter)
    with pytest.raises(ValueError, match=r"k_proj\.lora_B\.weight' has shape \(16, 4\); this model needs \(32, 4\): "
                                         r"the adapter's output width 16, where this model has 32 "
                                         r"\(hidden_dim or num_heads × head_dim or num_kv_heads × head_dim\)"):
        peft.load_adapter(zoo.get("dec-base", **{**shape, "num_kv_heads": 4}), adapter)
    with pytest.raises(ValueError, match=r"adapts 'model\.layers\.1\.mlp\.down_proj', which this model does not "
                                         r"have \(num_layers=1\)"):
        peft.load_adapter(zoo.get("dec-base", **{**shape, "num_layers": 1, "num_kv_heads": 2}), adapter)
    with pytest.raises(ValueError, match=r"Unexpected tensor 'base_model\.model\.classifier\.(weight|bias)'.*"
                                         r"neither a LoRA factor nor a head of this backbone"):
        peft.load_adapter(zoo.get("enc-mini", **shape), FIXTURES / "bert-cls" / "adapter")  # a head it lacks


def test_unsupported_adapters_and_misuse_are_refused(tmp_path):
    base = FIXTURES / "llama" / "base"
    model = hub.load(base)  # each refusal comes before the model is touched
    with pytest.raises(ValueError, match=r"use_dora=True is not supported \(DoRA"):
        peft.load_adapter(model, copy_adapter(tmp_path, use_dora=True))
    with pytest.raises(ValueError, match="bias='all' trains the base model's biases"):
        peft.load_adapter(model, copy_adapter(tmp_path, bias="all"))
    with pytest.raises(ValueError, match="is a 'IA3' adapter"):
        peft.load_adapter(model, copy_adapter(tmp_path, peft_type="IA3"))
    with pytest.raises(ValueError, match=r"has rank 4, but adapter_config.json says r=8 .*\(fields r / rank_pattern\)"):
        peft.load_adapter(model, copy_adapter(tmp_path, r=8))
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        hub.load(base, adapter=tmp_path)  # before the base is built
    pickled = copy_adapter(tmp_path)
    (pickled / peft.WEIGHTS).rename(pickled / "adapter_model.bin")
    with pytest.raises(FileNotFoundError, match="PyTorch pickle zoo never unpickles"):
        peft.load_adapter(model, pickled)
    only_a = copy_adapter(tmp_path)
    with safe_open(only_a / peft.WEIGHTS, "numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if "layers.0.self_attn.q_proj.lora_B" not in k}
    save_file(tensors, only_a / peft.WEIGHTS)
    with pytest.raises(ValueError, match="holds only lora_A for 'model.layers.0.self_attn.q_proj'"):
        peft.load_adapter(model, only_a)
    assert not lora.has_lora(model) and all(v.trainable for v in model.weights if "seed" not in v.path)
    with pytest.raises(ValueError, match="no LoRA adapters to save"):
        hub.save_adapter(model, tmp_path / "none")
    peft.load_adapter(model, FIXTURES / "llama" / "adapter")
    with pytest.raises(ValueError, match="already has LoRA"):
        peft.load_adapter(model, FIXTURES / "llama" / "adapter")
    with pytest.raises(ValueError, match=r"Cannot save Hugging Face weights of a model with LoRA adapters: "
                                         r"merge_lora\(\) first"):
        hub.save(model, tmp_path / "hf")
    lora.merge_lora(model)
    quantization.quantize_base(model, "int8")
    with pytest.raises(ValueError, match="Cannot save Hugging Face weights of a quantized model"):
        hub.save(model, tmp_path / "hf")
