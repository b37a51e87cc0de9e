"""Why a deep model's process holds more than TensorFlow's allocator: the heap a step's graph takes when it is first
run grows with the number of blocks, unless the blocks are one function that TensorFlow does not inline.

    python benchmarks/block_heap.py                      # 3 ways x 4, 12, 24 blocks, one fresh process per row
    python benchmarks/block_heap.py --model dec-1b --blocks 2 6 --positions 512   # the zoo's own blocks (~4 min)

Issue 44 measured dec-1b's shape (6 layers, int4 + LoRA, 1 x 2048): the heap grew 0.11 GiB while the step was
traced and 0.27 while it was instantiated (Grappler, the executor), 0.07 GiB a layer in all (docs/memory.md). This
benchmark isolates that cause in plain TensorFlow, with no Keras and no zoo: N blocks (a normalised single-head
attention and an MLP, d=256, 512 positions, float32), forward and gradient in one traced step, built three ways:

- `inlined`: each block's ops traced into the step (what a Keras model's call does today);
- `shared`: one `tf.function` called N times; TensorFlow inlines every call when it instantiates the step;
- `noinline`: the same function with `experimental_attributes={"_noinline": True}`: instantiated once, called N times.

`--model NAME` runs that model's own blocks instead (built straight into int4, LoRA r16 on every projection,
mixed_bfloat16, no recomputation; the gradient of the adapters): the first block's `stateless_call` on each
block's variables, traced into the step or in one `tf.function` (the int4 kernels are the zero placeholders a
checkpoint would fill: the graph, and so the heap, is the same).

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


def plain_blocks(tf, blocks, width, positions):
    """`blocks` TensorFlow blocks of `width`: (their variables' lists, the block function, an input)."""
    tf.random.set_seed(0)
    weights = [[tf.Variable(tf.random.normal(shape) * 0.02)
                for shape in ((width, 3 * width), (width, width), (width, 4 * width), (4 * width, width))]
               for _ in range(blocks)]

    def block(x, qkv, out, up, down):
        q, k, v = tf.split(tf.matmul(tf.nn.l2_normalize(x, -1), qkv), 3, -1)
        x = x + tf.matmul(tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / width**0.5), v), out)
        return x + tf.matmul(tf.nn.gelu(tf.matmul(tf.nn.l2_normalize(x, -1), up)), down)

    return weights, block, tf.random.normal((positions, width))


def zoo_blocks(tf, name, blocks, positions):
    """`name`'s first `blocks` blocks as `plain_blocks` gives them; the block function takes a block's trainable
    and frozen variables and runs the first block's `stateless_call` on them."""
    import dataclasses

    import zoo

    spec = dataclasses.replace(zoo.spec(name), num_layers=blocks)
    model = zoo.models.build(spec, task="causal_lm", checkpointing="none", dtype="mixed_bfloat16", quantize="int4")
    zoo.lora.enable_lora(model, rank=16, alpha=32, targets="all-linear")
    first, mask = model.backbone.blocks[0], tf.ones((1, positions), "int32")
    weights = [[b.trainable_variables, b.non_trainable_variables] for b in model.backbone.blocks]

    def block(x, trainable, frozen):
        return first.stateless_call(trainable, frozen, x, padding_mask=mask)[0]

    return weights, block, tf.cast(tf.random.normal((1, positions, spec.hidden_dim)), first.compute_dtype)


def measure(way, blocks, width=256, positions=512, model=None):
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "1"  # tensors in the allocator's pool, apart from the heap
    import tensorflow as tf

    trim = ctypes.CDLL("libc.so.6").malloc_trim
    if model is None:
        weights, block, x = plain_blocks(tf, blocks, width, positions)
        trainable = [v for w in weights for v in w]
    else:
        weights, block, x = zoo_blocks(tf, model, blocks, positions)
        trainable = [v for trainable, _ in weights for v in trainable]
    if way != "inlined":
        block = tf.function(block, experimental_attributes={"_noinline": True} if way == "noinline" else None)

    def read(values):  # a block's variables as tensors: read under the tape, so that it sees the gradient
        return [read(v) for v in values] if isinstance(values, (list, tuple)) else tf.convert_to_tensor(values)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            for w in weights:
                x = block(x, *read(w))
            loss = tf.reduce_mean(tf.square(tf.cast(x, "float32")))
        return tape.gradient(loss, trainable)

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
    return {"model": model or f"plain {width}", "way": way, "blocks": blocks, "positions": positions, "ops": ops,
            "trace_s": round(trace_s, 2), "first_call_s": round(first_s, 2), "step_s": round(step_s, 2),
            "heap_trace_mib": round((traced - before) / MiB, 1),
            "heap_first_call_mib": round((first - traced) / MiB, 1),
            "heap_kept_mib": round((heap_bytes() - before) / MiB, 1),
            "allocator_peak_mib": round(tf.config.experimental.get_memory_info("CPU:0")["peak"] / MiB, 1),
            "rss_gib": round(_harness.rss_gib(), 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 12, 24])
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--model", help="a registered decoder's blocks instead of plain TensorFlow ones")
    parser.add_argument("--positions", type=int, default=512)
    args = parser.parse_args()
    rows = []
    for way in args.ways:
        for blocks in args.blocks:
            run = _harness.run_child({"way": way, "blocks": blocks, "positions": args.positions, "model": args.model},
                                     timeout=1200)
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
