"""The headline: 1B-parameter models take real Adam steps on a 2-core, 24 GiB machine.

    python benchmarks/one_billion.py [--models enc-1b,dec-1b] [--policies full,none]
                                     [--precision mixed_bfloat16] [--max-batch 8]

For each model and policy, batches 1, 2, 4, ... run at sequence 512, each in a
fresh process that builds the model, builds Adam (clipnorm 1.0) and takes
`--steps` training steps. A batch is only started when `zoo.memory.estimate`
(plus the runtime overhead measured at batch 1) says it fits in the memory
available when the benchmark started; while it runs, a guard kills it before
its resident memory passes that budget, so no variant is left to the kernel's
OOM killer. Prints a table and one JSON line.
"""

import argparse
import json

import _harness
from _harness import GiB


def measure(model, policy, precision, batch, seq, steps):
    """One variant, in this (child) process."""
    import time

    from _training import compiled_model, synthetic_batch, train_steps

    start = time.perf_counter()
    m = compiled_model(model, policy, precision, seq)
    build_s = time.perf_counter() - start
    x, y = synthetic_batch(model, batch, seq)
    with _harness.PeakMemory() as mem:
        times, _, losses = train_steps(m, x, y, steps)
    return {
        "params": m.count_params(), "build_s": build_s, "base_gib": mem.base_gib,
        "alloc_peak_gib": mem.peak_gib, "step_mem_gib": mem.step_gib, "peak_rss_gib": mem.rss_gib,
        "first_step_s": times[0], "step_s": min(times[1:]) if len(times) > 1 else times[0], "losses": losses,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="enc-1b,dec-1b")
    p.add_argument("--policies", default="full,none")
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--start-batch", type=int, default=1, help="first batch of the doubling search")
    p.add_argument("--max-batch", type=int, default=8, help="stop the search here (each step is minutes on 2 cores)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--margin-gib", type=float, default=1.0, help="memory left free for the system")
    a = p.parse_args()

    from zoo import memory

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    seq = a.sequence_length
    print(f"memory budget {budget / GiB:.1f} GiB (available at start less {a.margin_gib} GiB); sequence {seq}; "
          f"{a.precision}", flush=True)
    print(f"{'model':7s} {'policy':6s} {'batch':>5s} {'est GiB':>8s} {'RSS GiB':>8s} {'alloc GiB':>9s} "
          f"{'s/step':>7s} {'tok/s':>6s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        for policy in a.policies.split(","):
            overhead = None  # runtime memory beyond the analytical estimate, measured at the first batch
            largest = 0
            batch = a.start_batch
            while batch <= a.max_batch:
                est = memory.estimate(model, batch, seq, a.precision, policy).total
                predicted = est + (overhead or 0)
                row = {"model": model, "policy": policy, "batch": batch, "seq": seq, "precision": a.precision,
                       "estimate_gib": est / GiB}
                variant = {"model": model, "policy": policy, "precision": a.precision, "batch": batch, "seq": seq,
                           "steps": a.steps}
                row.update(_harness.run_if_it_fits(variant, predicted, budget))
                rows.append(row)
                ok = row["status"] == "ok"
                cells = (f"{row['guard_rss_gib']:8.2f} {row['alloc_peak_gib']:9.2f} {row['step_s']:7.1f} "
                         f"{batch * seq / row['step_s']:6.0f}") if ok else f"{'-':>8s} {'-':>9s} {'-':>7s} {'-':>6s}"
                print(f"{model:7s} {policy:6s} {batch:5d} {est / GiB:8.2f} {cells}  {row['status']}", flush=True)
                if not ok:
                    break
                largest = batch
                if overhead is None:  # what the estimate leaves out: TF runtime, Python, allocator slack
                    overhead = max(0, int(row["guard_rss_gib"] * GiB) - est)
                batch *= 2
            # Beyond the search cap, the estimate (with the overhead measured at batch 1) says how far it goes.
            estimated = memory.largest_batch(model, seq, budget - (overhead or 0), precision=a.precision,
                                             checkpointing=policy)
            summary = {"model": model, "policy": policy, "largest_batch_run": largest,
                       "search_capped": largest == a.max_batch, "largest_batch_estimated": estimated}
            rows.append(summary)
            capped = " (search capped)" if summary["search_capped"] else ""
            print(f"{model:7s} {policy:6s} largest batch run: {largest}{capped}; estimated to fit: {estimated}",
                  flush=True)
    print(json.dumps({"benchmark": "one_billion", "budget_gib": budget / GiB, "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
