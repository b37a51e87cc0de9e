"""Tiny LoRA adapters written by Hugging Face PEFT itself, with PEFT's own outputs, for
`tests/zoo/test_lora_peft.py` (which has neither torch, transformers nor PEFT).

Two fixtures under `tests/fixtures/peft/<name>/`:
  base/          the base model, `save_pretrained(safe_serialization=True)` (zoo.hub.load reads it)
  adapter/       `PeftModel.save_pretrained`: adapter_config.json + adapter_model.safetensors
  expected.npz   the inputs and, from the folders reloaded by transformers + PEFT: the adapted
                 model's outputs, the outputs after `merge_and_unload()` and the base's outputs
                 (`disable_adapter()`), so that a test can see that the adapter matters.

  llama  LlamaForCausalLM, grouped-query attention (k/v narrower than q), untied head; LoRA on all
         seven projections (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj), r=4, lora_alpha=12
         (scaling 3). Outputs: the logits.
  bert   BertModel (the issue names BertModel for the adapter format); LoRA on query, key, value and
         every `dense` (attention.output.dense, intermediate.dense, output.dense and pooler.dense: PEFT's
         suffix rule), r=8, lora_alpha=4 (scaling 0.5). Outputs: last_hidden_state and pooler_output.
  bert-cls  BertForSequenceClassification (3 labels) with PEFT's SEQ_CLS defaults: LoRA on query and
         value, the classifier trained in full (modules_to_save), and rsLoRA (use_rslora: scaling
         lora_alpha / sqrt(r) = 6 / 2 = 3). Outputs: the logits.

The base is randomised as tools/make_hf_fixtures.py does; every lora_A and lora_B is drawn again
(N(0, 0.1)): PEFT's default puts B at zero, which would make any adapter reader look right.

    /tmp/hfvenv/bin/python tools/make_peft_fixtures.py make                 # writes tests/fixtures/peft/
    # the other direction: zoo loads each adapter and writes it with zoo.hub.save_adapter; PEFT must load
    # that folder onto the base with no warning and reproduce expected.npz
    python tools/make_peft_fixtures.py resave /tmp/zoo-adapters              # keras-zoo's venv
    /tmp/hfvenv/bin/python tools/make_peft_fixtures.py check /tmp/zoo-adapters
"""

import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "peft"
SEED = 2121

sys.path.insert(0, str(REPO))
from tools.make_hf_fixtures import inputs, main, randomise, transformers_warnings  # noqa: E402

# name -> (transformers class, config arguments, LoraConfig arguments, sequence length)
FIXTURES = {
    "llama": ("LlamaForCausalLM",
              dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, hidden_act="silu", max_position_embeddings=256, rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                   bos_token_id=1, eos_token_id=2),
              dict(r=4, lora_alpha=12, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                       "down_proj"], task_type="CAUSAL_LM"),
              24),
    "bert": ("BertModel",
             dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
             dict(r=8, lora_alpha=4, target_modules=["query", "key", "value", "dense"], task_type="FEATURE_EXTRACTION"),
             12),
    "bert-cls": ("BertForSequenceClassification",
                 dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3),
                 dict(r=4, lora_alpha=6, use_rslora=True, task_type="SEQ_CLS"),
                 12),
}


def outputs(model, x):
    """What the model computes on `x`: logits (causal LM) or last hidden states and pooled output."""
    import torch

    tensors = {k: torch.tensor(v) for k, v in x.items()}
    with torch.no_grad():
        out = model(**tensors)
    if hasattr(out, "logits"):
        return {"logits": out.logits.float().numpy()}
    return {"hidden": out.last_hidden_state.float().numpy(), "pooled": out.pooler_output.float().numpy()}


def randomise_adapter(model, seed):
    """Every lora_A / lora_B drawn N(0, 0.1), so that B is not zero and A is not PEFT's init, and a
    modules_to_save copy too, so that it differs from the base's head."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)


def load(name, folder, adapter):
    """The base folder reloaded by transformers and `adapter` by PEFT: what the folders mean to them."""
    import transformers
    from peft import PeftModel

    cls_name = FIXTURES[name][0]
    base = getattr(transformers, cls_name).from_pretrained(folder / "base", attn_implementation="eager")
    model = PeftModel.from_pretrained(base, adapter)
    model.eval()
    return model


def expected(name, model, x):
    result = {f"peft_{k}": v for k, v in outputs(model, x).items()}
    with model.disable_adapter():
        result.update({f"base_{k}": v for k, v in outputs(model, x).items()})
    merged = model.merge_and_unload()
    result.update({f"merged_{k}": v for k, v in outputs(merged, x).items()})
    return result


def make(root=ROOT):
    if os.environ.get("PYTHONHASHSEED") != "0":  # PEFT writes target_modules from a set: fix its order
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(SEED)
    for i, (name, (cls_name, args, lora, length)) in enumerate(FIXTURES.items()):
        config_cls = transformers.LlamaConfig if cls_name.startswith("Llama") else transformers.BertConfig
        model = getattr(transformers, cls_name)(config_cls(**args, architectures=[cls_name]))
        randomise(model, SEED + i)
        model.eval()
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder / "base", safe_serialization=True)
        (folder / "base" / "generation_config.json").unlink(missing_ok=True)
        peft_model = get_peft_model(model, LoraConfig(**lora, lora_dropout=0.0, init_lora_weights=False))
        randomise_adapter(peft_model, SEED + 100 + i)
        peft_model.save_pretrained(folder / "adapter")
        (folder / "adapter" / "README.md").unlink(missing_ok=True)  # PEFT's model-card stub
        x = inputs(name, length)
        result = expected(name, load(name, folder, folder / "adapter"), x)
        np.savez(folder / "expected.npz", **x, **result)
        key = "logits" if "peft_logits" in result else "hidden"
        moved = np.abs(result[f"peft_{key}"] - result[f"base_{key}"]).max()
        print(f"{name}: adapter moves {key} by up to {moved:.3f}; "
              f"{sum(f.stat().st_size for f in folder.rglob('*') if f.is_file()) / 1024:.0f} KiB -> {folder}")


def resave(out):
    """keras-zoo side of the round trip: zoo.hub.load(base, adapter=...), then zoo.hub.save_adapter to out/<name>."""
    from zoo import hub

    for name in FIXTURES:
        model = hub.load(ROOT / name / "base", adapter=ROOT / name / "adapter")
        hub.save_adapter(model, Path(out) / name, overwrite=True)
        print("saved", Path(out) / name)


def check(out):
    """PEFT side: load what zoo saved onto each base, with no warning, and reproduce expected.npz.
    Prints a table and one JSON line."""
    rows = {}
    for name in FIXTURES:
        with transformers_warnings() as found:
            model = load(name, ROOT / name, Path(out) / name)
        reference = np.load(ROOT / name / "expected.npz", allow_pickle=False)
        x = {k: reference[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in reference}
        got = outputs(model, x)
        real = x["attention_mask"].astype(bool)
        diffs = {k: float(np.abs(v - reference[f"peft_{k}"])[real].max() if v.ndim == 3 else
                          np.abs(v - reference[f"peft_{k}"]).max()) for k, v in got.items()}
        rows[name] = {"warnings": found, "max_abs_diff": diffs}
    print(f"{'fixture':8} {'warnings':>8}  max |diff| to PEFT's own adapter")
    for name, row in rows.items():
        print(f"{name:8} {len(row['warnings']):8d}  {row['max_abs_diff']}")
    print(json.dumps(rows))
    ok = all(not r["warnings"] and max(r["max_abs_diff"].values()) < 1e-5 for r in rows.values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main(make, resave, check, __doc__)
