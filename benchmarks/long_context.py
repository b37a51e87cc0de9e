"""Long context: step memory, step time and tokens/s as the sequence grows, per
checkpointing policy, with the chunked attention core beside the plain one.

    python benchmarks/long_context.py                       # enc-base, dec-base; b1; s 512..16384
    python benchmarks/long_context.py --models dec-1b --lengths 8192 --policies full --cores chunked
    python benchmarks/long_context.py --models gemma3-1b --lengths 8192 --policies full --cores chunked \
        --num-layers 6 --all-global       # sliding windows against the same model all-global

Each variant runs in a fresh process (`benchmarks/memory.py`'s `measure`: the
allocator's step peak above the built model and optimizer, peak RSS, median
step time after the tracing step). A variant starts only if `zoo.memory.estimate`
says it fits in the memory available at the start (less a margin), and a guard
kills it before its RSS passes that budget: the plain core at long lengths is
reported as skipped, never left to the OOM killer. enc-base beyond 512 positions
is built with `max_sequence_length` raised. `--all-global` adds, for a model with local
(sliding-window) layers, the same model with every layer global: what the windows save.
`--num-layers` shrinks a model (Gemma 3 keeps its 5-local-to-1-global rhythm at 6).
Prints a table and one JSON line.
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
    p.add_argument("--num-layers", type=int, default=None, help="fewer blocks than the registered model")
    p.add_argument("--all-global", action="store_true",
                   help="beside a model with sliding-window layers, the same model with every layer global")
    a = p.parse_args()

    import zoo
    from zoo import memory

    budget = _harness.available_bytes() - int(a.margin_gib * GiB)
    print(f"memory budget {budget / GiB:.1f} GiB; batch {a.batch}; {a.precision}", flush=True)
    print(f"{'model':9s} {'seq':>6s} {'core':8s} {'policy':10s} {'est GiB':>8s} {'step GiB':>9s} {'RSS GiB':>8s} "
          f"{'step s':>8s} {'tok/s':>7s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        attentions = {"as registered": None}
        if a.all_global and "local" in zoo.spec(model).layer_kinds:
            attentions["all global"] = {"layer_kinds": ["global"], "sliding_window": None, "local_rope_theta": None}
        for seq in map(int, a.lengths.split(",")):
            for core in a.cores.split(","):
                for policy in a.policies.split(","):
                    for attention, spec_overrides in attentions.items():
                        variant = {"model": model, "batch": a.batch, "seq": seq, "precision": a.precision,
                                   "policy": policy, "core": core, "num_layers": a.num_layers,
                                   "spec_overrides": spec_overrides}
                        spec = zoo.spec(model).replace(**(spec_overrides or {}),
                                                       **({"num_layers": a.num_layers} if a.num_layers else {}))
                        if seq > spec.max_sequence_length:
                            spec = spec.replace(max_sequence_length=seq)
                        est = memory.estimate(spec, a.batch, seq, a.precision, policy, attention=core).total
                        row = {**variant, "attention": attention, "estimate_gib": est / GiB}
                        row.update(_harness.run_if_it_fits({**variant, "steps": a.steps}, est, budget, a.timeout))
                        rows.append(row)
                        cells = (f"{row['step_mem_gib']:9.2f} {row['guard_rss_gib']:8.2f} {row['step_s']:8.1f} "
                                 f"{row['tokens_per_s']:7.0f}" if "step_s" in row else f"{'-':>9s} {'-':>8s} "
                                 f"{'-':>8s} {'-':>7s}")
                        label = model if spec_overrides is None else f"{model} (all global)"
                        print(f"{label:9s} {seq:6d} {core:8s} {policy:10s} {est / GiB:8.2f} {cells}  {row['status']}",
                              flush=True)
    print(json.dumps({"benchmark": "long_context", "budget_gib": budget / GiB, "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
