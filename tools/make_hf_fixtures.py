"""Tiny Hugging Face folders written by transformers itself, with transformers'
own outputs, for `tests/zoo/test_hub.py` (which has neither torch nor transformers).

Every fixture is a randomly initialised model (fixed seed, every parameter drawn
again with a spread large enough that a transposed or swapped tensor shows),
saved with `save_pretrained(safe_serialization=True)` into `tests/fixtures/hf/<name>/`
next to `expected.npz`: the input ids, the attention mask, transformers' logits and
last hidden states on them, and (Llama) the rotary inverse frequencies it uses.
`expected.npz` holds plain arrays only (`np.load(..., allow_pickle=False)` reads it).

    # a throwaway venv: torch and transformers are not keras-zoo dependencies
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch==2.13.0 transformers safetensors numpy
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py make               # writes tests/fixtures/hf/

    # the other direction: zoo loads each fixture and saves it again; transformers must
    # load that folder with no warning and no missing/unexpected tensor, and compute expected.npz
    python tools/make_hf_fixtures.py resave /tmp/zoo-saved               # keras-zoo's venv
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py check /tmp/zoo-saved
"""

import contextlib
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
SEED = 1234

LLAMA = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             hidden_act="silu", max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
# name -> (transformers class, config arguments, how config.json is written, sequence length)
FIXTURES = {
    # transformers-4 era file: top-level rope_theta, "rope_scaling": null (config.json rewritten after saving)
    "llama-legacy": ("LlamaForCausalLM", dict(LLAMA, num_key_value_heads=4, rms_norm_eps=1e-5,
                                              rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                              tie_word_embeddings=False), "legacy", 40),
    # as transformers 5 writes it: "rope_parameters": {"rope_theta": ..., "rope_type": "default"}
    "llama-rope-parameters": ("LlamaForCausalLM", dict(LLAMA, num_key_value_heads=2, rms_norm_eps=1e-2,
                                                       rope_parameters={"rope_type": "default",
                                                                        "rope_theta": 500000.0},
                                                       tie_word_embeddings=False), "transformers", 40),
    # Llama 3.2 style: llama3 frequency scaling, grouped-query attention, head_dim != hidden/heads, tied head.
    # original_max_position_embeddings is 64 (8192 in Llama 3.2) so that, at head_dim 16, the 8 frequencies
    # fall in all three llama3 bands (kept, smoothed, divided by factor) within a 40-token input.
    "llama32": ("LlamaForCausalLM", dict(LLAMA, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                          "factor": 32.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 64},
                                         tie_word_embeddings=True), "transformers", 40),
    # BertForMaskedLM: the masked-LM head (cls.predictions.transform) is compared through its logits
    "bert-mlm": ("BertForMaskedLM", dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                                         hidden_act="gelu", layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0), "transformers", 12),
}


def inputs(name, length):
    """Fixed ids (a fresh generator per fixture), the second row right-padded by 3."""
    rng = np.random.default_rng(sum(map(ord, name)))
    ids = rng.integers(3, 128, (2, length)).astype("int64")
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    x = {"input_ids": ids, "attention_mask": mask}
    if name.startswith("bert"):
        x["token_type_ids"] = np.zeros_like(ids)
        x["token_type_ids"][:, length // 2:] = 1
    return x


def outputs(model, x):
    """transformers' logits and last hidden states (after Llama's final norm), and the Llama rotary
    inverse frequencies."""
    import torch

    tensors = {k: torch.tensor(v) for k, v in x.items()}
    base = model.model if hasattr(model, "model") else model.bert
    with torch.no_grad():
        result = {"logits": model(**tensors).logits.float().numpy(),
                  "hidden": base(**tensors).last_hidden_state.float().numpy()}
    if hasattr(base, "rotary_emb"):
        result["inv_freq"] = base.rotary_emb.inv_freq.float().numpy()
    return result


def randomise(model, seed):
    """Every parameter drawn again: norms near 1, everything else N(0, 0.2), so that no tensor is
    near-symmetric or near-zero and a layout mistake moves the outputs far beyond 1e-4."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            is_norm = "norm" in name.lower() and name.endswith("weight")
            parameter.copy_(noise + (1.0 if is_norm else 0.0))


def to_legacy(folder):
    """Rewrite a transformers-5 config.json the way transformers 4 wrote it."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    config["torch_dtype"] = config.pop("dtype", "float32")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make(root=ROOT):
    import torch
    import transformers

    torch.manual_seed(SEED)
    for i, (name, (cls_name, args, style, length)) in enumerate(FIXTURES.items()):
        cls = getattr(transformers, cls_name)
        config_cls = transformers.LlamaConfig if cls_name.startswith("Llama") else transformers.BertConfig
        model = cls(config_cls(**args, architectures=[cls_name]))
        randomise(model, SEED + i)
        model.eval()
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        if style == "legacy":
            to_legacy(folder)
        reloaded = cls.from_pretrained(folder, attn_implementation="eager")  # what the folder means to transformers
        reloaded.eval()
        x = inputs(name, length)
        expected = outputs(reloaded, x)
        if "inv_freq" in expected and name == "llama32":
            default = 1.0 / (500000.0 ** (np.arange(0, 16, 2) / 16))
            bands = np.isclose(expected["inv_freq"], default), np.isclose(expected["inv_freq"], default / 32)
            assert bands[0].any() and bands[1].any() and not (bands[0] | bands[1]).all(), "not all llama3 bands"
        np.savez(folder / "expected.npz", **x, **expected)
        (folder / "generation_config.json").unlink(missing_ok=True)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"{sum(f.stat().st_size for f in folder.iterdir()) / 1024:.0f} KiB -> {folder}")


def resave(out):
    """keras-zoo side of the round trip: zoo.hub.load each fixture, zoo.hub.save it to out/<name>."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from zoo import hub

    for name in FIXTURES:
        hub.save(hub.load(ROOT / name), Path(out) / name, overwrite=True)
        print("saved", Path(out) / name)


@contextlib.contextmanager
def transformers_warnings():
    """Yield a list that receives every warning transformers logs, or Python raises, inside the block
    (deprecation notices aside: transformers 5.24 raises some from inside PEFT that say nothing of a file)."""
    import transformers

    transformers.logging.set_verbosity_warning()
    found = []

    class Collect(logging.Handler):
        def emit(self, record):
            found.append(record.getMessage())

    handler = Collect(logging.WARNING)
    transformers.logging.get_logger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        transformers.logging.get_logger().removeHandler(handler)
    found += [str(w.message) for w in caught if not issubclass(w.category, (FutureWarning, DeprecationWarning))]


def check(out):
    """transformers side: load what zoo saved, with no warning and no missing or unexpected tensor,
    and reproduce the fixture's expected.npz. Prints a table and one JSON line."""
    import transformers

    rows = {}
    for name, (cls_name, _, _, _) in FIXTURES.items():
        with transformers_warnings() as found:
            model, info = getattr(transformers, cls_name).from_pretrained(
                Path(out) / name, output_loading_info=True, attn_implementation="eager")
        model.eval()
        expected = np.load(ROOT / name / "expected.npz", allow_pickle=False)
        x = {k: expected[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in expected}
        got = outputs(model, x)
        real = x["attention_mask"].astype(bool)
        rows[name] = {
            "warnings": found,
            "loading_info": {k: sorted(map(str, v)) for k, v in info.items() if v},
            "max_abs_logits": float(np.abs(got["logits"] - expected["logits"])[real].max()),
        }
    print(f"{'fixture':24} {'warnings':>8} {'load issues':>11} {'max |logits diff|':>18}")
    for name, row in rows.items():
        print(f"{name:24} {len(row['warnings']):8d} {len(row['loading_info']):11d} {row['max_abs_logits']:18.2e}")
    print(json.dumps(rows))
    ok = all(not r["warnings"] and not r["loading_info"] and r["max_abs_logits"] < 1e-4 for r in rows.values())
    sys.exit(0 if ok else 1)


def main(make, resave, check, doc):
    """`make` (default), `resave OUT` or `check OUT`, from the command line."""
    command = sys.argv[1] if len(sys.argv) > 1 else "make"
    if command == "make":
        make()
    elif command in ("resave", "check") and len(sys.argv) == 3:
        (resave if command == "resave" else check)(sys.argv[2])
    else:
        sys.exit(doc)


if __name__ == "__main__":
    main(make, resave, check, __doc__)
