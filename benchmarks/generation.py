"""Decoding speed of SmolLM2-135M (real weights, dequantised from the GGUF of
docs/assets.md) with and without the key/value cache.

    python benchmarks/generation.py [--prompt-tokens 128 --new-tokens 64 --batch 1]

Both runs are compiled and warmed up first (tracing is excluded); the uncached run
reruns the whole prefix for every token. Prints a table and one JSON line.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import _harness
import numpy as np

import zoo
from zoo import hub
from zoo.generation import generate

TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange "
        "grain, salt and cloth. Over the centuries the town grew into a centre of commerce and learning, ")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = hub.convert_gguf(_harness.fetch("smollm2")["smollm2"], Path(tmp) / "smollm2")
        model = zoo.get("dec-base", weights=str(folder))
    ids = np.asarray(model.tokenizer(TEXT * 20))[: args.prompt_tokens]
    prompt = np.tile(ids[None], (args.batch, 1)).astype("int32")
    rows, outputs = [], {}
    for use_cache in (True, False):
        start = time.perf_counter()
        generate(model, prompt, args.new_tokens, use_cache=use_cache)  # trace + warm up
        trace = time.perf_counter() - start
        start = time.perf_counter()
        outputs[use_cache] = generate(model, prompt, args.new_tokens, use_cache=use_cache)
        seconds = time.perf_counter() - start
        rows.append({"cache": use_cache, "seconds": round(seconds, 2), "first_call_seconds": round(trace, 1),
                     "tokens_per_second": round(args.batch * args.new_tokens / seconds, 1)})
    same = bool(np.array_equal(outputs[True], outputs[False]))
    print(f"SmolLM2-135M, batch {args.batch}, prompt {args.prompt_tokens} tokens, {args.new_tokens} new (greedy)")
    print("| KV cache | tokens/s | seconds | first call (trace) s |\n|---|---|---|---|")
    for row in rows:
        print(f"| {'yes' if row['cache'] else 'no'} | {row['tokens_per_second']} | {row['seconds']} | "
              f"{row['first_call_seconds']} |")
    speedup = rows[0]["tokens_per_second"] / rows[1]["tokens_per_second"]
    print(f"speed-up {speedup:.1f}x; same tokens with and without the cache: {same}")
    print(json.dumps({"benchmark": "generation", "model": "SmolLM2-135M", "batch": args.batch,
                      "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "runs": rows,
                      "speedup": round(speedup, 2), "same_tokens": same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
