"""Generating from each export of a decoder (issue 24): file size, peak RSS of exporting,
time to first token and tokens/s, at batch 1, prompt 128, 128 new tokens (random weights).

    python benchmarks/export_generate.py [--models dec-base dec-1b] [--prompt 128] [--new 128]
    python benchmarks/export_generate.py --tiny --prompt 16 --new 8     # a smoke run

Rows, each in its own guarded process (from one saved .keras file, so all rows share weights):
    keras           zoo.generation.generate (cached, compiled): the reference
    saved_model     the SavedModel's `generate` signature, loaded with tf.saved_model.load
    tflite float32  prefill/decode signatures (zoo.export.litert), ai_edge_litert
    tflite int8     the same with int8 weights (int8_mode "auto": the converter's dynamic range when
                    its peak fits the memory available, else stand_in; the route is printed
                    beside the row)
    tflite int8 stand_in   int8 with int8_mode "stand_in" whatever the memory (zoo.export.stand_in)
    logits loop     today's logits-only SavedModel (`serving_default`), called from Python
                    once per token on the whole prefix: the baseline this issue replaces
Time to first token is the prefill plus one token (generate with max_new_tokens=1); tokens/s
counts the other new tokens: (new - 1) / (time for `new` tokens - time to first token).
Greedy everywhere, so every row computes the same tokens; "same tokens" compares each row
with the keras row. Prints a table and one JSON line.
"""

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _harness

GiB = 2**30
ROWS = ("keras", "saved_model", "tflite float32", "tflite int8", "tflite int8 stand_in", "logits loop")
DEFAULT_ROWS = tuple(row for row in ROWS if row != "tflite int8 stand_in")  # auto already takes it where needed
TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, num_kv_heads=2, intermediate_dim=128, vocab_size=512)


def size(path):
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def measure(name, row, folder, prompt_length, new, tiny, runs, threads):
    """One row, in this (child) process."""
    import keras
    import numpy as np
    import tensorflow as tf

    import zoo
    from zoo import export, generation

    folder = Path(folder)
    source = folder / f"{name}.keras"
    if row == "keras":
        model = zoo.get(name, **(TINY if tiny else {}))
        rng = np.random.default_rng(0)  # as benchmarks/export.py: seeded N(0, 0.02) matrices
        model.set_weights([rng.normal(0, 0.02, w.shape).astype(w.dtype) if w.ndim > 1 else w
                           for w in model.get_weights()])
        model.save(source)
    else:
        model = keras.models.load_model(source)
    prompt = np.random.default_rng(1).integers(3, model.spec.vocab_size, (1, prompt_length)).astype(np.int32)
    out = {"model": name, "format": row}
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # from here, VmHWM is the export's peak
    tree = _harness.TreePeak().__enter__()  # and any process the export starts
    start = time.perf_counter()
    if row == "keras":
        def run(n):
            return generation.generate(model, prompt, n)
        out["bytes"] = size(source)
    elif row in ("saved_model", "logits loop"):
        path = export.saved_model(model, folder / f"{name}_{row.replace(' ', '_')}", generate=row == "saved_model",
                                  overwrite=True)
        out["bytes"] = size(path)
        del model
        gc.collect()
        loaded = tf.saved_model.load(str(path))
        if row == "saved_model":
            signature = loaded.signatures["generate"]
            settings = {"sampler": tf.constant("greedy"), "top_k": tf.constant(1), "top_p": tf.constant(1.0),
                        "temperature": tf.constant(1.0), "seed": tf.constant(0), "end_token_id": tf.constant(-1)}

            def run(n):
                return signature(token_ids=tf.constant(prompt), padding_mask=tf.ones_like(prompt),
                                 max_new_tokens=tf.constant(n), **settings)["token_ids"].numpy()
        else:
            signature = loaded.signatures["serving_default"]

            def run(n):
                ids = prompt
                for _ in range(n):
                    logits = signature(token_ids=tf.constant(ids), padding_mask=tf.ones_like(ids))["next_token_logits"]
                    ids = np.concatenate([ids, np.argmax(logits.numpy(), -1).astype(np.int32)[:, None]], axis=1)
                return ids
    else:
        quantize, int8_mode = (row.split()[1:] + ["auto"])[:2]
        result = export.tflite_generator(model, folder / f"{name}_{quantize}_{int8_mode}.tflite",
                                         quantize=None if quantize == "float32" else quantize,
                                         prefill_length=prompt_length, cache_length=prompt_length + new,
                                         overwrite=True, int8_mode=int8_mode)
        out["bytes"], out["estimated_bytes"], out["int8_mode"] = result.size_bytes, result.estimated_bytes, \
            result.int8_mode
        del model
        gc.collect()
        runner = export.LiteRTGenerator(result.path, num_threads=threads)

        def run(n):
            return runner.generate(prompt[0], n)
    out["export_seconds"] = time.perf_counter() - start
    tree.__exit__(None, None, None)
    out["export_peak_rss_gib"] = tree.peak / GiB
    out["ttft_s"] = _harness.median_seconds(lambda: run(1), runs)
    full = _harness.median_seconds(lambda: run(new), max(1, runs // 2))
    out["tokens_per_s"] = (new - 1) / (full - out["ttft_s"]) if full > out["ttft_s"] and new > 1 else None
    out["tokens"] = np.asarray(run(new)).reshape(-1)[prompt_length:prompt_length + new].tolist()
    out["peak_rss_gib"] = _harness.peak_rss_gib()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["dec-base"])
    parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=ROWS)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3, help="median of this many timed runs")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="LiteRT interpreter threads")
    parser.add_argument("--tiny", action="store_true", help="shrink the models (a smoke run)")
    parser.add_argument("--budget-gib", type=float, default=22.0, help="kill a row whose RSS passes this")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="zoo-export-generate-"))
    rows = []
    try:
        for name in args.models:
            for row in ["keras"] + [r for r in args.rows if r != "keras"]:  # keras first: it saves the weights
                run = _harness.run_child({"name": name, "row": row, "folder": str(folder), "prompt_length": args.prompt,
                                          "new": args.new, "tiny": args.tiny, "runs": args.runs,
                                          "threads": args.threads}, budget_bytes=args.budget_gib * GiB)
                result = run.result if run.ok else {"model": name, "format": row,
                                                    "status": f"{run.status}: {run.error}"}
                result["guard_rss_gib"] = run.peak_rss_bytes / GiB
                rows.append(result)
                print(f"  {name} {row}: {result.get('status', 'ok')}", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    reference = {r["model"]: r.get("tokens") for r in rows if r["format"] == "keras"}
    print(f"batch 1, prompt {args.prompt}, {args.new} new tokens (greedy), median of {args.runs}, {os.cpu_count()} "
          f"CPU cores, LiteRT {args.threads} threads; random weights{' (tiny shapes)' if args.tiny else ''}")
    print("| model | format | size MiB | export peak RSS GiB | time to first token s | tokens/s | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "status" in r:
            print(f"| {r['model']} | {r['format']} | {r['status']} | {r['guard_rss_gib']:.2f} | | | |")
            continue
        same = sum(a == b for a, b in zip(r["tokens"], reference[r["model"]] or []))
        r["same_tokens"] = same
        how = f" ({r['int8_mode']})" if r.get("int8_mode") else ""
        print(f"| {r['model']} | {r['format']}{how} | {r['bytes'] / 2**20:.1f} | {r['export_peak_rss_gib']:.2f} | "
              f"{r['ttft_s']:.3f} | {r['tokens_per_s'] or float('nan'):.1f} | {same}/{len(r['tokens'])} |")
    print(json.dumps({"benchmark": "export_generate", "prompt": args.prompt, "new": args.new, "runs": args.runs,
                      "threads": args.threads, "tiny": args.tiny, "rows": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
