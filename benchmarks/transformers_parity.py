"""Do Hugging Face transformers accept what `zoo.hub.save` writes, and compute the same?

Two halves, because TensorFlow and torch rarely share a machine:

    python benchmarks/transformers_parity.py write DIR [--real]  # zoo: save models + inputs + zoo outputs
    python benchmarks/transformers_parity.py check DIR           # transformers: from_pretrained and compare

`--real` adds all-MiniLM-L6-v2 and SmolLM2-135M (the docs/assets.md weights, loaded
by zoo and saved again by zoo) to the tiny random models.

`check` needs torch and transformers (not dependencies of keras-zoo). It prints a
table and one JSON line: the largest difference per model, and whether greedy
generation picks the same tokens.
"""

import json
import sys
from pathlib import Path

import _harness
import numpy as np

CASES = {  # folder: (zoo name, task, spec overrides + task args)
    "bert-model": ("enc-mini", "backbone", {}),
    "bert-mlm": ("enc-mini", "masked_lm", {}),
    "bert-classifier": ("enc-mini", "classifier", {"num_classes": 3}),
    "llama-tied": ("dec-base", "causal_lm", {}),
    "llama-untied": ("dec-base", "causal_lm", {"tie_embeddings": False}),
}
SHAPE = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=300, max_sequence_length=64)


def models(real):
    """(folder, zoo name, model) for every case."""
    import zoo

    rng = np.random.default_rng(0)
    for folder, (name, task, extra) in CASES.items():
        overrides = dict(SHAPE, **({"num_kv_heads": 2} if name.startswith("dec") else {}), **extra)
        model = zoo.get(name, task=task, **overrides)
        for v in model.weights:  # distinct values everywhere, norms near 1
            norm = v.path.endswith(("gamma", "scale"))
            v.assign(rng.normal(0, 0.1, v.shape).astype("float32") + (1.0 if norm else 0))
        yield folder, name, model
    if real:
        import tempfile

        from zoo import hub

        paths = _harness.fetch("minilm", "smollm2")
        yield "minilm", "enc-mini", zoo.get("enc-mini", weights=paths["minilm"])
        with tempfile.TemporaryDirectory() as tmp:
            folder = hub.convert_gguf(paths["smollm2"], Path(tmp) / "smollm2")
            yield "smollm2", "dec-base", zoo.get("dec-base", weights=str(folder))


def write(root, real=False):
    from zoo import hub
    from zoo.generation import generate

    rng = np.random.default_rng(1)
    root = Path(root)
    for folder, name, model in models(real):
        task = model.task
        hub.save(model, root / folder, overwrite=True)
        ids = rng.integers(1, min(model.spec.vocab_size, 2000), (2, 11)).astype("int32")
        mask = np.ones_like(ids)
        mask[1, -3:] = 0
        x = {"token_ids": ids, "padding_mask": mask}
        if name.startswith("enc"):
            x["segment_ids"] = np.zeros_like(ids)
            x["segment_ids"][:, 6:] = 1
        if task == "masked_lm":
            x["mask_positions"] = np.array([[1, 4], [2, 7]], "int32")
        if name.startswith("dec"):
            x["padding_mask"] = np.ones_like(ids)  # causal LM parity on unpadded rows
        out = {k: np.asarray(v) for k, v in model(x).items()}
        if name.startswith("dec"):
            out["greedy"] = generate(model, ids[:, :5], 8)
        np.savez(root / folder / "parity.npz", **{f"in_{k}": v for k, v in x.items()}, **out)
        print("wrote", root / folder)


def check(root):
    import torch
    import transformers

    torch.set_grad_enabled(False)
    rows = []
    for path in sorted(p for p in Path(root).iterdir() if (p / "parity.npz").exists()):
        folder = path.name
        data = np.load(path / "parity.npz")
        task = {"BertModel": "backbone", "BertForMaskedLM": "masked_lm", "BertForSequenceClassification":
                "classifier", "LlamaForCausalLM": "causal_lm"}[json.loads((path / "config.json").read_text())
                                                                ["architectures"][0]]
        auto = {"backbone": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM,
                "classifier": transformers.AutoModelForSequenceClassification,
                "causal_lm": transformers.AutoModelForCausalLM}[task]
        model, info = auto.from_pretrained(path, output_loading_info=True, attn_implementation="eager")
        model.eval()
        problems = {k: [str(x) for x in v] for k, v in info.items() if v}
        ids = torch.tensor(data["in_token_ids"], dtype=torch.long)
        mask = torch.tensor(data["in_padding_mask"], dtype=torch.long)
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if "in_segment_ids" in data:
            kwargs["token_type_ids"] = torch.tensor(data["in_segment_ids"], dtype=torch.long)
        out = model(**kwargs)
        real = data["in_padding_mask"].astype(bool)
        diffs = {}
        if task == "backbone":
            diffs["sequence_output"] = np.abs(out.last_hidden_state.numpy() - data["sequence_output"])[real].max()
            diffs["pooled_output"] = np.abs(out.pooler_output.numpy() - data["pooled_output"]).max()
        elif task == "masked_lm":
            positions = data["in_mask_positions"]
            logits = np.take_along_axis(out.logits.numpy(), positions[..., None], axis=1)
            diffs["logits"] = np.abs(logits - data["logits"]).max()
        else:
            diffs["logits"] = np.abs(out.logits.numpy() - data["logits"]).max()
        greedy = None
        if "greedy" in data:
            prompt = ids[:, :5]
            generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                       do_sample=False, pad_token_id=0, eos_token_id=None)
            greedy = bool(np.array_equal(generated.numpy(), data["greedy"]))
        rows.append({"model": folder, "class": type(model).__name__, "load_problems": problems,
                     "max_abs_diff": {k: float(v) for k, v in diffs.items()}, "greedy_equal": greedy})
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("| folder | transformers class | missing/unexpected/mismatched | max |diff| | greedy same |")
    print("|---|---|---|---|---|")
    for r in rows:
        diff = ", ".join(f"{k} {v:.1e}" for k, v in r["max_abs_diff"].items())
        print(f"| {r['model']} | {r['class']} | {r['load_problems'] or 'none'} | {diff} | {r['greedy_equal']} |")
    print(json.dumps({"benchmark": "transformers_parity", "transformers": transformers.__version__, "rows": rows}))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    if sys.argv[1] == "write":
        write(sys.argv[2], real="--real" in sys.argv)
    else:
        check(sys.argv[2])
