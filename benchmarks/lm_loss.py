"""The chunked causal-LM loss against the unchunked one: forward + backward time and the
allocator's peak of one gradient computation of the loss alone (the LM head and the
cross-entropy), each variant in a fresh process.

    python benchmarks/lm_loss.py                                  # dec-base and dec-1b heads
    python benchmarks/lm_loss.py --shapes 576x49152x4x512 --chunks 64,128 --repeats 5

A shape is HxVxBxS: hidden H, vocabulary V, batch B, sequence S. The head is a tied
ReversibleEmbedding's reverse cast to float32 (what `DecoderCausalLM.lm_logits` does);
variants: `unchunked` (SparseCategoricalCrossentropy on the whole logits) and `chunked`
(zoo.ops.lm_loss.chunked_lm_loss) per chunk size. Each child runs
a tf.function computing the loss and its gradients w.r.t. the hidden states and the
embedding; the first call (tracing) is not timed; the median of `repeats` calls is. Time
ratios on this shared 2-core machine vary by ±15% between runs (docs/design-notes.md):
variants are interleaved by shape, and each is one process. Prints a table and one JSON line.
"""

import argparse
import json
import statistics
import time

import _harness
from _harness import GiB, PeakMemory


def measure(hidden, vocab, batch, seq, variant, chunk, precision, repeats):
    import keras
    import tensorflow as tf
    from keras_hub.layers import ReversibleEmbedding

    from zoo.ops.lm_loss import chunked_lm_loss, live_bytes

    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(0)
    emb = ReversibleEmbedding(vocab, hidden, tie_weights=True)
    emb.build((None, None))
    dtype = emb.compute_dtype

    def head(h):
        return tf.cast(emb(h, reverse=True), tf.float32)

    h = tf.cast(tf.random.normal([batch, seq, hidden]), dtype)
    y = tf.random.uniform([batch, seq], 0, vocab, tf.int32)
    ref = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(h, y):
        with tf.GradientTape() as tape:
            tape.watch(h)
            if variant == "unchunked":
                loss = ref(y, head(h))
            else:
                loss = chunked_lm_loss(h, head, y, chunk_size=chunk)
        d_h, d_emb = tape.gradient(loss, [h, emb.embeddings])
        # reduce to scalars so that the outputs themselves are not what is measured
        return loss, tf.reduce_sum(tf.cast(d_h, tf.float32)), tf.reduce_sum(d_emb)

    step(h, y)  # trace
    with PeakMemory() as mem:
        out = step(h, y)
        float(out[0])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        float(step(h, y)[0])
        times.append(time.perf_counter() - start)
    grads = (batch * seq * hidden * tf.as_dtype(dtype).size + vocab * hidden * 4) / GiB
    return {"step_s": statistics.median(times), "times": times, "peak_gib": mem.step_gib, "memory_measure": mem.measure,
            "grads_gib": grads, "loss": float(out[0]),
            "live_gib": live_bytes(batch, seq, vocab, chunk) / GiB if chunk else None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="576x49152x4x512,2048x32000x4x512")
    p.add_argument("--chunks", default="128,256,512")
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()

    print(f"{a.precision}; median of {a.repeats} calls after tracing; peak = allocator peak of one call above "
          f"its start (includes the returned gradients)", flush=True)
    print(f"{'shape HxVxBxS':18s} {'variant':10s} {'chunk':>5s} {'step s':>7s} {'vs unch':>7s} {'peak GiB':>9s} "
          f"{'grads GiB':>9s} {'live GiB':>8s}  status", flush=True)
    rows = []
    for shape in a.shapes.split(","):
        hidden, vocab, batch, seq = map(int, shape.split("x"))
        variants = [("unchunked", None)] + [("chunked", int(c)) for c in a.chunks.split(",") if c]
        base = None
        for variant, chunk in variants:
            args = {"hidden": hidden, "vocab": vocab, "batch": batch, "seq": seq, "variant": variant,
                    "chunk": chunk, "precision": a.precision, "repeats": a.repeats}
            run = _harness.run_child(args, timeout=1200)
            row = {**args, **run.result, "status": "ok" if run.ok else f"{run.status}: {run.error}"}
            rows.append(row)
            if not run.ok:
                print(f"{shape:18s} {variant:10s} {chunk or '-':>5} {row['status']}", flush=True)
                continue
            base = row["step_s"] if variant == "unchunked" else base
            ratio = row["step_s"] / base if base else float("nan")
            live = f"{row['live_gib']:8.3f}" if row["live_gib"] is not None else f"{'-':>8s}"
            print(f"{shape:18s} {variant:10s} {chunk or '-':>5} {row['step_s']:7.2f} {ratio:7.2f} "
                  f"{row['peak_gib']:9.3f} {row['grads_gib']:9.3f} {live}  ok", flush=True)
    print(json.dumps({"benchmark": "lm_loss", "precision": a.precision, "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
