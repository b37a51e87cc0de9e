"""Does the planner predict what is measured? `zoo.memory.estimate` against TensorFlow's
allocator peak, one fresh process per row.

    python benchmarks/planner.py                                   # every size, both families (1B rows need ~21 GiB)
    python benchmarks/planner.py --models enc-base,dec-base --shapes 2x256 --precisions float32
    python benchmarks/planner.py --models enc-base --optimizer lion --precisions mixed_bfloat16

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
compiling; it is one of the default configs.

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
# What a child's RSS holds beyond the allocator's peak (TensorFlow's libraries, Python, the pool's
# freed chunks): ~1 GiB for enc-mini; dec-1b at 1 x 128 (allocator peak 16.9 GiB predicted) passed
# 19.8 GiB of RSS before its first step ended.
RUNTIME_RSS = 3 * GiB


def measure(model, batch, seq, precision, config, steps, optimizer, loss_chunk=None):
    """One row, in this (child) process."""
    import tensorflow as tf
    from _training import compiled_model, synthetic_batch, train_steps

    tf.config.experimental.reset_memory_stats("CPU:0")
    start = tf.config.experimental.get_memory_info("CPU:0")["current"]
    policy, fused = config.split("+")[0], config.endswith("+fused")
    m = compiled_model(model, policy, precision, seq, optimizer=optimizer, fused=fused, loss_chunk=loss_chunk)
    built = tf.config.experimental.get_memory_info("CPU:0")
    x, y = synthetic_batch(model, batch, seq)
    times, _, losses = train_steps(m, x, y, steps)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {"measured_bytes": peak - start, "built_bytes": built["current"] - start,
            "build_peak_bytes": built["peak"] - start, "start_bytes": start, "peak_rss_gib": _harness.peak_rss_gib(),
            "step_s": min(times[1:]) if len(times) > 1 else times[0], "loss": losses[-1]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="enc-mini,enc-base,enc-large,enc-1b,dec-base,dec-large,dec-1b,"
                   "qwen2.5-0.5b,qwen3-0.6b,gemma3-1b,modernbert-base,modernbert-large")
    p.add_argument("--shapes", default=None, help="BATCHxSEQ,... (default: 2x256, 1x128 for the 1B models)")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--configs", default="none,selective,full,full+fused", help="some of none,selective,full,full+fused")
    p.add_argument("--optimizer", default="adamw", help="adamw, lion or adafactor (global_clipnorm 1.0)")
    p.add_argument("--loss-chunk", type=int, default=None,
                   help="causal LM: positions per loss chunk, trained and estimated (default: its own; 0: whole)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--margin-gib", type=float, default=2.0, help="memory left free for the system")
    a = p.parse_args()

    from _training import pretraining_task

    from zoo import memory

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    print(f"budget {budget / GiB:.1f} GiB; optimizer {a.optimizer} (global_clipnorm 1.0); {a.steps} steps", flush=True)
    print(f"{'model':9s} {'shape':7s} {'precision':14s} {'config':10s} {'predicted':>10s} {'measured':>10s} "
          f"{'ratio':>6s} {'RSS GiB':>8s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        spec = memory.lookup(model)
        task = pretraining_task(model)
        shapes = a.shapes or ("1x128" if spec.num_params() > 5e8 else "2x256")
        for shape in shapes.split(","):
            batch, seq = map(int, shape.split("x"))
            for precision in a.precisions.split(","):
                for config in a.configs.split(","):
                    policy, fused = config.split("+")[0], config.endswith("+fused")
                    est = memory.estimate(model, batch, seq, precision, policy, task=task, optimizer=a.optimizer,
                                          fused=fused, loss_chunk=a.loss_chunk if task == "causal_lm" else None)
                    variant = {"model": model, "batch": batch, "seq": seq, "precision": precision, "config": config,
                               "steps": a.steps, "optimizer": a.optimizer,
                               "loss_chunk": a.loss_chunk if task == "causal_lm" else None}
                    row = {**variant, "task": task, "predicted_bytes": est.total, "estimate": est.as_dict()}
                    row.update(_harness.run_if_it_fits(variant, est.total + RUNTIME_RSS, budget))
                    rows.append(row)
                    head = f"{model:9s} {shape:7s} {precision:14s} {config:10s} {est.total / GiB:9.3f}G"
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
