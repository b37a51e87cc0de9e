"""Forward + backward time of the attention cores alone, traced with and without XLA (`jit_compile`).

    python benchmarks/attention_core.py                        # dec-base's heads at 4 x 512 and 1 x 2048
    python benchmarks/attention_core.py --shapes 4x512 --dropout 0.1 --heads 12 --kv-heads 12   # enc-base's

Times one `tf.function` computing the output and the gradients of Q, K and V (causal unless
--bidirectional), median of --steps calls after a warm-up; the first call (tracing, and XLA's
compilation) is printed beside it. Timing only, in one process: memory is the other benchmarks'
(`benchmarks/memory.py`, `benchmarks/long_context.py`), each in a fresh process.
Prints a table and one JSON line.
"""

import argparse
import json
import statistics
import time

import _harness  # noqa: F401  (the repository on sys.path, TensorFlow's logging quietened)
import numpy as np
import tensorflow as tf

from zoo.ops.attention_core import chunked_attention, plain_attention

CORES = {"plain": plain_attention, "chunked": chunked_attention}


def timed(core, q, k, v, jit, steps, **options):
    @tf.function(jit_compile=jit)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(core(q, k, v, **options))
        return [loss] + tape.gradient(loss, [q, k, v])

    start = time.perf_counter()
    step(q, k, v)[0].numpy()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(q, k, v)[0].numpy()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4x512,1x2048", help="BATCHxSEQ,...")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    rows = []
    print(f"{'shape':8s} {'core':8s} {'xla':4s} {'fwd+bwd ms':>10s} {'x plain':>8s} {'1st call s':>10s}")
    for shape in a.shapes.split(","):
        batch, seq = map(int, shape.split("x"))
        rng = np.random.default_rng(0)
        q, k, v = (tf.constant(rng.normal(size=(batch, seq, n, a.head_dim)).astype("float32"))
                   for n in (a.heads, a.kv_heads, a.kv_heads))
        options = dict(causal=not a.bidirectional, rate=a.dropout,
                       seed=tf.constant([1, 2], "int64") if a.dropout else None)
        reference = None
        for name, jit in (("plain", False), ("chunked", False), ("plain", True), ("chunked", True)):
            try:
                first, median = timed(CORES[name], q, k, v, jit, a.steps, **options)
            except Exception as error:  # XLA may refuse a graph: report it as a row
                error = f"{type(error).__name__}: {error}"[:300]
                rows.append({"shape": shape, "core": name, "jit": jit, "error": error})
                print(f"{shape:8s} {name:8s} {str(jit):4s} ERROR {rows[-1]['error'][:100]}")
                continue
            reference = reference or median
            rows.append({"shape": shape, "core": name, "jit": jit, "ms": 1000 * median, "first_s": first,
                         "vs_plain": median / reference})
            print(f"{shape:8s} {name:8s} {str(jit):4s} {1000 * median:10.1f} {median / reference:8.2f} {first:10.1f}",
                  flush=True)
    print(json.dumps({"benchmark": "attention_core", "heads": a.heads, "kv_heads": a.kv_heads,
                      "dropout": a.dropout, "causal": not a.bidirectional, "results": rows}))


if __name__ == "__main__":
    main()
