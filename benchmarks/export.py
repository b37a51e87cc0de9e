"""Latency and file size of each export of enc-base and dec-base (random weights)
at batch 1, sequence 128: Keras, SavedModel, TFLite float32 / float16 / int8.

    python benchmarks/export.py [--models enc-base dec-base] [--runs 20] [--threads 2]

Keras is the serving graph (`zoo.export.serving_model`) run by `predict_on_batch`,
so every row computes the same outputs (encoders: sequence + pooled output;
decoders: next-token logits). Each row runs in its own process (from one saved
.keras file, so all rows share weights) to keep memory to one model at a time.
Prints a table and one JSON line.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import _harness

FORMATS = ("keras", "saved_model", "tflite float32", "tflite float16", "tflite int8")
LENGTH = 128


def timed(fn, runs, warmup=3):
    """Milliseconds: the median and the 90th percentile of `runs` calls after `warmup` calls."""
    times = _harness.call_seconds(fn, runs, warmup)
    return statistics.median(times) * 1e3, sorted(times)[int(0.9 * (len(times) - 1))] * 1e3


def size(path):
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def measure(name, fmt, folder, runs, threads):
    """One row, in this (child) process."""
    import keras
    import numpy as np
    import tensorflow as tf

    import zoo
    from zoo import export

    folder = Path(folder)
    source = folder / f"{name}.keras"
    if fmt == "keras":
        model = zoo.get(name)
        # Seeded N(0, 0.02) values for every matrix, so a rerun exports the same weights
        # (zoo's initializers take their seeds from Python's unseeded `random`); vectors
        # keep their initial values. Each weight already has its own initializer
        # (zoo/layers/initializers.py), so same-shaped kernels differ either way.
        rng = np.random.default_rng(0)
        model.set_weights([rng.normal(0, 0.02, w.shape).astype(w.dtype) if w.ndim > 1 else w
                           for w in model.get_weights()])
        model.save(source)
    else:
        model = keras.models.load_model(source)
    batch = export.parity_batch(model, 1, LENGTH)
    row = {"model": name, "format": fmt}
    if fmt == "keras":
        serving = export.serving_model(model)
        row["ms"], row["p90_ms"] = timed(lambda: serving.predict_on_batch(batch), runs)
        row["bytes"] = size(source)
    elif fmt == "saved_model":
        path = export.saved_model(model, folder / f"{name}_saved_model")
        del model
        signature = tf.saved_model.load(str(path)).signatures["serving_default"]
        tensors = {k: tf.constant(v) for k, v in batch.items()}
        row["ms"], row["p90_ms"] = timed(lambda: signature(**tensors), runs)
        row["bytes"] = size(path)
    else:
        from ai_edge_litert.interpreter import Interpreter

        quantize = fmt.split()[1]
        path = folder / f"{name}_{quantize}.tflite"
        report = export.tflite(model, path, quantize=None if quantize == "float32" else quantize,
                               batch_size=1, sequence_length=LENGTH)
        del model
        runner = Interpreter(model_path=str(path), num_threads=threads).get_signature_runner()
        row["ms"], row["p90_ms"] = timed(lambda: runner(**batch), runs)
        row["bytes"], row["max_rel"] = report.size_bytes, report.max_rel
        path.unlink()
    row["peak_rss_gib"] = _harness.peak_rss_gib()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["enc-base", "dec-base"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="TFLite interpreter threads")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="zoo-export-bench-"))
    rows = []
    try:
        for name in args.models:
            for fmt in FORMATS:
                run = _harness.run_child({"name": name, "fmt": fmt, "folder": str(folder), "runs": args.runs,
                                          "threads": args.threads})
                if not run.ok:
                    sys.exit(f"{name} {fmt} failed:\n{run.stderr}")
                rows.append(run.result)
                print(f"  {name} {fmt}: {rows[-1]['ms']:.1f} ms", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"batch 1, sequence {LENGTH}, median (p90) of {args.runs} runs, {os.cpu_count()} CPU cores, "
          f"TFLite {args.threads} threads; random weights")
    print("| model | format | latency ms | p90 ms | size MiB | max rel. diff vs Keras | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rel = f"{r['max_rel']:.1e}" if "max_rel" in r else "—"
        print(f"| {r['model']} | {r['format']} | {r['ms']:.1f} | {r['p90_ms']:.1f} | {r['bytes'] / 2**20:.1f} "
              f"| {rel} | {r['peak_rss_gib']:.2f} |")
    print(json.dumps({"benchmark": "export", "batch": 1, "sequence_length": LENGTH, "runs": args.runs,
                      "threads": args.threads, "rows": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
