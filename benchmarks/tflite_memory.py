"""Where the memory of a TFLite export goes: peak RSS of each stage of `zoo.export.tflite`'s
path (build the model, write the SavedModel the converter reads, load it into the
converter, convert), for float32 and int8, and the same conversion from the SavedModel
alone in a fresh process (no Keras model alive).

    python benchmarks/tflite_memory.py                          # dec-base, float32 and int8
    python benchmarks/tflite_memory.py --models dec-1b --budget-gib 22   # alone, on the 24 GiB machine

Each row runs in its own process, guarded (killed, and reported, past --budget-gib).
A stage's peak is VmHWM after resetting it (/proc/self/clear_refs) at the stage's start,
so each stage is measured on its own. Prints a table and one JSON line; the "x weights"
column is (stage peak - RSS at the stage's start) / float32 weight bytes: how many float32
copies of the weights the stage adds at once.
"""

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import _harness

GiB = 2**30
MODES = ("export path", "from_saved_model", "int8 weights")


def weight_only_int8(model):
    """A prototype, not a zoo feature: every block's Dense kernel stored as int8 (Keras'
    `quantize("int8")`: per-output-channel abs-max) and dequantized in the graph
    (`x @ (int8 / scale)`), activations in float. The SavedModel then holds int8 constants, and
    the converter's copies of them are int8-sized; Keras' own int8 call (int8 activations
    into an integer matmul) does not convert ('tfl.fully_connected' takes no i8 input)."""
    from keras import ops

    for block in model.backbone.blocks:
        att, ffn = block.attention, block.ffn
        for dense in (att.query_dense, att.key_dense, att.value_dense, att.output_dense, ffn.gate, ffn.up, ffn.down):
            dense.quantize("int8")

            def call(x, training=None, dense=dense):
                return ops.matmul(x, ops.cast(dense._kernel, x.dtype) / dense.kernel_scale)

            dense.quantized_call = call
    return model


class Stages:
    """Peak RSS of each stage of the export, measured in this process. Each stage is also
    appended to a progress file as it starts and ends, so a row the guard kills still says
    which stage it was in and what the earlier ones took."""

    def __init__(self, progress):
        self.rows, self.progress = [], Path(progress)

    def run(self, name, fn):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current RSS
        before, start = _harness.status_bytes("VmRSS"), time.perf_counter()
        self._log({"stage": name, "rss_before_gib": before / GiB, "started": True})
        out = fn()
        peak, after = _harness.status_bytes("VmHWM"), _harness.status_bytes("VmRSS")
        self.rows.append({"stage": name, "rss_before_gib": before / GiB, "peak_gib": peak / GiB,
                          "rss_after_gib": after / GiB, "seconds": time.perf_counter() - start})
        self._log(self.rows[-1])
        return out

    def _log(self, row):
        with open(self.progress, "a") as f:
            f.write(json.dumps(row) + "\n")


def progress_file(folder, name, quantize, mode, layers):
    return Path(folder) / f"progress-{name}-{layers}-{quantize}-{mode.replace(' ', '_')}.jsonl"


def measure(name, quantize, mode, folder, layers=None):
    import keras
    import tensorflow as tf

    import zoo
    from zoo import export

    stages = Stages(progress_file(folder, name, quantize, mode, layers))
    folder = Path(folder)
    saved = folder / f"{name}-{layers}"
    quantize = None if quantize == "float32" else quantize

    def converter_for(path):
        converter = tf.lite.TFLiteConverter.from_saved_model(str(path))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        return converter

    overrides = {"num_layers": layers} if layers else {}
    if mode == "from_saved_model":  # the SavedModel the export path wrote, converted with no model alive
        weights = sum(p.stat().st_size for p in (saved / "variables").rglob("*") if p.is_file())
        converter = stages.run("load SavedModel into converter", lambda: converter_for(saved))
        flatbuffer = stages.run("convert", converter.convert)
    else:
        model = stages.run("build model", lambda: zoo.get(name, **overrides))
        weights = sum(int(v.numpy().nbytes) for v in model.weights)  # float32: the "x weights" unit
        if mode == "int8 weights":
            stages.run("quantize block kernels to int8", lambda: weight_only_int8(model))
        serving = export.serving_model(model)
        specs = export._input_specs(model, 1, 128)

        def write():
            archive = keras.export.ExportArchive()
            archive.add_endpoint("serving_default", lambda x: serving(x, training=False), input_signature=[specs])
            with export._plain_attention(model):
                archive.write_out(str(saved), verbose=False)

        stages.run("trace + write SavedModel", write)
        converter = stages.run("load SavedModel into converter", lambda: converter_for(saved))
        flatbuffer = stages.run("convert", converter.convert)
    for row in stages.rows:  # what the stage itself added at its peak, in float32 copies of the weights
        row["per_weight_byte"] = (row["peak_gib"] - row["rss_before_gib"]) * GiB / weights
    return {"model": name, "layers": layers, "quantize": quantize or "float32", "mode": mode,
            "weight_bytes": weights, "tflite_bytes": len(flatbuffer), "stages": stages.rows,
            "peak_rss_gib": _harness.peak_rss_gib()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["dec-base"])
    parser.add_argument("--quantize", nargs="+", default=["float32", "int8"])
    parser.add_argument("--layers", type=int, default=None, help="override num_layers (a smaller model)")
    parser.add_argument("--budget-gib", type=float, default=4.0, help="kill a row whose RSS passes this")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zoo-tflite-memory-") as folder:
        for name in args.models:
            for quantize in args.quantize:
                for mode in MODES if quantize == "int8" else MODES[:2]:
                    run = _harness.run_child({"name": name, "quantize": quantize, "mode": mode, "folder": folder,
                                              "layers": args.layers}, budget_bytes=args.budget_gib * GiB)
                    row = run.result if run.ok else {"model": name, "quantize": quantize, "mode": mode,
                                                     "status": run.status, "progress": [
                                                         json.loads(line) for line in progress_file(
                                                             folder, name, quantize, mode, args.layers
                                                         ).read_text().splitlines()]}
                    row["guard_rss_gib"] = run.peak_rss_bytes / GiB
                    rows.append(row)
                    print(f"  {name} {quantize} {mode}: {row.get('status', 'ok')}, guard peak "
                          f"{row['guard_rss_gib']:.2f} GiB", file=sys.stderr)
    print(f"{os.cpu_count()} CPU cores; peak RSS per stage (GiB); x weights: (peak - RSS before) / float32 weights")
    print("| model | quantize | mode | stage | RSS before | peak | RSS after | x weights | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for s in r.get("stages", []):
            print(f"| {r['model']} | {r['quantize']} | {r['mode']} | {s['stage']} | {s['rss_before_gib']:.2f} | "
                  f"{s['peak_gib']:.2f} | {s['rss_after_gib']:.2f} | {s['per_weight_byte']:.2f} | {s['seconds']:.0f} |")
        for s in r.get("progress", []):  # a killed row: the stages it finished, and the one it died in
            cells = (f"{s['peak_gib']:.2f} | {s['rss_after_gib']:.2f} | | {s['seconds']:.0f}" if "peak_gib" in s
                     else f"{r['status']} above {r['guard_rss_gib']:.2f} | | |")
            print(f"| {r['model']} | {r['quantize']} | {r['mode']} | {s['stage']} | {s['rss_before_gib']:.2f} | "
                  f"{cells} |")
    print(json.dumps({"benchmark": "tflite_memory", "rows": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
