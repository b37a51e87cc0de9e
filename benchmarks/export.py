"""Latency and file size of each export of enc-base and dec-base (random weights)
at batch 1, sequence 128: Keras, SavedModel, TFLite float32 / float16 / int8.

    python benchmarks/export.py [--models enc-base dec-base] [--runs 20] [--threads 2]

Keras is the serving graph (`zoo.export.serving_model`) run by `predict_on_batch`,
so every row computes the same outputs (encoders: sequence + pooled output;
decoders: next-token logits). Prints a table and one JSON line.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import zoo  # noqa: E402
from zoo import export  # noqa: E402


def timed(fn, runs, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, sorted(times)[int(0.9 * (len(times) - 1))] * 1e3


def size(path):
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def bench(name, runs, threads, folder, length=128):
    from ai_edge_litert.interpreter import Interpreter

    model = zoo.get(name)
    # Distinct random weights: zoo.get's shared initializer gives same-shaped kernels
    # identical values, which the TFLite converter would store once (too-small files).
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.02, w.shape).astype(w.dtype) if w.ndim > 1 else w for w in model.get_weights()])
    batch = export.parity_batch(model, 1, length)
    rows = []

    serving = export.serving_model(model)
    model.save(folder / f"{name}.keras")
    ms, p90 = timed(lambda: serving.predict_on_batch(batch), runs)
    rows.append({"model": name, "format": "keras", "ms": ms, "p90_ms": p90, "bytes": size(folder / f"{name}.keras")})

    path = export.saved_model(model, folder / f"{name}_saved_model")
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    tensors = {k: tf.constant(v) for k, v in batch.items()}
    ms, p90 = timed(lambda: signature(**tensors), runs)
    rows.append({"model": name, "format": "saved_model", "ms": ms, "p90_ms": p90, "bytes": size(path)})

    for quantize in (None, "float16", "int8"):
        path = folder / f"{name}_{quantize or 'float32'}.tflite"
        report = export.tflite(model, path, quantize=quantize, batch_size=1, sequence_length=length)
        runner = Interpreter(model_path=str(path), num_threads=threads).get_signature_runner()
        ms, p90 = timed(lambda: runner(**batch), runs)
        rows.append({"model": name, "format": f"tflite {report.quantize}", "ms": ms, "p90_ms": p90,
                     "bytes": report.size_bytes, "max_rel": report.max_rel})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["enc-base", "dec-base"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="TFLite interpreter threads")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="zoo-export-bench-"))
    try:
        rows = [row for name in args.models for row in bench(name, args.runs, args.threads, folder)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB

    print(f"batch 1, sequence 128, {args.runs} runs, {os.cpu_count()} CPU threads; median (p90) latency")
    print(f"| model | format | latency ms | p90 ms | size MiB | max rel. diff vs Keras |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        rel = f"{r['max_rel']:.2e}" if "max_rel" in r else "—"
        print(f"| {r['model']} | {r['format']} | {r['ms']:.1f} | {r['p90_ms']:.1f} | {r['bytes'] / 2**20:.1f} | {rel} |")
    print(f"peak RSS {peak_rss:.2f} GiB")
    print(json.dumps({"benchmark": "export", "batch": 1, "sequence_length": 128, "runs": args.runs,
                      "peak_rss_gib": round(peak_rss, 2), "rows": rows}))


if __name__ == "__main__":
    main()
