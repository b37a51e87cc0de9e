"""LoRA recipes (`zoo train --weights BASE --lora-rank R --quantize int8`): the run folder keeps
only the adapters and a fingerprinted reference to the base, its checkpoints only the trainable
and optimizer variables; a run interrupted inside a checkpoint write (in-process; the real
SIGKILL: test_resume.py) resumes bitwise equal; the run loads for
eval/generate (quantized, as trained) and merged for export / Hugging Face weights; --hf-out
writes a PEFT adapter folder; every refusal names the fix."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import recipes
import zoo
from recipes import state
from tests.recipes.test_pretrained import ONE_BLOCK_DEC, pretrained
from tests.recipes.test_resume import final_state, run_interrupted_at_step_4
from zoo import lora
from zoo.loading import ADAPTER_DIR, BASE_FILE, MODEL_FILE, check_base, load

STEPS = 4  # a checkpoint every 2: the interrupted run dies writing the last one, and resumes from step 2
LORA = dict(lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj,down_proj", quantize="int8")


@pytest.fixture(scope="module")
def base(recipes_vocab, tmp_path_factory):
    return pretrained("dec-base", "llama", ONE_BLOCK_DEC, 2, recipes_vocab, tmp_path_factory)


def make_recipe(base):
    return recipes.get(weights=str(base), batch_size=4, sequence_length=16, steps=STEPS, warmup_steps=1,
                       log_every=2, checkpoint_every=2, keep_checkpoints=3, shuffle_buffer=16, learning_rate=1e-2,
                       checkpointing="none", precision="float32", **LORA)


@pytest.fixture(scope="module")
def run(base, recipes_news, tmp_path_factory):
    """The uninterrupted LoRA run on an int8 base, with its PEFT folder: (out_dir, result, hf_out)."""
    out, hf_out = tmp_path_factory.mktemp("lora-run"), tmp_path_factory.mktemp("peft") / "adapter"
    result = recipes.run(make_recipe(base), recipes_news, str(out), column="text", verbose=0, hf_out=str(hf_out))
    return out, result, hf_out


def test_the_run_keeps_only_adapters_and_a_reference_to_the_base(run, base):
    out, result, hf_out = run
    losses = [row["loss"] for row in result.history]
    assert len(losses) == 2 and losses[-1] < losses[0]
    assert not (out / MODEL_FILE).exists() and (out / ADAPTER_DIR / "adapter_config.json").is_file()
    record = json.loads((out / BASE_FILE).read_text())
    assert record["weights"] == str(base.resolve()) and record["quantize"] == "int8" and len(record["sha256"]) == 64
    step, folder = state.checkpoints(str(out))[-1]
    saved = json.loads(open(f"{folder}/state.json").read())
    assert step == STEPS and saved["base"] == record
    # 1 layer x 3 projections x (A, B), and the dropout seed states: no frozen kernel
    kept = [p for p in saved["model_variables"] if not p.endswith("seed_generator_state")]
    assert len(kept) == 6 and all("lora_kernel" in p for p in kept), kept
    arrays = load_file(f"{folder}/model.safetensors")
    trained = {v.path: np.asarray(v) for v in result.model.trainable_variables}
    for i, path in enumerate(saved["model_variables"]):
        if path in trained:
            np.testing.assert_array_equal(arrays[f"{i:05d}"], trained[path])
    config = json.loads((hf_out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 8.0, str(base.resolve()))
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    assert (hf_out / "tokenizer.json").is_file() or any(hf_out.glob("tokenizer*"))


def test_an_interrupted_lora_run_resumes_bitwise_equal(run, base, recipes_news, tmp_path, capsys):
    killed = tmp_path / "killed"
    run_interrupted_at_step_4(lambda: recipes.run(make_recipe(base), recipes_news, str(killed), column="text",
                                                  verbose=0), killed)
    capsys.readouterr()
    resumed = recipes.run(make_recipe(base), recipes_news, str(killed), column="text", verbose=0)
    assert "from step 2" in capsys.readouterr().out and (resumed.start_step, resumed.step) == (2, STEPS)
    (step, got), (ref_step, expected) = final_state(killed), final_state(run[0])
    assert step == ref_step == STEPS and sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def logits(model, seed=0):
    rng = np.random.default_rng(seed)
    x = {"token_ids": rng.integers(1, 512, (2, 12)).astype("int32"), "padding_mask": np.ones((2, 12), "int32")}
    return np.asarray(model(x, training=False)["logits"])


def test_the_run_loads_as_trained_and_merged_for_export(run, base):
    out, result, hf_out = run
    trained = load(str(out))  # zoo eval / zoo generate: the int8 base with the adapters, as it trained
    assert trained.tokenizer is not None and lora.has_lora(trained)
    np.testing.assert_array_equal(logits(trained), logits(result.model))
    merged = load(str(out), merge=True)  # zoo export, and --hf-out with --merge: plain float kernels
    assert not lora.has_lora(merged) and not any(getattr(la, "quantization_mode", None)
                                                 for la in merged._flatten_layers())
    float_base = zoo.hub.load(str(base), adapter=str(hf_out), tokenizer=False)  # what PEFT would build
    np.testing.assert_allclose(logits(merged), logits(float_base), atol=1e-5)


def test_lora_settings_are_refused_with_the_fix(base, run, recipes_news, tmp_path):
    with pytest.raises(ValueError, match=r"trains nothing without LoRA.*--lora-rank"):
        make_recipe(base).replace(lora_rank=None, lora_alpha=None, lora_targets=None)
    with pytest.raises(ValueError, match="lora_rank must be a positive whole number, got 0"):
        make_recipe(base).replace(lora_rank=0)
    with pytest.raises(ValueError, match=r"Unknown LoRA target 'qkv' for a llama model; known: q_proj, k_proj"):
        make_recipe(base).replace(lora_targets="q_proj,qkv")
    with pytest.raises(ValueError, match="fused update is not combined with LoRA"):
        make_recipe(base).replace(fused=True, checkpointing="full")
    with pytest.raises(ValueError, match="pass weights="):  # a recipe may hold LoRA settings; a run needs the base
        recipes.run(recipes.get("dec-base", lora_rank=4), recipes_news, str(tmp_path / "no-base"), column="text")
    assert not (tmp_path / "no-base").exists()
    with pytest.raises(ValueError, match="holds LoRA adapters, not a base model.*--merge"):
        recipes.get(weights=str(run[2]), lora_rank=4)
    record = {**json.loads((run[0] / BASE_FILE).read_text()), "sha256": "0" * 64}
    with pytest.raises(ValueError, match="base weights at .* changed since the LoRA adapters were trained"):
        check_base(record)
    with pytest.raises(ValueError, match=r"merge \(--merge\).*needs lora_rank"):
        recipes.run(make_recipe(base).replace(**{k: None for k in LORA}), recipes_news, str(tmp_path / "x"),
                    column="text", hf_out=str(tmp_path / "hf"), merge=True)
