"""Step memory and step time of each checkpointing policy, each variant in a fresh process.

    python benchmarks/memory.py                     # the full grid (enc-base, dec-base; 2 shapes; 2 precisions)
    python benchmarks/memory.py --models enc-base --shapes 4x512 --precisions float32
    python benchmarks/memory.py --shapes 4x512 --cores chunked,plain   # beside the plain attention core

Step memory = the allocator's peak during training minus its level once the model
and the optimizer are built (`_harness.PeakMemory`, from
`tf.config.experimental.get_memory_info("CPU:0")`); peak RSS (which never
shrinks under TF's pooling allocator) is printed beside it.
Step time is given as wall time and as the process's CPU time (all threads): on a
shared machine the CPU-time ratio is the steadier measure of recomputation's cost.
Encoders train masked-LM (15% of positions), decoders causal-LM, with Adam
(benchmarks/_training.py). enc-base at sequence 1024 is built with 1024 learned
positions (BERT has 512).
Prints a table, the ratios to `none`, and one JSON line.
"""

import argparse
import json

import _harness

POLICIES = ("none", "selective", "full")


def measure(model, batch, seq, precision, policy, steps, core="chunked", num_layers=None, spec_overrides=None):
    """One variant, in this (child) process (`num_layers`, `spec_overrides`: _training.compiled_model's)."""
    import numpy as np
    from _training import compiled_model, synthetic_batch, train_steps

    m = compiled_model(model, policy, precision, seq, core, num_layers=num_layers, spec_overrides=spec_overrides)
    x, y = synthetic_batch(model, batch, seq)
    with _harness.PeakMemory() as mem:
        times, cpu_times, losses = train_steps(m, x, y, steps)
    step_time = float(np.median(times[1:])) if len(times) > 1 else times[0]
    cpu_time = float(np.median(cpu_times[1:])) if len(cpu_times) > 1 else cpu_times[0]
    return {
        "model": model, "batch": batch, "seq": seq, "precision": precision, "policy": policy, "core": core,
        "num_layers": num_layers, "spec_overrides": spec_overrides,
        "step_mem_gib": mem.step_gib, "base_gib": mem.base_gib, "peak_rss_gib": mem.rss_gib,
        "memory_measure": mem.measure,
        "step_s": step_time, "step_cpu_s": cpu_time, "tokens_per_s": batch * seq / step_time, "loss": losses[-1],
    }


def ratio(value):
    """A table cell for a ratio to `none` ("-" where there is none)."""
    return f"{value:7.2f}" if value is not None else f"{'-':>7s}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="enc-base,dec-base")
    p.add_argument("--shapes", default="4x512,2x1024", help="BATCHxSEQ,...")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--cores", default="chunked", help="attention cores: chunked,plain (ratios are to chunked none)")
    p.add_argument("--steps", type=int, default=3, help="steps per variant; the first (tracing) is not timed")
    args = p.parse_args()

    rows = []
    header = f"{'model':9s} {'shape':8s} {'precision':15s} {'policy':18s} {'step GiB':>9s} {'x none':>7s} " \
             f"{'RSS GiB':>8s} {'step s':>7s} {'x none':>7s} {'cpu s':>7s} {'x none':>7s} {'tok/s':>7s}"
    print(header, flush=True)
    for model in args.models.split(","):
        for shape in args.shapes.split(","):
            batch, seq = map(int, shape.split("x"))
            for precision in args.precisions.split(","):
                ref = None
                for core, policy in [(c, p) for c in args.cores.split(",") for p in args.policies.split(",")]:
                    variant = {"model": model, "batch": batch, "seq": seq, "precision": precision, "policy": policy,
                               "core": core}
                    run = _harness.run_child({**variant, "steps": args.steps})
                    r = run.result if run.ok else {**variant, "error": run.error}
                    rows.append(r)
                    label = f"{policy} ({core})"
                    if "error" in r:
                        print(f"{model:9s} {shape:8s} {precision:15s} {label:18s} ERROR {r['error']}", flush=True)
                        continue
                    ref = ref or (r if policy == "none" else None)
                    r["mem_vs_none"] = r["step_mem_gib"] / ref["step_mem_gib"] if ref else None
                    r["time_vs_none"] = r["step_s"] / ref["step_s"] if ref else None
                    r["cpu_vs_none"] = r["step_cpu_s"] / ref["step_cpu_s"] if ref else None
                    print(f"{model:9s} {shape:8s} {precision:15s} {label:18s} {r['step_mem_gib']:9.2f} "
                          f"{ratio(r['mem_vs_none'])} {r['peak_rss_gib']:8.2f} {r['step_s']:7.2f} "
                          f"{ratio(r['time_vs_none'])} {r['step_cpu_s']:7.2f} {ratio(r['cpu_vs_none'])} "
                          f"{r['tokens_per_s']:7.0f}", flush=True)
    print(json.dumps({"benchmark": "memory", "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
