"""Peak memory of a TFLite export, per quantization and int8 route, against
`zoo.export.size.conversion_bytes` (the prediction `int8_mode="auto"` decides with).

    python benchmarks/tflite_memory.py --layers 10                     # dec-base at 10 layers, every mode
    python benchmarks/tflite_memory.py --models dec-1b --modes "int8 stand_in" --budget-gib 22  # alone

Each row runs `zoo.export.tflite_generator` (prefill 128, cache 256) in its own process,
guarded: the guard sums the process and any process it starts,
and kills them past --budget-gib. Columns: the process's RSS after building the model, the
peak of the whole process tree during the export above that, the prediction, and the
measured peak over the float32 weights ("x weights"). Prints a table and one JSON line.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import _harness

GiB = 2**30
MODES = ("float32", "int8 dynamic_range", "int8 stand_in")


def measure(name, mode, layers=None):
    import numpy as np

    import zoo
    from zoo import export
    from zoo.export import size

    model = zoo.get(name, **({"num_layers": layers} if layers else {}))
    weights = size.weight_bytes(model)
    quantize, int8_mode = (mode.split() + ["dynamic_range"])[:2] if mode != "float32" else (None, "dynamic_range")
    predicted = size.conversion_bytes(model, quantize, int8_mode)
    np.asarray(model.weights[0])  # the weights are materialised before the baseline is read
    base = _harness.status_bytes("VmRSS")
    with tempfile.TemporaryDirectory(prefix="zoo-tflite-memory-") as folder, _harness.TreePeak() as peak:
        start = time.perf_counter()
        result = export.tflite_generator(model, Path(folder) / "model.tflite", quantize=quantize, prefill_length=128,
                                         cache_length=256, int8_mode=int8_mode)
        seconds = time.perf_counter() - start
    return {"model": name, "layers": layers or model.spec.num_layers, "mode": mode, "weight_bytes": weights,
            "base_rss_gib": base / GiB, "export_peak_gib": (peak.peak - base) / GiB, "tree_peak_gib": peak.peak / GiB,
            "predicted_gib": predicted / GiB, "x_weights": (peak.peak - base) / weights, "seconds": seconds,
            "tflite_bytes": result.size_bytes, "estimated_bytes": result.estimated_bytes}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["dec-base"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--layers", type=int, default=None, help="override num_layers (a smaller model)")
    parser.add_argument("--budget-gib", type=float, default=4.0, help="kill a row whose process tree passes this")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        for mode in args.modes:
            run = _harness.run_child({"name": name, "mode": mode, "layers": args.layers},
                                     budget_bytes=args.budget_gib * GiB)
            row = run.result if run.ok else {"model": name, "mode": mode, "status": f"{run.status}: {run.error}"}
            row["guard_rss_gib"] = run.peak_rss_bytes / GiB
            rows.append(row)
            print(f"  {name} {mode}: {row.get('status', 'ok')}, guard peak {row['guard_rss_gib']:.2f} GiB",
                  file=sys.stderr)
    print(f"{os.cpu_count()} CPU cores; GiB; export peak = the process tree's peak above the built model's RSS")
    print("| model | layers | mode | float32 weights GiB | model RSS | export peak | predicted | x weights | file MiB "
          "| s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "status" in r:
            print(f"| {r['model']} | | {r['mode']} | {r['status']} (guard {r['guard_rss_gib']:.2f}) | | | | | | |")
            continue
        print(f"| {r['model']} | {r['layers']} | {r['mode']} | {r['weight_bytes'] / GiB:.2f} | {r['base_rss_gib']:.2f} "
              f"| {r['export_peak_gib']:.2f} | {r['predicted_gib']:.2f} | {r['x_weights']:.2f} | "
              f"{r['tflite_bytes'] / 2**20:.1f} | {r['seconds']:.0f} |")
    print(json.dumps({"benchmark": "tflite_memory", "rows": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
