"""LoRA and QLoRA-like fine-tuning (zoo.lora): what a step holds on a frozen bf16 / int8 / int4
base, and how LoRA's quality compares with full fine-tuning on the same steps and data.

    python benchmarks/lora.py memory [--models dec-1b --batch 8 --seq 512 --bases bf16,int8,int4]
    python benchmarks/lora.py quality [--tasks minilm,smollm2]
    python benchmarks/lora.py memory --models dec-base --batch 1 --seq 64 --steps 1   # a smoke

memory: dec-1b at 8 x 512, `full` checkpointing, the chunked loss, mixed_bfloat16 (the bf16 base:
pure bfloat16), AdamW with
global clip 1.0, LoRA r16 (alpha 32) on every linear projection, one fresh process per base
(benchmarks/one_billion.py's `measure`): allocator peak from before the build, its ratio to
`zoo.memory.estimate(..., lora_rank=16, quantize=)`, peak RSS and s/step, beside one_billion's rows.

quality: benchmarks/finetune_minilm.py (Reuters R8, accuracy) and benchmarks/finetune_smollm2.py
(news, held-out perplexity before/after), each run twice with the same steps and data: full
fine-tuning at its own learning rate, and LoRA (`--lora-rank`, PEFT's default targets plus a new
classifier for MiniLM) at `--lora-learning-rate` (LoRA's factors start at B = 0 and move ~10x
less per step, so PEFT's recipes use 1e-4 to 1e-3). Prints a table and one JSON line.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import _harness
from _harness import GiB
from one_billion import RUNTIME_RSS, measure

HERE = Path(__file__).resolve().parent
# task -> (script, its metric(s) in the JSON line, extra flags of a smoke run)
QUALITY = {
    "minilm": ("finetune_minilm.py", ("test_accuracy",), ["--train", "64", "--test", "32"]),
    "smollm2": ("finetune_smollm2.py", ("perplexity_before", "perplexity_after"),
                ["--train-articles", "8", "--held-out", "2", "--sequence-length", "64"]),
}


def _memory(a):
    from zoo import memory

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    print(f"memory budget {budget / GiB:.1f} GiB; {a.precision}, full, chunked loss, AdamW (clip 1.0), LoRA r{a.rank} "
          f"on {a.targets}", flush=True)
    print(f"{'model':8s} {'base':6s} {'batch':>5s} {'seq':>5s} {'est GiB':>8s} {'alloc':>7s} {'ratio':>6s} "
          f"{'RSS':>6s} {'s/step':>7s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        for base in a.bases.split(","):
            # bf16: the whole model in bfloat16 (a 2-byte frozen base); float: --precision's variables
            quantize = None if base in ("bf16", "float") else base
            precision = "bfloat16" if base == "bf16" else a.precision
            lora = {"lora_rank": a.rank, "lora_targets": a.targets, "quantize": quantize}
            est = memory.estimate(model, a.batch, a.seq, precision, "full", task="causal_lm", **lora).total
            child = {"model": model, "batch": a.batch, "seq": a.seq, "precision": precision, "steps": a.steps,
                     "optimizer": "adamw", "fused": False, "loss_chunk": None, "clip": 1.0, **lora}
            row = {**child, "base": base, "estimate_gib": est / GiB}
            row.update(_harness.run_if_it_fits(child, est + RUNTIME_RSS, budget, timeout=a.timeout))
            rows.append(row)
            cells = (f"{row['alloc_peak_gib']:7.2f} {row['alloc_peak_gib'] * GiB / est:6.2f} "
                     f"{row['guard_rss_gib']:6.2f} {row['step_s']:7.1f}") if row["status"] == "ok" else (
                " ".join(f"{'-':>{w}s}" for w in (7, 6, 6, 7)))
            print(f"{model:8s} {base:6s} {a.batch:5d} {a.seq:5d} {est / GiB:8.2f} {cells}  {row['status']}",
                  flush=True)
    return {"benchmark": "lora_memory", "budget_gib": budget / GiB, "results": rows}


def _run_script(script, flags):
    done = subprocess.run([sys.executable, str(HERE / script), *map(str, flags)], capture_output=True, text=True,
                          cwd=HERE.parent)
    if done.returncode:
        raise RuntimeError(f"{script} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _quality(a):
    rows = []
    print(f"{'task':8s} {'variant':8s} {'metric':18s} {'value':>8s} {'train s':>8s}", flush=True)
    for task in a.tasks.split(","):
        script, metrics, smoke = QUALITY[task]
        common = ["--steps", a.steps] if a.steps else []
        common += smoke if a.smoke else []
        variants = {"full": [], "lora": ["--lora-rank", a.rank, "--learning-rate", a.lora_learning_rate]}
        for variant, flags in variants.items():
            result = _run_script(script, common + flags)
            rows.append({"task": task, "variant": variant, **result})
            for metric in metrics:
                print(f"{task:8s} {variant:8s} {metric:18s} {result[metric]:8.4f} {result['train_seconds']:8.1f}",
                      flush=True)
    return {"benchmark": "lora_quality", "results": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("memory", "quality"))
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--models", default="dec-1b")
    p.add_argument("--bases", default="bf16,int8,int4",
                   help="the frozen base: bf16 (pure bfloat16), float (--precision's variables), int8, int4")
    p.add_argument("--targets", default="all-linear", help="memory: the adapted projections")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--steps", type=int, default=None, help="memory: steps per child (default 2); quality: the "
                   "scripts' own default")
    p.add_argument("--margin-gib", type=float, default=1.0)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--tasks", default="minilm,smollm2")
    p.add_argument("--lora-learning-rate", type=float, default=1e-3)
    p.add_argument("--smoke", action="store_true", help="quality: tiny data, to check the wiring")
    a = p.parse_args()
    if a.part == "memory":
        a.steps = a.steps or 2
        print(json.dumps(_memory(a)))
    else:
        print(json.dumps(_quality(a)))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
