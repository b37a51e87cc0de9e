"""The headline: 1B-parameter models take real optimizer steps on a 2-core, 24 GiB machine,
and how far below 16 bytes per parameter the fused update, the chunked loss and a lighter
optimizer take them.

    python benchmarks/one_billion.py [--models dec-1b,enc-1b] [--seqs 512,2048] [--variants a,b,c,d,e]
                                     [--precision mixed_bfloat16] [--max-batch 16] [--num-layers N (smoke)]

Variants (all `full` checkpointing, global-norm clipping 1.0, the recipes' optimizer classes):
  a        standard AdamW: Keras' step, every gradient alive at the clip, whole logits
  b        fused update (exact global clip: a norm pass, then the update pass) + chunked LM loss, AdamW
  c        as b with Keras' Adafactor ("keras-adafactor": a full-size velocity besides its factors)
  d        as b with the factored Adafactor (zoo.optimizers: row and column statistics only), fp32 weights
  e        as d with bfloat16 weights and stochastic rounding (no float32 copy; the "bfloat16" policy)
  b-noclip as b without clipping (no norm pass): its step time against a's is the fused update's own
           cost, and b's against it is the norm pass's

For each model, sequence and variant, the largest batch the planner (`zoo.memory.estimate`) says
fits the memory available at the start (a power of two, up to --max-batch) runs first in a fresh
process; if it fails, half of it runs, and so on. A batch the estimate says cannot fit is skipped,
never left to the OOM killer (a guard also kills a child whose RSS passes the budget). Each child
builds the model and optimizer and takes `--steps` steps (the first traces, the rest are timed).
Reports the allocator peak (from before the model was built, what `estimate(...).total` predicts),
the step's own allocator peak above the built model and optimizer, peak RSS and s/step. Prints a
table and one JSON line.
"""

import argparse
import json

import _harness
from _harness import GiB

VARIANTS = {
    "a": {"optimizer": "adamw", "fused": False, "loss_chunk": 0, "clip": 1.0},
    "b": {"optimizer": "adamw", "fused": True, "loss_chunk": None, "clip": 1.0},
    "c": {"optimizer": "keras-adafactor", "fused": True, "loss_chunk": None, "clip": 1.0},
    "d": {"optimizer": "adafactor", "fused": True, "loss_chunk": None, "clip": 1.0},
    "e": {"optimizer": "adafactor", "fused": True, "loss_chunk": None, "clip": 1.0, "weights_dtype": "bfloat16"},
    "b-noclip": {"optimizer": "adamw", "fused": True, "loss_chunk": None, "clip": None},
}
RUNTIME_RSS = 3 * GiB  # TF runtime, Python and allocator slack beyond the allocator's peak (benchmarks/planner.py)


def measure(model, batch, seq, precision, steps, optimizer, fused, loss_chunk, clip, weights_dtype="float32",
            num_layers=None, packed=False, **lora):
    """One variant, in this (child) process (`lora`: compiled_model's LoRA arguments, benchmarks/lora.py)."""
    import time

    import tensorflow as tf
    from _training import compiled_model, synthetic_batch, train_steps

    tf.config.experimental.reset_memory_stats("CPU:0")
    start = time.perf_counter()
    m = compiled_model(model, "full", precision, seq, optimizer=optimizer, fused=fused, loss_chunk=loss_chunk,
                       clip=clip, weights_dtype=weights_dtype, num_layers=num_layers, packed=packed, **lora)
    build_s = time.perf_counter() - start
    x, y = synthetic_batch(model, batch, seq, packed)
    with _harness.PeakMemory() as mem:
        times, _, losses = train_steps(m, x, y, steps)
    return {
        "params": m.count_params(), "build_s": build_s, "built_gib": mem.base_gib, "alloc_peak_gib": mem.peak_gib,
        "step_mem_gib": mem.step_gib, "peak_rss_gib": mem.rss_gib, "memory_measure": mem.measure,
        "first_step_s": times[0],
        "step_s": min(times[1:]) if len(times) > 1 else times[0], "losses": losses,
    }


def _estimate(model, batch, seq, precision, variant, num_layers=None):
    from _training import pretraining_task

    import zoo
    from zoo import memory

    v = VARIANTS[variant]
    task = pretraining_task(model)  # what the child trains (the spec's default for BERT is the bare backbone)
    spec = zoo.spec(model).replace(num_layers=num_layers) if num_layers else model
    return memory.estimate(spec, batch, seq, precision, "full", task=task, optimizer=v["optimizer"],
                           fused=v["fused"], loss_chunk=v["loss_chunk"] if task == "causal_lm" else None,
                           weights_dtype=v.get("weights_dtype", "float32")).total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="dec-1b,enc-1b")
    p.add_argument("--seqs", default="512,2048")
    p.add_argument("--variants", default="a,b,c,d,e")
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--max-batch", type=int, default=16, help="the largest batch tried (each step is minutes)")
    p.add_argument("--batch", type=int, default=None, help="run this batch only (e.g. to time b-noclip against a)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--margin-gib", type=float, default=1.0, help="memory left free for the system")
    p.add_argument("--timeout", type=int, default=1800, help="seconds before a child is stopped")
    p.add_argument("--num-layers", type=int, default=None, help="fewer blocks: a smoke run, not a row")
    a = p.parse_args()

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    print(f"memory budget {budget / GiB:.1f} GiB (available at start less {a.margin_gib} GiB); {a.precision}; "
          "full checkpointing; alloc = allocator peak from before the build; step = above the built model",
          flush=True)
    print(f"{'model':7s} {'seq':>5s} {'var':8s} {'batch':>5s} {'est GiB':>8s} {'alloc':>7s} {'ratio':>6s} "
          f"{'step':>6s} {'RSS':>6s} {'s/step':>7s} {'tok/s':>6s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        for seq in map(int, a.seqs.split(",")):
            for variant in a.variants.split(","):
                fits = [b for b in (2**i for i in range(12)) if b <= a.max_batch
                        and _estimate(model, b, seq, a.precision, variant, a.num_layers) + RUNTIME_RSS <= budget]
                batch = a.batch or (max(fits) if fits else 1)
                largest = 0
                while batch >= 1:
                    est = _estimate(model, batch, seq, a.precision, variant, a.num_layers)
                    child = {"model": model, "batch": batch, "seq": seq, "precision": a.precision, "steps": a.steps,
                             "num_layers": a.num_layers, **VARIANTS[variant]}
                    row = {**child, "variant": variant, "estimate_gib": est / GiB}
                    row.update(_harness.run_if_it_fits(child, est + RUNTIME_RSS, budget, timeout=a.timeout))
                    rows.append(row)
                    ok = row["status"] == "ok"
                    cells = (f"{row['alloc_peak_gib']:7.2f} {row['alloc_peak_gib'] * GiB / est:6.2f} "
                             f"{row['step_mem_gib']:6.2f} {row['guard_rss_gib']:6.2f} {row['step_s']:7.1f} "
                             f"{batch * seq / row['step_s']:6.0f}") if ok else " ".join(
                        f"{'-':>{w}s}" for w in (7, 6, 6, 6, 7, 6))
                    print(f"{model:7s} {seq:5d} {variant:8s} {batch:5d} {est / GiB:8.2f} {cells}  {row['status']}",
                          flush=True)
                    if ok:
                        largest = batch
                        break
                    batch //= 2
                rows.append({"model": model, "seq": seq, "variant": variant, "largest_batch_run": largest,
                             "search_capped": largest == a.max_batch})
    print(json.dumps({"benchmark": "one_billion", "budget_gib": budget / GiB, "precision": a.precision,
                      "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
