"""What every benchmark shares: the repository on `sys.path`, one child-process
harness and one memory measurement.

Each benchmark runs as `python benchmarks/NAME.py` from a clone and starts with
`import _harness` (isort keeps it above `zoo`, `recipes` and `tools`, and above
TensorFlow, whose logging it quietens). Importing it puts the repository root
first on `sys.path`, so the clone's `zoo` and `tools` are the ones imported.

A benchmark that measures in fresh processes calls `run_child(variant)` in the
parent and ends with `if not _harness.child_main(measure): main()`: the child
runs `measure(**variant)` and prints its result as one JSON line.

`fetch` is the repository's asset fetcher, `tools.assets.fetch` (docs/assets.md).
"""

import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the CPU allocator's statistics (zoo/__init__.py)

from tools.assets import fetch

__all__ = [
    "GiB", "ChildRun", "PeakMemory", "available_bytes", "call_seconds", "child_main", "fetch", "median_seconds",
    "peak_rss_gib", "print_metrics", "TreePeak", "run_child", "run_if_it_fits", "status_bytes", "training_flags",
    "tree_rss_bytes", "zoo_cli",
]

GiB = 2**30
CHILD_FLAG = "--child"
POLL_SECONDS = 0.2
STDERR_CHARS = 3000  # the end of a child's stderr kept for reports


@dataclass
class ChildRun:
    """What `run_child` saw of one child process.

    `status` is "ok", "error", "killed by guard" (its RSS passed the budget) or
    "timed out"; `result` is the child's JSON line (empty unless ok), `stderr`
    the end of its standard error, and `peak_rss_bytes` its largest resident
    memory as sampled from outside every 0.2 s.
    """

    status: str
    result: dict = field(default_factory=dict)
    stderr: str = ""
    peak_rss_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def error(self) -> str:
        """The last line of the child's stderr (what went wrong, for a table cell)."""
        return (self.stderr.strip().splitlines() or ["no output"])[-1]


def rss_bytes(pid: int) -> int:
    """Resident memory of a running process (0 once it has gone)."""
    return status_bytes("VmRSS", pid)


def tree_rss_bytes(pid) -> int:
    """Resident memory of a process and every process it started (a zoo export's fresh
    conversion processes count toward the variant that started them)."""
    return sum(rss_bytes(p) for p in process_tree(pid))


def process_tree(pid) -> list:
    """`pid` and its descendants, from /proc/PID/task/*/children."""
    tree, todo = [], [str(pid)]
    while todo:
        current = todo.pop()
        tree.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(task.read_text().split())
            except OSError:
                pass
    return tree


class TreePeak:
    """The largest RSS of this process and the processes it starts,
    sampled every 50 ms over a block; `peak` in bytes."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_bytes("VmHWM"))  # this process's own peak, never missed
        return False


def call_seconds(fn, runs, warmup=1) -> list:
    """The wall time of each of `runs` calls of `fn`, after `warmup` untimed calls (tracing, allocation)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(fn, runs) -> float:
    """The median of `runs` timed calls of `fn` after one untimed call."""
    return statistics.median(call_seconds(fn, runs))


def status_bytes(key: str, pid="self") -> int:
    """A memory line of /proc/PID/status in bytes ("VmRSS", "VmHWM": the peak since start or since
    it was reset by writing 5 to /proc/self/clear_refs); 0 once the process has gone. zoo.memory.measure reads it
    the same way; this copy keeps a benchmark's parent, which only watches its children, free of TensorFlow
    (importing any zoo module imports zoo, and zoo TensorFlow)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def run_child(variant: dict, budget_bytes=None, timeout=None, env=None) -> ChildRun:
    """Run `measure(**variant)` of the running benchmark in a fresh process.

    The child is `python SCRIPT --child JSON`, where SCRIPT is the benchmark that
    called this and which hands `--child` to `child_main`. A watcher samples the
    child's resident memory (with the processes it starts) and kills them before it passes `budget_bytes`, so a
    variant that cannot fit is reported, never left to the kernel's OOM killer.

    Args:
        variant: the keyword arguments of the benchmark's `measure`, JSON-serialisable.
        budget_bytes: kill the child once its RSS passes this; None: no limit.
        timeout: kill the child after this many seconds; None: no limit.
        env: more environment variables for the child (e.g. a worker's TF_CONFIG).

    Returns:
        A `ChildRun`: the status, the child's JSON result, and its peak RSS.
    """
    script = os.path.abspath(sys.modules["__main__"].__file__)
    cmd = [sys.executable, script, CHILD_FLAG, json.dumps(variant)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    start, seen = time.monotonic(), {"peak": 0, "stop": None}

    def watch():
        while proc.poll() is None:
            rss = tree_rss_bytes(proc.pid)
            seen["peak"] = max(seen["peak"], rss)
            if budget_bytes is not None and rss > budget_bytes:
                seen["stop"] = "killed by guard"
            elif timeout is not None and time.monotonic() - start > timeout:
                seen["stop"] = "timed out"
            if seen["stop"]:
                for pid in reversed(process_tree(proc.pid)):  # the processes it started first
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                return
            time.sleep(POLL_SECONDS)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    status = seen["stop"] or ("error" if proc.returncode or not lines else "ok")
    return ChildRun(status, result=json.loads(lines[-1]) if status == "ok" else {}, stderr=err[-STDERR_CHARS:],
                    peak_rss_bytes=seen["peak"])


def available_bytes() -> int:
    """The memory the kernel says is available now (MemAvailable)."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemAvailable"]


def run_if_it_fits(variant: dict, estimate_bytes: int, budget_bytes: int, timeout=None) -> dict:
    """`run_child(variant)` if the planner's estimate fits the budget (the guard still
    watches RSS), else a row saying it was skipped; either way a dict with `status`
    ("ok", "skipped: ...", "killed by guard: ...", ...) and, when run, `guard_rss_gib`."""
    if estimate_bytes > budget_bytes:
        return {"status": f"skipped: estimate {estimate_bytes / GiB:.1f} GiB > budget {budget_bytes / GiB:.1f} GiB"}
    run = run_child(variant, budget_bytes=budget_bytes, timeout=timeout)
    return {**run.result, "status": "ok" if run.ok else f"{run.status}: {run.error}",
            "guard_rss_gib": run.peak_rss_bytes / GiB}


def child_main(measure) -> bool:
    """In a child started by `run_child`, print `measure(**variant)` as one JSON line.

    Args:
        measure: the benchmark's function that measures one variant in this process.

    Returns:
        True in a child (after printing), False in the parent, which goes on to its `main`.
    """
    if sys.argv[1:2] != [CHILD_FLAG]:
        return False
    print(json.dumps(measure(**json.loads(sys.argv[2]))), flush=True)
    return True


def peak_rss_gib() -> float:
    """The largest resident memory of this process so far, in GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB


def rss_gib() -> float:
    """This process's resident memory now, in GiB (/proc/self/statm: pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GiB


class PeakMemory:
    """The peak memory over a block, above its level at the start, and peak RSS (zoo.memory.PeakMemory underneath).

        with PeakMemory() as mem:
            model.train_on_batch(x, y)
        mem.step_gib, mem.base_gib, mem.peak_gib, mem.rss_gib, mem.measure

    TensorFlow's allocator peak where the process keeps its statistics (every CPU under `import zoo`), else peak
    RSS; `measure` says which, and every benchmark's JSON line carries it. RSS never shrinks under TF's pooling
    allocator, so the allocator's peak above `base` (what the block itself allocated) is the measure of a step;
    `rss_gib` is the process's whole footprint.

    Args:
        device: the TensorFlow device whose allocator is read.
    """

    def __init__(self, device="CPU:0"):
        self.device = device
        self.base_gib = self.peak_gib = self.step_gib = self.rss_gib = self.measure = None

    def __enter__(self):
        from zoo.memory import PeakMemory as Measured

        self._measured = Measured(self.device).reset()
        self.base_gib, self.measure = self._measured.start_bytes / GiB, self._measured.measure
        return self

    def __exit__(self, *exc):
        self._measured.read()
        self.peak_gib = self._measured.peak_bytes / GiB
        self.step_gib = self.peak_gib - self.base_gib
        self.rss_gib = peak_rss_gib()
        return False


class Timeline:
    """The allocator's bytes in use and the RSS, sampled every `every` seconds from a thread while a block runs:
    where in a step its peak falls (a graph step is one call; the allocator's peak alone does not say when).

        with Timeline() as line:
            model.train_on_batch(x, y)
        line.points(40)  # [[seconds, allocator GiB, RSS GiB], ...]: the highest sample in each of 40 slices
    """

    def __init__(self, device="CPU:0", every=0.25):
        self.device, self.every, self.samples = device, every, []

    def __enter__(self):
        import tensorflow as tf

        self._stop, start = threading.Event(), time.perf_counter()

        def sample():
            while not self._stop.wait(self.every):
                current = tf.config.experimental.get_memory_info(self.device)["current"]
                self.samples.append((time.perf_counter() - start, current / GiB, rss_gib()))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def points(self, slices=40) -> list:
        if not self.samples:
            return []
        end = self.samples[-1][0]
        out = {}
        for t, alloc, rss in self.samples:
            k = min(int(t / end * slices), slices - 1) if end else 0
            if k not in out or alloc > out[k][1]:
                out[k] = [round(t, 1), round(alloc, 3), round(rss, 3)]
        return [out[k] for k in sorted(out)]


def zoo_cli(*args, timeout=None) -> tuple:
    """Run `python -m zoo.cli ARGS` as a user would; returns (seconds, stdout, its last line as JSON).

    Args:
        *args: the command line after `zoo`.
        timeout: seconds before the command is killed (None: no limit).

    Returns:
        (wall seconds, the whole stdout, the final JSON line parsed).
    """
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "zoo.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise RuntimeError(f"zoo {' '.join(map(str, args))} failed:\n{done.stderr[-STDERR_CHARS:]}")
    return time.perf_counter() - started, done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


def training_flags(parser, steps, batch_size, sequence_length, learning_rate, precision="mixed_bfloat16"):
    """Add the `zoo train` flags a fine-tuning benchmark exposes, with its defaults.

    Args:
        parser: an `argparse.ArgumentParser`.
        steps, batch_size, sequence_length, learning_rate, precision: the defaults.

    Returns:
        The flags as `zoo train` arguments, once parsed: `flags(args) -> list`.
    """
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--sequence-length", type=int, default=sequence_length)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--learning-rate", type=float, default=learning_rate)
    parser.add_argument("--precision", default=precision)
    parser.add_argument("--lora-rank", type=int, help="train LoRA adapters of this rank (benchmarks/lora.py)")
    parser.add_argument("--lora-targets", help="with --lora-rank: projections or all-linear")
    parser.add_argument("--quantize", help="with --lora-rank: int8 or int4 (the frozen base)")

    def flags(args):
        lora = [(f"--{name.replace('_', '-')}", getattr(args, name)) for name in ("lora_rank", "lora_targets",
                                                                                 "quantize")]
        return ["--steps", args.steps, "--batch-size", args.batch_size, "--sequence-length", args.sequence_length,
                "--learning-rate", args.learning_rate, "--precision", args.precision,
                "--log-every", max(1, args.steps // 4), "--checkpoint-every", args.steps,
                *[part for flag, value in lora if value is not None for part in (flag, value)]]

    return flags


def print_metrics(result: dict):
    """A one-row-per-metric table, then the same dict as the benchmark's one JSON line."""
    print("| metric | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value} |")
    print(json.dumps(result))
