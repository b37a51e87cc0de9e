"""Continue training SmolLM2-135M (the real GGUF weights, dequantised) on news articles
the way a user would, and measure held-out perplexity before and after with `zoo eval`.

    python benchmarks/finetune_smollm2.py [--steps 40 --held-out 20]

The GGUF comes from tools/assets.py (docs/assets.md) and is converted once with
`zoo.hub.convert_gguf`. Articles are split by position: the last `--held-out` are
never trained on. Prints the commands, a table and one JSON line.
"""

import argparse
import csv
import sys
import tempfile
import zipfile
from pathlib import Path

import _harness

import zoo


def articles(archive):
    with zipfile.ZipFile(archive) as z, z.open("NewsArticles.csv") as raw:
        lines = (line.decode("utf-8", errors="replace") for line in raw)
        return [" ".join(row["text"].split()) for row in csv.DictReader(lines) if row["text"].strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags = _harness.training_flags(parser, steps=40, batch_size=4, sequence_length=256, learning_rate=5e-5)
    parser.add_argument("--held-out", type=int, default=20, help="articles kept out of training")
    parser.add_argument("--train-articles", type=int, default=400)
    args = parser.parse_args(argv)

    paths = _harness.fetch("smollm2", "news")
    work = Path(tempfile.mkdtemp(prefix="finetune-smollm2-"))
    folder = zoo.hub.convert_gguf(paths["smollm2"], work / "SmolLM2-135M")
    texts = articles(paths["news"])
    (work / "train.txt").write_text("\n".join(texts[:args.train_articles]) + "\n", encoding="utf-8")
    (work / "held-out.txt").write_text("\n".join(texts[-args.held_out:]) + "\n", encoding="utf-8")

    length = ["--sequence-length", args.sequence_length]
    before_cmd = ["eval", folder, "--data", work / "held-out.txt", *length, "--batch-size", 8]
    train = ["train", "--weights", folder, "--data", work / "train.txt", "--out-dir", work / "run", *flags(args)]
    after_cmd = ["eval", work / "run", "--data", work / "held-out.txt", *length, "--batch-size", 8]
    for command in (before_cmd, train, after_cmd):
        print("zoo " + " ".join(map(str, command)))
    _, _, before = _harness.zoo_cli(*before_cmd)
    train_seconds, _, trained = _harness.zoo_cli(*train)
    _, _, after = _harness.zoo_cli(*after_cmd)

    result = {
        "benchmark": "finetune_smollm2", "weights": "SmolLM2-135M-Instruct Q4_1 GGUF, dequantised",
        "train_articles": args.train_articles, "held_out_articles": args.held_out,
        "held_out_tokens": after["tokens"], "steps": trained["steps"], "batch_size": args.batch_size,
        "sequence_length": args.sequence_length, "precision": args.precision,
        "train_seconds": round(train_seconds, 1), "tokens_per_second": trained["tokens_per_second"],
        "perplexity_before": round(before["perplexity"], 3), "perplexity_after": round(after["perplexity"], 3),
    }
    _harness.print_metrics(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
