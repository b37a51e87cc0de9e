"""3B-8B on one machine (issue 36): loading a checkpoint straight into int8 / int4, and a QLoRA step.

    python benchmarks/big_models.py load --model dec-1b --quantize int4          # + --old: float, then quantize
    python benchmarks/big_models.py load --model llama3.1-8b --quantize int4
    python benchmarks/big_models.py step --model llama3.2-3b --quantize int4 --batch 1 --seq 2048
    python benchmarks/big_models.py ladder --model llama3.1-8b --num-layers 1 --measure-up-to 8192

load: writes a checkpoint of the model's shape with random weights (sharded bfloat16 safetensors and its
index, as Hugging Face writes them, from the weight map of a model built quantized, so the writer never
holds the float model), then loads it in a fresh process with `zoo.hub.load(folder, quantize=)`: peak RSS
(the kernel's high-water mark of that process, and its RSS sampled from outside every 0.2 s; the
checkpoint is written by another child, since a child's high-water mark starts at its parent's RSS at
the fork), TensorFlow's allocator peak, the quantized model's bytes
and seconds, beside `zoo.memory.loading_peak`'s plan. The folder is removed after. `--old` also runs
the path before issue 36 (load in float, then `zoo.quantization.quantize_base`) in another fresh process.

step: one QLoRA step (LoRA r16 on every linear projection, `full` checkpointing, mixed_bfloat16, AdamW,
global clip 1.0) on the checkpoint loaded into int4, timed, with the allocator peak against
`zoo.memory.estimate` and the process's peak RSS against `zoo.memory.step_resident`. Prints a table and one JSON line.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import _harness
from _harness import GiB

SHARD = 2 * GiB


def spec_of(name, num_layers=None):
    """`name`'s spec, with `num_layers` blocks where given (the ladder's reduced depth): what is written and planned."""
    import zoo

    spec = zoo.spec(name)
    return spec.replace(num_layers=num_layers) if num_layers else spec


def write_checkpoint(name, folder, shard=SHARD, seed=0, num_layers=None) -> Path:
    """A Hugging Face folder of `name`'s shape (causal LM) with random bfloat16 weights, written shard by shard;
    `num_layers`: fewer blocks than the registered model (the context ladder's reduced depth)."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    import zoo
    from zoo.hub import families, weights

    spec = spec_of(name, num_layers)
    model = zoo.models.build(spec, task="causal_lm", quantize="int4")  # names and shapes, without float kernels
    family = families.family_of(model)
    entries = [(weights.hf_name(e, family, "causal_lm"), weights.hf_shape(e)) for e in family.weight_map(model)]
    del model
    folder = Path(folder)
    folder.mkdir(parents=True)
    config = zoo.hub.config_from_spec(spec, "causal_lm", dtype="bfloat16")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    views = {key: np.broadcast_to(np.zeros((), ml_dtypes.bfloat16), shape) for key, shape in entries}
    groups = weights.shards(views, shard)
    rng = np.random.default_rng(seed)
    index = {}
    for i, keys in enumerate(groups, 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for key in keys:
            shape = views[key].shape
            if len(shape) == 1:  # norms
                tensors[key] = np.ones(shape, ml_dtypes.bfloat16)
            else:
                tensors[key] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        save_file(tensors, folder / file, metadata={"format": "pt"})
        del tensors
        index.update({key: file for key in keys})
    total = sum(v.nbytes for v in views.values())
    (folder / weights.INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": index}))
    return folder


def measure(kind, name, folder, quantize, dtype, batch=1, seq=2048, rank=16, slice_floats=None, loss_chunk=None,
            num_layers=None, mlp_chunk_mib=None, shared_blocks=False):
    """One fresh process: load (`kind` "load" streamed, "old" float then quantize_base) or a QLoRA step."""
    import tensorflow as tf

    import zoo

    if kind == "write":  # its own process: a child's ru_maxrss starts at its parent's RSS when it was forked
        write_checkpoint(name, folder, num_layers=num_layers)
        return {}
    if slice_floats:
        zoo.quantization.QUANTIZE_SLICE = slice_floats
    set_mlp_chunk(mlp_chunk_mib)

    tf.config.experimental.reset_memory_stats("CPU:0")
    start = time.perf_counter()
    if kind == "old":
        model = zoo.hub.load(folder, dtype=dtype, tokenizer=False)
        zoo.quantization.quantize_base(model, quantize)
    else:
        checkpointing = "full" if kind == "step" else None
        model = zoo.hub.load(folder, dtype=dtype, tokenizer=False, quantize=quantize, checkpointing=checkpointing)
    load_s = time.perf_counter() - start
    memory = tf.config.experimental.get_memory_info("CPU:0")
    out = {"load_s": load_s, "load_rss_gib": _harness.peak_rss_gib(), "load_alloc_peak_gib": memory["peak"] / GiB,
           "model_gib": sum(v.numpy().nbytes for v in model.weights) / GiB,
           # where the RSS above the allocator is: resident now, against the allocator's bytes in use now
           "rss_after_load_gib": _harness.rss_gib(), "alloc_after_load_gib": memory["current"] / GiB}
    if kind != "step":
        return out
    import keras
    from _training import synthetic_batch, train_steps

    zoo.lora.enable_lora(model, rank=rank, alpha=2 * rank, targets="all-linear")
    model.set_loss_chunk(loss_chunk)  # None: the chunked loss's default, as `zoo train` takes it
    model.set_shared_blocks(shared_blocks)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4, global_clipnorm=1.0),
                  loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, jit_compile=False)
    x, y = synthetic_batch(name, batch, seq)
    with _harness.PeakMemory() as mem, _harness.Timeline() as line:
        times, _, losses = train_steps(model, x, y, 1)
    return {**out, "alloc_peak_gib": mem.peak_gib, "step_mem_gib": mem.step_gib, "peak_rss_gib": mem.rss_gib,
            "rss_after_step_gib": _harness.rss_gib(), "memory_measure": mem.measure, "step_s": times[0],
            "losses": losses, "timeline": line.points()}


def plan(name, quantize, dtype):
    from zoo import memory

    return memory.loading_peak(name, quantize=quantize, precision=dtype) / GiB


def set_mlp_chunk(mib):
    """`--mlp-chunk-mib`: zoo.ops.position_chunks' cap on one chunk of the replayed MLP (0: the MLP whole, as before
    chunking existed); None leaves the library's. Set in the child that measures and in the parent that plans."""
    from zoo.ops import position_chunks

    if mib is not None:
        position_chunks.CHUNK_BYTES = int(mib * 2**20) if mib > 0 else 2**62


def planned_step(name, quantize, dtype, batch, seq, rank=16, loss_chunk=None, num_layers=None):
    """(allocator GiB, RSS GiB): zoo.memory.estimate of the step `measure` takes (the allocator's peak, the built
    model included) and zoo.memory.step_resident of its process (the peak RSS); `num_layers`: at reduced depth."""
    from zoo import memory

    spec = spec_of(name, num_layers)
    step = memory.estimate(spec, batch, seq, dtype, "full", loss_chunk=loss_chunk, lora_rank=rank,
                           lora_targets="all-linear", quantize=quantize)
    return step.total / GiB, memory.step_resident(spec, step, "causal_lm", quantize, dtype).total / GiB


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["load", "step", "ladder"])
    p.add_argument("--model", default="dec-1b")
    p.add_argument("--quantize", default="int4", choices=["int8", "int4"])
    p.add_argument("--dtype", default="mixed_bfloat16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--old", action="store_true", help="also load in float, then quantize (before issue 36)")
    p.add_argument("--folder", default=None, help="where to write the checkpoint (default: a temporary folder)")
    p.add_argument("--slice", type=int, default=None, help="floats quantized at once (zoo.checks.QUANTIZE_SLICE)")
    p.add_argument("--reuse", action="store_true", help="with --folder: keep the checkpoint, and reuse one there")
    p.add_argument("--loss-chunk", type=int, default=None, help="step: positions per loss chunk (default: the loss's)")
    p.add_argument("--shared-blocks", action="store_true",
                   help="step, ladder: every layer through one traced block (ZooModel.set_shared_blocks)")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768", help="ladder: sequence lengths")
    p.add_argument("--num-layers", type=int, default=1, help="ladder: the depth measured (the rest is planned)")
    p.add_argument("--measure-up-to", type=int, default=16384, help="ladder: longest length measured")
    p.add_argument("--rss-limit", type=float, default=20.0, help="ladder: GiB of RSS the longest context must fit")
    p.add_argument("--mlp-chunk-mib", type=float, default=None,
                   help="step, ladder: cap on one chunk of the replayed MLP (zoo.ops.position_chunks.CHUNK_BYTES, "
                        "default the library's); 0: the MLP whole")
    a = p.parse_args()
    if a.mlp_chunk_mib is not None and a.mlp_chunk_mib < 0:
        p.error(f"--mlp-chunk-mib {a.mlp_chunk_mib:g}: give a positive cap in MiB, or 0 to run the MLP whole.")
    set_mlp_chunk(a.mlp_chunk_mib)
    if a.what == "ladder":
        return ladder(a)

    root = Path(a.folder or tempfile.mkdtemp(prefix="zoo-big-"))
    folder = root / a.model
    try:
        start = time.perf_counter()
        if not (a.reuse and (folder / "config.json").is_file()):
            shutil.rmtree(folder, ignore_errors=True)
            written = _harness.run_child({"kind": "write", "name": a.model, "folder": str(folder), "quantize": None,
                                          "dtype": None}, timeout=a.timeout)
            if not written.ok:
                raise SystemExit(f"writing the checkpoint failed: {written.error}")
        write_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / GiB
        print(f"{a.model}: wrote {size:.2f} GiB of bfloat16 safetensors in {write_s:.0f} s", flush=True)
        kinds = ["step"] if a.what == "step" else (["load", "old"] if a.old else ["load"])
        rows = {}
        for kind in kinds:
            run = _harness.run_child({"kind": kind, "name": a.model, "folder": str(folder), "quantize": a.quantize,
                                      "dtype": a.dtype, "batch": a.batch, "seq": a.seq,
                                      "slice_floats": a.slice, "loss_chunk": a.loss_chunk,
                                      "mlp_chunk_mib": a.mlp_chunk_mib, "shared_blocks": a.shared_blocks},
                                     timeout=a.timeout)
            rows[kind] = {**run.result, "status": run.status if run.ok else f"{run.status}: {run.error}",
                          "guard_rss_gib": run.peak_rss_bytes / GiB}
            r = rows[kind]
            step = (f"; step {r['step_s']:.0f} s, allocator peak {r['alloc_peak_gib']:.2f} GiB, "
                    f"RSS {r['peak_rss_gib']:.2f} GiB") if "step_s" in r else ""
            print(f"{kind:5s} {r['status']}: load {r.get('load_s', 0):.0f} s, peak RSS {r.get('load_rss_gib', 0):.2f} "
                  f"GiB (sampled {r['guard_rss_gib']:.2f}), allocator peak {r.get('load_alloc_peak_gib', 0):.2f} GiB, "
                  f"model {r.get('model_gib', 0):.2f} GiB{step}", flush=True)
        result = {"model": a.model, "quantize": a.quantize, "dtype": a.dtype, "checkpoint_gib": size, "rows": rows,
                  "planned_loading_peak_gib": plan(a.model, a.quantize, a.dtype)}
        if a.what == "step":
            result["planned_step_gib"], result["planned_step_rss_gib"] = planned_step(
                a.model, a.quantize, a.dtype, a.batch, a.seq, loss_chunk=a.loss_chunk)
            from zoo.ops import position_chunks

            result["loss_chunk"], result["mlp_chunk_bytes"] = a.loss_chunk, position_chunks.CHUNK_BYTES
            result["shared_blocks"] = a.shared_blocks
            r = rows["step"]
            print(f"planned step: allocator peak {result['planned_step_gib']:.2f} GiB (measured "
                  f"{r.get('alloc_peak_gib', float('nan')):.2f}), peak RSS {result['planned_step_rss_gib']:.2f} GiB "
                  f"(measured {r.get('peak_rss_gib', float('nan')):.2f})")
        print(f"planned loading peak {result['planned_loading_peak_gib']:.2f} GiB")
        print(json.dumps(result))
    finally:
        if not a.reuse:
            shutil.rmtree(folder, ignore_errors=True)
        if a.folder is None:
            shutil.rmtree(root, ignore_errors=True)


def ladder(a):
    """The context ladder (issue 44): the QLoRA step's allocator peak and peak RSS at each length, measured at
    `--num-layers` blocks in a fresh process per length and extrapolated to full depth with the planner (the
    measured figure + the full model's plan - the reduced model's plan: what the other blocks add, their held
    inputs, their weights and their traced graph); beyond `--measure-up-to` the plan alone."""
    import zoo

    depth, full_depth = a.num_layers, zoo.spec(a.model).num_layers
    root = Path(a.folder or tempfile.mkdtemp(prefix="zoo-ladder-"))
    folder = root / f"{a.model}-{depth}-blocks"
    budget = _harness.available_bytes() - int(1.0 * GiB)
    rows = []
    try:
        written = _harness.run_child({"kind": "write", "name": a.model, "folder": str(folder), "quantize": None,
                                      "dtype": None, "num_layers": depth}, timeout=a.timeout)
        if not written.ok:
            raise SystemExit(f"writing the checkpoint failed: {written.error}")
        print(f"{a.model} QLoRA r16 all-linear, {a.quantize}, full, {a.dtype}, batch {a.batch}: measured at {depth} of "
              f"{full_depth} blocks, extrapolated with zoo.memory's plan; budget {budget / GiB:.1f} GiB", flush=True)
        print(f"{'seq':>6s} {'plan GiB':>9s} {'plan RSS':>9s} | {'meas. GiB':>9s} {'meas. RSS':>9s} {'step s':>7s} | "
              f"{'extr. GiB':>9s} {'extr. RSS':>9s}  status", flush=True)
        for seq in map(int, a.lengths.split(",")):
            plan_full = planned_step(a.model, a.quantize, a.dtype, a.batch, seq, loss_chunk=a.loss_chunk)
            plan_part = planned_step(a.model, a.quantize, a.dtype, a.batch, seq, loss_chunk=a.loss_chunk,
                                     num_layers=depth)
            row = {"seq": seq, "planned_step_gib": plan_full[0], "planned_step_rss_gib": plan_full[1],
                   "reduced_planned_step_gib": plan_part[0], "reduced_planned_step_rss_gib": plan_part[1],
                   "status": "planned only"}
            if seq <= a.measure_up_to:
                run = _harness.run_child({"kind": "step", "name": a.model, "folder": str(folder),
                                          "quantize": a.quantize, "dtype": a.dtype, "batch": a.batch, "seq": seq,
                                          "loss_chunk": a.loss_chunk, "mlp_chunk_mib": a.mlp_chunk_mib,
                                          "shared_blocks": a.shared_blocks},
                                         budget_bytes=budget, timeout=a.timeout)
                row.update(run.result, status=run.status if run.ok else f"{run.status}: {run.error}",
                           guard_rss_gib=run.peak_rss_bytes / GiB)  # sampled from outside: a stopped row's too
                if run.ok:
                    row["extrapolated_step_gib"] = run.result["alloc_peak_gib"] + plan_full[0] - plan_part[0]
                    row["extrapolated_step_rss_gib"] = run.result["peak_rss_gib"] + plan_full[1] - plan_part[1]
            rows.append(row)
            print(f"{seq:6d} {_cell(row, 'planned_step_gib')} {_cell(row, 'planned_step_rss_gib')} | "
                  f"{_cell(row, 'alloc_peak_gib')} {_cell(row, 'peak_rss_gib')} {_cell(row, 'step_s', 7, 0)} | "
                  f"{_cell(row, 'extrapolated_step_gib')} {_cell(row, 'extrapolated_step_rss_gib')}  {row['status']}",
                  flush=True)
    finally:
        if a.folder is None:
            shutil.rmtree(root, ignore_errors=True)
    # the plan is not the measure: beyond the measured rows it is reported apart (docs/memory.md: it plans long
    # contexts low at these shapes)
    measured = max((r["seq"] for r in rows if r.get("extrapolated_step_rss_gib", a.rss_limit + 1) <= a.rss_limit),
                   default=None)
    planned = max((r["seq"] for r in rows if r["planned_step_rss_gib"] <= a.rss_limit), default=None)
    print(f"longest context within {a.rss_limit:g} GiB of RSS: {measured} measured and extrapolated; {planned} by the "
          "plan alone")
    from zoo.ops import position_chunks

    print(json.dumps({"benchmark": "context_ladder", "model": a.model, "quantize": a.quantize, "dtype": a.dtype,
                      "mlp_chunk_bytes": position_chunks.CHUNK_BYTES,
                      "batch": a.batch, "measured_blocks": depth, "blocks": full_depth, "rss_limit_gib": a.rss_limit,
                      "longest_measured": measured, "longest_planned": planned, "rows": rows}))


def _cell(row, key, width=9, digits=2) -> str:
    return f"{row[key]:{width}.{digits}f}" if key in row else f"{'-':>{width}s}"


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
