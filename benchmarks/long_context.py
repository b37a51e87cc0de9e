"""Long context: step memory, step time and tokens/s as the sequence grows, per
checkpointing policy, with the chunked attention core beside the plain one.

    python benchmarks/long_context.py                       # enc-base, dec-base; b1; s 512..16384
    python benchmarks/long_context.py --models dec-1b --lengths 8192 --policies full --cores chunked

Each variant runs in a fresh process (`benchmarks/memory.py`'s `measure`: the
allocator's step peak above the built model and optimizer, peak RSS, median
step time after the tracing step). A variant starts only if `zoo.memory.estimate`
says it fits in the memory available at the start (less a margin), and a guard
kills it before its RSS passes that budget: the plain core at long lengths is
reported as skipped, never left to the OOM killer. enc-base beyond 512 positions
is built with `max_sequence_length` raised. Prints a table and one JSON line.
"""

import argparse
import json

import _harness
from _harness import GiB
from memory import measure


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="enc-base,dec-base")
    p.add_argument("--lengths", default="512,2048,8192,16384")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--policies", default="none,selective,full")
    p.add_argument("--cores", default="chunked,plain")
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--steps", type=int, default=2, help="steps per variant; the first (tracing) is not timed")
    p.add_argument("--margin-gib", type=float, default=1.5, help="memory left free for the system")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a variant is stopped")
    a = p.parse_args()

    import zoo
    from zoo import memory

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    print(f"memory budget {budget / GiB:.1f} GiB; batch {a.batch}; {a.precision}", flush=True)
    print(f"{'model':9s} {'seq':>6s} {'core':8s} {'policy':10s} {'est GiB':>8s} {'step GiB':>9s} {'RSS GiB':>8s} "
          f"{'step s':>8s} {'tok/s':>7s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        for seq in map(int, a.lengths.split(",")):
            for core in a.cores.split(","):
                for policy in a.policies.split(","):
                    variant = {"model": model, "batch": a.batch, "seq": seq, "precision": a.precision,
                               "policy": policy, "core": core}
                    spec = zoo.spec(model)
                    if seq > spec.max_sequence_length:
                        spec = spec.replace(max_sequence_length=seq)
                    est = memory.estimate(spec, a.batch, seq, a.precision, policy, attention=core).total
                    row = {**variant, "estimate_gib": est / GiB}
                    row.update(_harness.run_if_it_fits({**variant, "steps": a.steps}, est, budget, a.timeout))
                    rows.append(row)
                    cells = (f"{row['step_mem_gib']:9.2f} {row['guard_rss_gib']:8.2f} {row['step_s']:8.1f} "
                             f"{row['tokens_per_s']:7.0f}" if "step_s" in row else f"{'-':>9s} {'-':>8s} "
                             f"{'-':>8s} {'-':>7s}")
                    print(f"{model:9s} {seq:6d} {core:8s} {policy:10s} {est / GiB:8.2f} {cells}  {row['status']}",
                          flush=True)
    print(json.dumps({"benchmark": "long_context", "budget_gib": budget / GiB, "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
