"""Why a deep model's process holds more than TensorFlow's allocator: the heap a step's graph takes when it is first
run grows with the number of blocks, unless the blocks are one function that TensorFlow does not inline.

    python benchmarks/block_heap.py                      # 3 ways x 4, 12, 24 blocks, one fresh process per row

Issue 44 measured dec-1b's shape (6 layers, int4 + LoRA, 1 x 2048): the heap grew 0.11 GiB while the step was
traced and 0.27 while it was instantiated (Grappler, the executor), 0.07 GiB a layer in all (docs/memory.md). This
benchmark isolates that cause in plain TensorFlow, with no Keras and no zoo: N blocks (a normalised single-head
attention and an MLP, d=256, 512 positions, float32), forward and gradient in one traced step, built three ways:

- `inlined`: each block's ops traced into the step (what a Keras model's call does today);
- `shared`: one `tf.function` called N times; TensorFlow inlines every call when it instantiates the step;
- `noinline`: the same function with `experimental_attributes={"_noinline": True}`: instantiated once, called N times.

Per row: the step graph's ops, seconds to trace, first call (instantiation) and a later call, the heap's growth
(`[heap]` in /proc/self/smaps, after `malloc_trim`) while tracing and over the first call, what it keeps after
trimming, and TensorFlow's allocator peak (the tensors, not the heap). Prints a table and one JSON line with each
way's heap growth per block (the slope from the fewest to the most blocks).
"""

import argparse
import ctypes
import json
import os
import re
import time

import _harness  # the repository on sys.path, TensorFlow's logging quietened

MiB = 2**20
WAYS = ("inlined", "shared", "noinline")
HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def heap_bytes() -> int:
    """Resident bytes of this process's `[heap]` mapping (glibc's main arena)."""
    total, in_heap = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if HEADER.match(line):
                in_heap = line.rstrip().endswith("[heap]")
            elif in_heap and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def measure(way, blocks, width=256, positions=512):
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "1"  # tensors in the allocator's pool, apart from the heap
    import tensorflow as tf

    trim = ctypes.CDLL("libc.so.6").malloc_trim
    tf.random.set_seed(0)
    weights = [[tf.Variable(tf.random.normal(shape) * 0.02)
                for shape in ((width, 3 * width), (width, width), (width, 4 * width), (4 * width, width))]
               for _ in range(blocks)]

    def block(x, qkv, out, up, down):
        q, k, v = tf.split(tf.matmul(tf.nn.l2_normalize(x, -1), qkv), 3, -1)
        x = x + tf.matmul(tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / width**0.5), v), out)
        return x + tf.matmul(tf.nn.gelu(tf.matmul(tf.nn.l2_normalize(x, -1), up)), down)

    if way != "inlined":
        block = tf.function(block, experimental_attributes={"_noinline": True} if way == "noinline" else None)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            for w in weights:
                x = block(x, *w)
            loss = tf.reduce_mean(tf.square(x))
        return tape.gradient(loss, [v for w in weights for v in w])

    x = tf.random.normal((positions, width))
    trim(0)
    before = heap_bytes()
    began = time.perf_counter()
    ops = len(step.get_concrete_function(x).graph.get_operations())
    trace_s = time.perf_counter() - began
    trim(0)
    traced = heap_bytes()
    tf.config.experimental.reset_memory_stats("CPU:0")
    began = time.perf_counter()
    step(x)
    first_s = time.perf_counter() - began
    first = heap_bytes()
    began = time.perf_counter()
    step(x)
    step_s = time.perf_counter() - began
    trim(0)
    return {"way": way, "blocks": blocks, "ops": ops, "trace_s": round(trace_s, 2), "first_call_s": round(first_s, 2),
            "step_s": round(step_s, 2), "heap_trace_mib": round((traced - before) / MiB, 1),
            "heap_first_call_mib": round((first - traced) / MiB, 1),
            "heap_kept_mib": round((heap_bytes() - before) / MiB, 1),
            "allocator_peak_mib": round(tf.config.experimental.get_memory_info("CPU:0")["peak"] / MiB, 1),
            "rss_gib": round(_harness.rss_gib(), 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 12, 24])
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = parser.parse_args()
    rows = []
    for way in args.ways:
        for blocks in args.blocks:
            run = _harness.run_child({"way": way, "blocks": blocks}, timeout=600)
            if not run.ok:
                raise SystemExit(f"{way} x {blocks}: {run.status}\n{run.stderr}")
            rows.append(run.result)
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    slopes = {}
    for way in args.ways:
        low, high = (min((r for r in rows if r["way"] == way), key=lambda r: r["blocks"]),
                     max((r for r in rows if r["way"] == way), key=lambda r: r["blocks"]))
        span = max(high["blocks"] - low["blocks"], 1)
        slopes[way] = {key: round((high[key] - low[key]) / span, 3)
                       for key in ("heap_first_call_mib", "heap_kept_mib", "allocator_peak_mib", "step_s")}
    print("per block, from the fewest to the most blocks: "
          + "; ".join(f"{way}: first call +{s['heap_first_call_mib']} MiB heap, kept +{s['heap_kept_mib']} MiB"
                      for way, s in slopes.items()))
    print(json.dumps({"benchmark": "block_heap", "rows": rows, "per_block": slopes}))


if __name__ == "__main__" and not _harness.child_main(measure):
    main()
