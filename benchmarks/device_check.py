"""One prepared check for the first accelerator: exactness on the device, where ops run, speed and memory,
and the environment. It runs the same on a CPU and a GPU, keeps going past a part that fails, and writes a
table and a JSON file (docs/benchmarks.md: Device check).

    python benchmarks/device_check.py --out device_check.json      # everything (GPU: nothing starts after --budget 480)
    python benchmarks/device_check.py --quick                       # tiny shapes, no XLA part (CI: ~20-30 s of CPU)
    python benchmarks/device_check.py --parts exact,placement       # some parts (names or their group before ':')
    python benchmarks/device_check.py --parts speed:dec-1b-fused    # a part the CPU skips unless it is asked for

Parts (each a small function; the runner records its name, ok/failed/skipped, seconds and detail):
- `environment`: TensorFlow, Keras, keras-hub versions; the devices and the GPU's name and compute capability
  (and nvidia-smi's line, with the driver); the CUDA/cuDNN versions TensorFlow was built with; soft placement.
- `kernels:held-masks`: every (op, dtype) in the held dropout masks' packing and unpacking
  (zoo.ops.dropout.pack_bits/unpack_bits), and whether this TensorFlow build registers a GPU kernel for it
  (its kernel registry, so the answer needs no GPU).
- `exact:*`: the project's own exactness checks, each tiny, run on whatever device TensorFlow places them on:
  a subset of the gradient matrix (tests/zoo/test_recompute.py: `full` and `selective` against plain `none`,
  dropout 0.1, padding masked, under tf.function and XLA, and mixed_bfloat16), held masks equal redrawn ones,
  the fused update equals `fit`, LoRA on an int4 base, the chunked loss equals the whole logits' loss (--quick runs
  the gradient subset and the held masks; the last three it only looks up, as CI runs them in their own files).
- `placement:*`: a `full` step and a fused step (a tiny decoder, mixed_bfloat16, dropout on) traced and run in a
  fresh process with device placement logged: node counts by device and, where a GPU exists, which ops and
  nodes landed on the CPU; and, from the kernel registry, the step's ops that have no GPU kernel for their dtype.
- `speed:*`: dec-base 4 x 512 mixed_bfloat16 (`none`, `full`, `full+fused`) beside keras-hub's backbone in the
  same run, tokens/s and the allocator's peak (GPU:0 on a GPU), graph mode; dec-1b 8 x 512 `full+fused`
  (skipped on a CPU unless asked for); the dec-base rows again with `jit_compile=True` (not in --quick,
  nor is the XLA gradient part: tests/zoo/test_recompute.py checks XLA). Each row is
  benchmarks/speed.py's `measure` in a fresh process (--quick: in this one), with the planner's estimate
  (`zoo.memory.estimate`) beside its peak. On a GPU no row starts after the budget, and a row's process is
  killed after ROW_TIMEOUT_S or LAST_PART_S past the budget.

Keras compiles with `jit_compile="auto"`, which turns XLA on wherever a GPU is present: every speed row sets
what "auto" resolves to, so the graph rows stay graph rows on a GPU.
Exit status 1 when a part failed.
"""

import argparse
import contextlib
import ctypes
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter

import _harness
from _harness import GiB

# Each row's process takes GPU memory as it needs it (TensorFlow's default reserves nearly all of a GPU at its
# first op, which would leave none to the rows' own processes); the allocator's peak counts bytes in use either way.
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

TINY_NAME = "device-check-tiny"  # the decoder --quick and the placement parts build (registered in each process)
TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, num_kv_heads=2, intermediate_dim=128, vocab_size=128,
            dropout=0.1)
RTOL = 1e-5  # the gradient matrix's tolerance (tests/zoo/test_recompute.py)
NAMES_SHOWN = 20  # node names listed per op type that landed on the CPU
PART_DETAIL_CHARS = 160  # the detail column of the printed table
BUDGET_S = 480  # no part starts after this: a GPU run ends inside 10 minutes (a speed row may take 2)
ROW_TIMEOUT_S = 300  # on a GPU a speed row's process is killed after this (an XLA compilation that never ends)
LAST_PART_S = 90  # and a row started before the deadline is killed this long after it


class Skipped(Exception):
    """A part that does not run here (say why)."""


class PartFailed(Exception):
    """A part that failed but measured something: `detail` is kept beside the message."""

    def __init__(self, message, detail):
        super().__init__(message)
        self.detail = detail


PARTS = {}  # name -> function(quick) -> detail dict


def part(name):
    def register(fn):
        PARTS[name] = fn
        return fn

    return register


def on_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))


def accelerator():
    """"GPU:0" where TensorFlow sees a GPU, else "CPU:0": the device whose allocator is read."""
    return "GPU:0" if on_gpu() else "CPU:0"


def register_tiny():
    """The tiny decoder --quick and the placement parts build, under its own name (speed.py takes a name)."""
    import zoo

    if TINY_NAME not in zoo.names():
        zoo.register(TINY_NAME, zoo.spec("dec-base").replace(**TINY))


def project_tests(name):
    """A module of the project's tests (tests/zoo/NAME.py): the exactness parts run its checks as they are."""
    import importlib

    return importlib.import_module(f"tests.zoo.{name}")


def project_check(module, test, *args, quick=False):
    """tests/zoo/MODULE.py's TEST(*args), run here. Under --quick it is only looked up and its arguments bound to
    its signature (a renamed test or changed parameters fail the part), then skipped: CI runs it in its own file."""
    import inspect

    check = getattr(project_tests(module), test)
    inspect.signature(check).bind(*args)
    if quick:
        raise Skipped(f"not in --quick: CI runs it in tests/zoo/{module}.py")
    check(*args)


# ---------------------------------------------------------------------------------------------- environment


@part("environment")
def environment(quick):
    import keras
    import keras_hub
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    gpus = tf.config.list_physical_devices("GPU")
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "keras_hub": keras_hub.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "devices": [d.name for d in tf.config.list_logical_devices()],
            "gpus": [tf.config.experimental.get_device_details(g) for g in gpus],
            "cuda_build": build.get("is_cuda_build"), "cuda_version": build.get("cuda_version"),
            "cudnn_version": build.get("cudnn_version"),
            "cuda_compute_capabilities": build.get("cuda_compute_capabilities"),
            "soft_device_placement": tf.config.get_soft_device_placement(), "nvidia_smi": nvidia_smi()}


def nvidia_smi():
    """The driver's view of the GPUs (name, driver, memory), or None where there is no nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                           "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr.strip()


# ---------------------------------------------------------------------------- the kernel registry, statically

GPU_DEVICE_TYPES = ("GPU", "DEFAULT")  # a DEFAULT kernel serves every device type


@functools.cache
def _kernels(op):
    """(device type, {attribute: allowed DataType enums}) of every kernel registered for `op`."""
    from tensorflow.python.framework import kernels

    return [(k.device_type, {c.name: set(c.allowed_values.list.type) for c in k.constraint})
            for k in kernels.get_registered_kernels_for_op(op).kernel]


def type_attrs(node) -> dict:
    """A NodeDef's type attributes, as {name: DataType enum}."""
    return {name: value.type for name, value in node.attr.items() if value.WhichOneof("value") == "type"}


def has_gpu_kernel(op, attrs) -> bool:
    """Whether a GPU (or DEFAULT) kernel is registered for `op` whose type constraints admit `attrs`."""
    return any(device in GPU_DEVICE_TYPES and all(attrs.get(name) in allowed for name, allowed in constraints.items()
                                                  if name in attrs)
               for device, constraints in _kernels(op))


def graph_nodes(graph_def):
    """Every NodeDef of a GraphDef and of the functions in its library (loop bodies, gradients, calls)."""
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def _signature(node):
    import tensorflow as tf

    return node.op, tuple(sorted((name, tf.dtypes.as_dtype(t).name) for name, t in type_attrs(node).items()))


def gpu_kernels(graph_def) -> dict:
    """{"OP(attr=dtype,...)": {"nodes": count, "gpu_kernel": bool, "names": some node names}} for every op
    signature in the graph."""
    found = {}
    for node in graph_nodes(graph_def):
        op, attrs = _signature(node)
        key = f"{op}({','.join(f'{n}={t}' for n, t in attrs)})"
        entry = found.setdefault(key, {"nodes": 0, "gpu_kernel": has_gpu_kernel(node.op, type_attrs(node)),
                                       "names": []})
        entry["nodes"] += 1
        if len(entry["names"]) < NAMES_SHOWN:
            entry["names"].append(node.name)
    return found


@part("kernels:held-masks")
def held_mask_kernels(quick):
    """The ops of a held mask's round trip (pack_bits, unpack_bits), each with its dtypes, against the registry."""
    import tensorflow as tf

    from zoo.ops import dropout

    keep = tf.TensorSpec([2, 3, 16, 16], tf.bool)
    graph = tf.function(lambda k: dropout.unpack_bits(dropout.pack_bits(k), tf.shape(k))).get_concrete_function(keep)
    ops = gpu_kernels(graph.graph.as_graph_def())
    missing = sorted(key for key, entry in ops.items() if not entry["gpu_kernel"])
    return {"ops": ops, "without_gpu_kernel": missing,
            "uint64_ops": sorted(key for key in ops if "uint64" in key)}


# --------------------------------------------------------------------------------------------- exactness


def gradients_against_none(variants, mode, dtype=None, reference_core="plain"):
    """tests/zoo/test_recompute.py's check on its tiny decoder (dropout 0.1, padding masked): each
    (policy, core) against `none` on `reference_core`, every variable within RTOL of its own scale."""
    recompute = project_tests("test_recompute")
    reference = recompute.gradients("dec-base", "none", mode, True, dtype=dtype, core=reference_core)
    for policy, core in variants:
        try:
            recompute.assert_same(reference, recompute.gradients("dec-base", policy, mode, True, dtype=dtype,
                                                                 core=core), rtol=RTOL)
        except AssertionError as error:
            where = f"{mode}, {dtype or 'float32'}"
            raise AssertionError(f"{policy}:{core} against none:{reference_core} ({where}): {error}") from None
    return {"mode": mode, "dtype": dtype or "float32", "rtol": RTOL,
            "compared": [f"{p}:{c} vs none:{reference_core}" for p, c in variants]}


@part("exact:gradients-function")
def gradients_function(quick):
    # --quick: the held masks' replay only (CI's tests/zoo/test_recompute.py traces the chunked core's variants)
    variants = [("full", "plain")] + ([] if quick else [("selective", "chunked"), ("full", "chunked")])
    return gradients_against_none(variants, "function")


@part("exact:gradients-xla")
def gradients_xla(quick):
    if quick:  # each variant is an XLA compilation of its own (~15 s of CPU at tiny shapes)
        raise Skipped("not in --quick: CI checks XLA gradients in tests/zoo/test_recompute.py (the jit case)")
    return gradients_against_none([("full", "plain"), ("selective", "chunked")], "jit")


@part("exact:gradients-bf16")
def gradients_bf16(quick):
    """The recomputed pass repeats the same half-precision ops on the same inputs: exact under mixed_bfloat16,
    against `none` on the same attention core (the cores round differently in bfloat16: test_recompute.py)."""
    if quick:
        raise Skipped("not in --quick (the float32 parts cover the wrappers)")
    plain = gradients_against_none([("full", "plain")], "function", "mixed_bfloat16", "plain")
    chunked = gradients_against_none([("selective", "chunked"), ("full", "chunked")], "function", "mixed_bfloat16",
                                     "chunked")
    return {**plain, "compared": plain["compared"] + chunked["compared"]}


@part("exact:held-masks")
def held_masks(quick):
    """Bits hold every pattern; what the replay reads back equals a fresh draw from the seed (test_layers.py)."""
    layers = project_tests("test_layers")
    layers.test_bits_hold_every_pattern_and_odd_sizes()
    layers.test_masks_held_as_bits_equal_the_redrawn_ones()
    return {"checked": ["test_bits_hold_every_pattern_and_odd_sizes", "test_masks_held_as_bits_equal_the_redrawn_ones"]}


@part("exact:fused-equals-fit")
def fused_equals_fit(quick):
    """Three AdamW steps with a global clip that triggers: the fused update's weights equal fit's (test_fused.py)."""
    project_check("test_fused", "test_fused_equals_fit_float32_with_a_global_clip", "llama", quick=quick)
    return {"checked": "test_fused_equals_fit_float32_with_a_global_clip[llama]", "rtol": 1e-6}


@part("exact:lora-int4")
def lora_int4(quick):
    """LoRA adapters on an int4 base: `full` gives `none`'s adapter gradients (test_lora.py)."""
    project_check("test_lora", "test_full_recomputation_gives_the_same_adapter_gradients", "dec-base", "int4",
                  quick=quick)
    return {"checked": "test_full_recomputation_gives_the_same_adapter_gradients[dec-base-int4]", "rtol": RTOL}


@part("exact:chunked-loss")
def chunked_loss(quick):
    """13 positions in chunks of 5, 5 and 3, tied head, eager and tf.function, with and without weights."""
    project_check("test_lm_loss", "test_equals_unchunked_fp32", True, 13, 5, quick=quick)
    return {"checked": "test_equals_unchunked_fp32[13-5-True]", "rtol": 1e-6}


# --------------------------------------------------------------------------------------------- placement

PLACED = re.compile(r"^(?P<node>\S+): \((?P<op>[^)]+)\): /job:\S*/device:(?P<device>[A-Z_]+):\d+$")
PLUMBING = ("_Arg", "_Retval", "_DeviceArg", "_DeviceRetval")  # function boundaries, on the caller's device


@contextlib.contextmanager
def stdout_to(log):
    """File descriptor 1 (where TensorFlow's placer printf's each node's device) into `log`."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(log.fileno(), 1)
    try:
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def placements(lines):
    """Placer lines -> counts by device, and the ops (with some node names) that landed on the CPU."""
    by_device, on_cpu, names = Counter(), Counter(), {}
    for line in lines:
        match = PLACED.match(line.strip())
        if not match or match["op"] in PLUMBING:
            continue
        by_device[match["device"]] += 1
        if match["device"] == "CPU":
            on_cpu[match["op"]] += 1
            names.setdefault(match["op"], []).append(match["node"])
    return {"nodes_by_device": dict(by_device), "ops_on_cpu": dict(on_cpu.most_common()),
            "cpu_node_names": {op: found[:NAMES_SHOWN] for op, found in names.items()}}


def placement_child(configs, batch, seq, precision):
    """In a fresh process (placement logging must be on before TensorFlow starts): for each config, the
    step traced (its ops against the kernel registry) and run once (the placer's log of where each node went)."""
    log = tempfile.TemporaryFile(mode="w+")
    steps = {}
    with stdout_to(log):
        import tensorflow as tf

        tf.debugging.set_log_device_placement(True)
        from _training import compiled_model, synthetic_batch

        register_tiny()
        x, y = synthetic_batch(TINY_NAME, batch, seq)
        for config in configs:
            policy, _, fused = config.partition("+")
            model = compiled_model(TINY_NAME, policy, precision, seq, optimizer="adamw", fused=bool(fused))
            data = (tf.nest.map_structure(tf.constant, x), tf.constant(y))
            step = tf.function(model.train_step)  # what fit traces (ZooModel.train_step picks the fused one)
            ops = gpu_kernels(step.get_concrete_function(data).graph.as_graph_def())
            ctypes.CDLL(None).fflush(None)
            start = log.tell()
            step(data)  # the first call places the traced step's nodes (and its functions')
            ctypes.CDLL(None).fflush(None)
            log.seek(start)
            placed = placements(log.read().splitlines())
            log.seek(0, os.SEEK_END)
            steps[config] = {**placed, "graph_nodes": sum(e["nodes"] for e in ops.values()),
                             "without_gpu_kernel": {k: e for k, e in ops.items() if not e["gpu_kernel"]}}
    return {"device": accelerator(), "steps": steps}


@functools.cache
def placement_run():
    """Both steps' placement, from one fresh process (the two parts share it)."""
    run = _harness.run_child({"kind": "placement", "configs": ["full", "full+fused"], "batch": 2, "seq": 16,
                              "precision": "mixed_bfloat16"}, timeout=600)
    if not run.ok:
        raise RuntimeError(f"placement child {run.status}: {run.error}")
    return run.result


def placement_of(config):
    result = placement_run()
    step = result["steps"][config]
    if not step["nodes_by_device"]:
        raise AssertionError("the placer logged no node of the step (is placement logging reaching stdout?)")
    return {"device": result["device"], **step}


@part("placement:full-step")
def placement_full(quick):
    return placement_of("full")


@part("placement:fused-step")
def placement_fused(quick):
    return placement_of("full+fused")


# ---------------------------------------------------------------------------------------- speed and memory

SPEED = {  # part -> (model, batch, seq, variants, jit_compile, runs on a CPU by default); in this order
    "speed:dec-base-bf16": ("dec-base", 4, 512, ("keras-hub", "none", "full", "full+fused"), False, True),
    "speed:dec-1b-fused": ("dec-1b", 8, 512, ("full+fused",), False, False),
    "speed:dec-base-bf16-xla": ("dec-base", 4, 512, ("keras-hub", "none", "full", "full+fused"), True, True),
}
QUICK_SPEED = {  # --quick: the tiny decoder, fewer rows, in this process; no XLA row (a compilation, seconds on a CPU)
    "speed:dec-base-bf16": (TINY_NAME, 2, 32, ("keras-hub", "full+fused")),
}
PRECISION = "mixed_bfloat16"


class ProcessPeak(_harness.PeakMemory):
    """speed.py's PeakMemory on the accelerator, keeping the peak from before its reset (the build's) too."""

    last = None

    def __init__(self, device=None):
        super().__init__(device or accelerator())

    def __enter__(self):
        import tensorflow as tf

        self.build_peak_bytes = tf.config.experimental.get_memory_info(self.device)["peak"]
        ProcessPeak.last = self
        return super().__enter__()


@contextlib.contextmanager
def patched(owner, name, value):
    """`owner.name = value` for a block, then as it was."""
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def speed_row(model, batch, seq, precision, variant, steps, jit_compile):
    """benchmarks/speed.py's row, with what compile's jit_compile="auto" resolves to set, and the allocator
    peak of the whole process on the accelerator (weights, optimizer, step: what the planner predicts).
    A fresh process per row (`_harness.run_child`), or this one under --quick (tiny rows, ~0 GiB)."""
    import speed
    import tensorflow as tf
    from keras.src.trainers import trainer

    register_tiny()
    device = accelerator()
    tf.config.experimental.reset_memory_stats(device)
    start = tf.config.experimental.get_memory_info(device)["current"]
    with patched(trainer.Trainer, "_resolve_auto_jit_compile", lambda self: jit_compile), \
            patched(speed._harness, "PeakMemory", ProcessPeak):
        row = speed.measure(model, batch, seq, precision, variant, steps)
    peak = max(ProcessPeak.last.build_peak_bytes, ProcessPeak.last.peak_gib * GiB)
    row.update(device=device, jit_compile=jit_compile, allocator_peak_gib=(peak - start) / GiB)
    return row


def in_process(fn, args) -> _harness.ChildRun:
    """`fn(**args)` here, reported as `_harness.run_child` reports a child (--quick's rows)."""
    try:
        return _harness.ChildRun("ok", fn(**args))
    except Exception as error:
        traceback.print_exc()
        return _harness.ChildRun("error", stderr=f"{type(error).__name__}: {error}")


def planner_gib(model, batch, seq, precision, variant):
    """The planner's estimate for a zoo row (None for keras-hub's)."""
    from zoo import memory

    if variant == "keras-hub":
        return None
    policy, _, fused = variant.partition("+")
    register_tiny()
    return memory.estimate(model, batch, seq, precision, policy, task="causal_lm", optimizer="adamw",
                           fused=bool(fused)).total / GiB


def speed_rows(name, quick, asked, deadline=None):
    """A speed part's rows, in order; on a GPU a row's process is killed after ROW_TIMEOUT_S, or sooner so as to
    end LAST_PART_S after the budget's deadline, and rows that would start past the deadline are skipped."""
    model, batch, seq, variants, jit, on_cpu = SPEED[name]
    if quick and name not in QUICK_SPEED:
        raise Skipped(f"not in --quick ({', '.join(QUICK_SPEED)} run the same rows at tiny shapes)")
    if quick:
        model, batch, seq, variants = QUICK_SPEED[name]
    elif not on_cpu and not on_gpu() and name not in asked:
        raise Skipped(f"{model} {batch} x {seq} on a CPU takes minutes a step: ask for it with --parts {name}")
    rows, hub = [], None
    for variant in variants:
        row = {"variant": variant, "planner_gib": planner_gib(model, batch, seq, PRECISION, variant)}
        left = None if deadline is None else deadline + LAST_PART_S - time.perf_counter()
        if deadline is not None and time.perf_counter() > deadline:
            rows.append({**row, "skipped": "the time budget (--budget) was spent before this row"})
            continue
        args = dict(model=model, batch=batch, seq=seq, precision=PRECISION, variant=variant, steps=2 if quick else 3,
                    jit_compile=jit)
        timeout = min(ROW_TIMEOUT_S, left if left is not None else ROW_TIMEOUT_S) if on_gpu() else None
        run = in_process(speed_row, args) if quick else _harness.run_child(dict(kind="speed", **args), timeout=timeout)
        if not run.ok:
            rows.append({**row, "error": f"{run.status}: {run.error}"})
            continue
        row.update({k: run.result[k] for k in ("model", "batch", "seq", "precision", "jit_compile", "device",
                                              "step_s", "first_step_s", "tokens_per_s", "step_mem_gib",
                                              "allocator_peak_gib", "loss")})
        if row["planner_gib"] and row["allocator_peak_gib"] > 0:
            row["planner_ratio"] = row["planner_gib"] / row["allocator_peak_gib"]
        hub = row if variant == "keras-hub" else hub
        row["speed_vs_keras_hub"] = row["tokens_per_s"] / hub["tokens_per_s"] if hub else None
        rows.append(row)
    errors = [f"{r['variant']}: {r['error']}" for r in rows if "error" in r]
    if errors:
        raise PartFailed("; ".join(errors), {"rows": rows})
    return {"rows": rows}


for _name in SPEED:
    part(_name)(lambda quick, asked=(), deadline=None, _name=_name: speed_rows(_name, quick, asked, deadline))


# ------------------------------------------------------------------------------------------------- runner


def selected(names):
    """Parts by name or by group ("exact" picks every exact:*); None: every part."""
    if not names:
        return list(PARTS)
    chosen = [p for p in PARTS if p in names or p.split(":")[0] in names]
    unknown = [n for n in names if not any(p == n or p.split(":")[0] == n for p in PARTS)]
    if unknown:
        raise SystemExit(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    return chosen


def run_part(name, quick, asked=(), deadline=None):
    """One part, its exception caught: {"part", "status": ok/failed/skipped, "seconds", "detail"}."""
    import keras

    started = time.perf_counter()
    try:
        if deadline is not None and started > deadline:
            raise Skipped("the time budget (--budget) was spent before this part")
        fn = PARTS[name]
        detail = fn(quick, asked, deadline) if name.startswith("speed:") else fn(quick)
        status = "ok"
    except Skipped as why:
        status, detail = "skipped", str(why)
    except PartFailed as error:
        status, detail = "failed", {"error": str(error), **error.detail}
    except Exception as error:  # recorded, and the next part runs
        status = "failed"
        detail = f"{type(error).__name__}: {error}"[:4000]
        traceback.print_exc()
    finally:
        keras.config.set_dtype_policy("float32")  # a part that set a global policy must not leak it
    return {"part": name, "status": status, "seconds": round(time.perf_counter() - started, 2), "detail": detail}


def run(names=None, quick=False, budget=None):
    """Every selected part in order; parts that would start after `budget` seconds are skipped."""
    asked, deadline = set(names or ()), None if budget is None else time.perf_counter() + budget
    return [run_part(name, quick, asked, deadline) for name in selected(names)]


def summary(result) -> str:
    """One table cell for a part's detail."""
    detail = result["detail"]
    if not isinstance(detail, dict):
        return str(detail)[:PART_DETAIL_CHARS]
    name = result["part"]
    if name == "environment":
        gpus = ", ".join(g.get("device_name", "?") for g in detail["gpus"]) or "no GPU"
        return (f"TF {detail['tensorflow']}, Keras {detail['keras']}, keras-hub {detail['keras_hub']}; {gpus}; "
                f"built for CUDA {detail['cuda_version']}, cuDNN {detail['cudnn_version']}")
    if name == "kernels:held-masks":
        return (f"{len(detail['ops'])} op signatures, {len(detail['uint64_ops'])} uint64; without a GPU kernel: "
                f"{', '.join(detail['without_gpu_kernel']) or 'none'}")
    if name.startswith("placement:"):
        cpu = ", ".join(f"{op} {n}" for op, n in list(detail["ops_on_cpu"].items())[:6])
        missing = ", ".join(detail["without_gpu_kernel"]) or "none"
        return (f"{detail['device']}: nodes by device {detail['nodes_by_device']}"
                + (f"; on CPU: {cpu}" if detail["device"] != "CPU:0" else "") + f"; no GPU kernel: {missing}")
    if name.startswith("speed:"):
        cells = [f"{r['variant']} {r['tokens_per_s']:.0f} tok/s" if "tokens_per_s" in r else
                 f"{r['variant']} {r.get('error') or r.get('skipped')}" for r in detail["rows"]]
        return "; ".join(cells)[:PART_DETAIL_CHARS]
    return ", ".join(f"{k} {v}" for k, v in detail.items())[:PART_DETAIL_CHARS]


def cell(value, digits=2):
    return f"{value:.{digits}f}" if isinstance(value, float) else ("-" if value is None else str(value))


SPEED_COLUMNS = ("part", "model", "batch x seq", "variant", "jit", "device", "step s", "tokens/s", "x keras-hub",
                 "step GiB", "allocator peak GiB", "planner GiB", "planner / peak")


def print_tables(results):
    print("| part | status | s | detail |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['part']} | {r['status']} | {r['seconds']:.1f} | {summary(r)} |")
    rows = [(r["part"], row) for r in results if isinstance(r["detail"], dict) and r["part"].startswith("speed:")
            for row in r["detail"]["rows"] if "tokens_per_s" in row]
    if rows:
        print("\n| " + " | ".join(SPEED_COLUMNS) + " |\n" + "|---" * len(SPEED_COLUMNS) + "|")
        for name, row in rows:
            cells = [name, row["model"], f"{row['batch']} x {row['seq']}", row["variant"], row["jit_compile"],
                     row["device"], cell(row["step_s"]), cell(row["tokens_per_s"], 0), cell(row["speed_vs_keras_hub"]),
                     cell(row["step_mem_gib"]), cell(row["allocator_peak_gib"]), cell(row["planner_gib"]),
                     cell(row.get("planner_ratio"))]
            print("| " + " | ".join(map(str, cells)) + " |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes throughout (CI)")
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.add_argument("--parts", default=None, help=f"comma-separated names or groups; known: {', '.join(PARTS)}")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds after which no part starts, the rest recorded as skipped (default: {BUDGET_S} on a "
                        "GPU, none on a CPU)")
    a = p.parse_args(argv)
    started = time.perf_counter()
    budget = a.budget if a.budget is not None else (BUDGET_S if on_gpu() else None)
    results = run(a.parts.split(",") if a.parts else None, a.quick, budget)
    report = {"benchmark": "device_check", "quick": a.quick, "seconds": round(time.perf_counter() - started, 1),
              "results": results}
    print_tables(results)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(json.dumps(report, default=str))
    return 1 if any(r["status"] == "failed" for r in results) else 0


def measure(kind, **variant):
    """A child's row (`_harness.run_child`): a placement log or a speed row."""
    return {"placement": placement_child, "speed": speed_row}[kind](**variant)


if __name__ == "__main__":
    if not _harness.child_main(measure):
        sys.exit(main())
