"""Does the planner predict what is measured? `zoo.memory.estimate` against TensorFlow's
allocator peak, one fresh process per row.

    python benchmarks/planner.py                                   # every registered size (1B rows need ~21 GiB)
    python benchmarks/planner.py --models enc-base,dec-base --shapes 2x256 --precisions float32
    python benchmarks/planner.py --models enc-base --optimizer lion --precisions mixed_bfloat16
    python benchmarks/planner.py --lora                           # LoRA rows (docs/memory.md: LoRA)

Measured ("allocator peak"): in a fresh process, `reset_memory_stats("CPU:0")`,
then build the model, build the optimizer, make the batch and take `--steps`
training steps (`train_on_batch`, the first one traced); the figure is
`get_memory_info("CPU:0")["peak"]` minus the allocator's `current` bytes right
after the reset (TensorFlow's own few MiB before anything is built). So it covers
the weights, the optimizer's state, the gradients, the activations, the logits and
whatever TensorFlow allocates on top: exactly what `estimate(...).total` predicts.
Peak RSS (the process, Python and TensorFlow's libraries included, never shrinking)
is printed beside it but is not what is compared.

The optimizer is the recipes' setup: AdamW with global_clipnorm 1.0
(`benchmarks/_training.py make_optimizer`, `--optimizer`). Causal-LM rows train with the
loss chunk `--loss-chunk` (default: the chunked loss's own choice; 0: whole logits), and the
estimate is given the same. "full+fused" calls `model.set_fused_update(True)` before
compiling; it is one of the default configs. `--lora-rank R` trains LoRA adapters on every
projection (`--lora-targets`) of a frozen base, `--quantize int8|int4` quantized first;
`--lora` runs the LoRA rows the docs quote (`LORA_ROWS`).

A row is only started when its estimate plus `RUNTIME_RSS` fits the memory available
(`_harness.run_if_it_fits`, with a guard on RSS): a 1B row needs ~21 GiB free, so on a 24 GiB
machine run those alone. Prints predicted, measured and their ratio, marks rows outside
±10% with "!", and ends with one JSON line.
"""

import argparse
import json

import _harness
from _harness import GiB

TOLERANCE = 0.10
MODELS = ("enc-mini,enc-base,enc-large,enc-1b,dec-base,dec-large,dec-1b,"
          "qwen2.5-0.5b,qwen3-0.6b,gemma3-1b,modernbert-base,modernbert-large")
# What a child's RSS holds beyond the allocator's peak (TensorFlow's libraries, Python, the pool's
# freed chunks): ~1 GiB for enc-mini; dec-1b at 1 x 128 (allocator peak 16.9 GiB predicted) passed
# 19.8 GiB of RSS before its first step ended.
RUNTIME_RSS = 3 * GiB


# The LoRA rows of docs/memory.md: (model, BATCHxSEQ, precision, quantize), `full`, r16 on every projection.
LORA_ROWS = [(model, shape, precision, quantize) for model, shape in (("dec-base", "4x256"), ("enc-base", "4x256"),
                                                                      ("dec-1b", "8x512"))
             for precision, quantize in (("bfloat16", None), ("mixed_bfloat16", None), ("mixed_bfloat16", "int8"),
                                         ("mixed_bfloat16", "int4"))]


def measure(model, batch, seq, precision, config, steps, optimizer, loss_chunk=None, lora_rank=None,
            lora_targets=None, quantize=None):
    """One row, in this (child) process."""
    import tensorflow as tf
    from _training import compiled_model, synthetic_batch, train_steps

    tf.config.experimental.reset_memory_stats("CPU:0")
    start = tf.config.experimental.get_memory_info("CPU:0")["current"]
    policy, fused = config.split("+")[0], config.endswith("+fused")
    m = compiled_model(model, policy, precision, seq, optimizer=optimizer, fused=fused, loss_chunk=loss_chunk,
                       lora_rank=lora_rank, lora_targets=lora_targets, quantize=quantize)
    built = tf.config.experimental.get_memory_info("CPU:0")
    x, y = synthetic_batch(model, batch, seq)
    times, _, losses = train_steps(m, x, y, steps)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {"measured_bytes": peak - start, "built_bytes": built["current"] - start,
            "build_peak_bytes": built["peak"] - start, "start_bytes": start, "peak_rss_gib": _harness.peak_rss_gib(),
            "step_s": min(times[1:]) if len(times) > 1 else times[0], "loss": losses[-1]}


def _rows(a, registry):
    """(model, batch, seq, precision, config, LoRA arguments) for every row asked for."""
    targets = a.lora_targets if a.lora_targets == "all-linear" else a.lora_targets.split(",")
    if a.lora:
        models = a.models.split(",") if a.models != MODELS else None
        for model, shape, precision, quantize in LORA_ROWS:
            if (models is None or model in models) and (a.shapes is None or shape in a.shapes.split(",")):
                batch, seq = map(int, shape.split("x"))
                yield model, batch, seq, precision, "full", {"lora_rank": 16, "lora_targets": targets,
                                                              "quantize": quantize}
        return
    lora = {"lora_rank": a.lora_rank, "lora_targets": targets, "quantize": a.quantize} if a.lora_rank else {}
    for model in a.models.split(","):
        shapes = a.shapes or ("1x128" if registry.spec(model).num_params() > 5e8 else "2x256")
        for shape in shapes.split(","):
            batch, seq = map(int, shape.split("x"))
            for precision in a.precisions.split(","):
                for config in a.configs.split(","):
                    yield model, batch, seq, precision, config, lora


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=MODELS)
    p.add_argument("--shapes", default=None, help="BATCHxSEQ,... (default: 2x256, 1x128 for the 1B models)")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--configs", default="none,selective,full,full+fused", help="some of none,selective,full,full+fused")
    p.add_argument("--optimizer", default="adamw", help="adamw, lion or adafactor (global_clipnorm 1.0)")
    p.add_argument("--loss-chunk", type=int, default=None,
                   help="causal LM: positions per loss chunk, trained and estimated (default: its own; 0: whole)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--lora-rank", type=int, default=None, help="LoRA adapters of this rank on a frozen base")
    p.add_argument("--lora-targets", default="all-linear", help="with --lora-rank: comma-separated names or all-linear")
    p.add_argument("--quantize", default=None, help="with --lora-rank: int8 or int4 (the frozen base)")
    p.add_argument("--lora", action="store_true", help="the LoRA rows (LORA_ROWS; `full`, r16, every projection; "
                   "dec-1b's need ~10 GiB); --models and --shapes pick among them")
    p.add_argument("--margin-gib", type=float, default=2.0, help="memory left free for the system")
    a = p.parse_args()

    from _training import pretraining_task

    from zoo import memory, registry

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    print(f"budget {budget / GiB:.1f} GiB; optimizer {a.optimizer} (global_clipnorm 1.0); {a.steps} steps", flush=True)
    print(f"{'model':9s} {'shape':7s} {'precision':14s} {'config':10s} {'predicted':>10s} {'measured':>10s} "
          f"{'ratio':>6s} {'RSS GiB':>8s}  status", flush=True)
    rows = []
    for model, batch, seq, precision, config, lora in _rows(a, registry):
        task = pretraining_task(model)
        policy, fused = config.split("+")[0], config.endswith("+fused")
        loss_chunk = a.loss_chunk if task == "causal_lm" else None
        est = memory.estimate(model, batch, seq, precision, policy, task=task, optimizer=a.optimizer, fused=fused,
                              loss_chunk=loss_chunk, **lora)
        variant = {"model": model, "batch": batch, "seq": seq, "precision": precision, "config": config,
                   "steps": a.steps, "optimizer": a.optimizer, "loss_chunk": loss_chunk, **lora}
        row = {**variant, "task": task, "predicted_bytes": est.total, "estimate": est.as_dict()}
        row.update(_harness.run_if_it_fits(variant, est.total + RUNTIME_RSS, budget))
        rows.append(row)
        name = f"{config}+lora-{lora['quantize'] or 'float'}" if lora else config
        head = f"{model:9s} {batch}x{seq:<5d} {precision:14s} {name:10s} {est.total / GiB:9.3f}G"
        if row["status"] != "ok":
            print(f"{head} {'-':>10s} {'-':>6s} {'-':>8s}  {row['status']}", flush=True)
            continue
        row["ratio"] = est.total / row["measured_bytes"]
        row["within"] = abs(row["ratio"] - 1) <= TOLERANCE
        mark = "" if row["within"] else "  ! outside ±10%"
        print(f"{head} {row['measured_bytes'] / GiB:9.3f}G {row['ratio']:6.3f} "
              f"{row['peak_rss_gib']:8.2f}  ok{mark}", flush=True)
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"{sum(r['within'] for r in ok)} of {len(ok)} measured rows within ±10%", flush=True)
    print(json.dumps({"benchmark": "planner", "budget_gib": budget / GiB, "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
