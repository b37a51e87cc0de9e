"""`recipes.evaluate`: how good a trained model is on a file it did not train on.

A classifier gets accuracy and a confusion matrix on a labelled file; a causal
language model gets perplexity on a text file (packed into rows exactly as the
training pipeline packs them). The model is a training run's folder, a Hugging
Face folder or a `.keras` file; the tokenizer is the one saved beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

import zoo
from recipes import data as data_lib
from recipes import pretrained, state


@dataclass(frozen=True)
class Settings:
    """The pipeline settings evaluation shares with training (the fields `recipes.data` reads)."""

    task: str
    sequence_length: int
    batch_size: int = 32
    shuffle_buffer: int = 1
    seed: int = 0
    segments: bool = True  # the model takes segment ids (BERT; not ModernBERT)


@dataclass
class Evaluation:
    task: str
    examples: int
    accuracy: float | None = None
    confusion: list | None = None  # rows: true label, columns: predicted label
    labels: list | None = None
    loss: float | None = None  # mean next-token negative log-likelihood (nats)
    perplexity: float | None = None
    tokens: int | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}

    def table(self) -> str:
        if self.task == "classifier":
            corner = "true \\ predicted"
            width = max(len(str(name)) for name in self.labels) + 2
            first = max(width, len(corner) + 2)
            lines = [f"accuracy {self.accuracy:.4f} on {self.examples} examples", "",
                     corner.ljust(first) + "".join(str(n).rjust(width) for n in self.labels)]
            lines += [str(name).ljust(first) + "".join(str(c).rjust(width) for c in row)
                      for name, row in zip(self.labels, self.confusion)]
            return "\n".join(lines)
        return (f"perplexity {self.perplexity:.3f} (loss {self.loss:.4f} nats/token) "
                f"on {self.tokens} tokens in {self.examples} rows")


def _labels_of(source) -> list | None:
    """A run's label names (run.json), or a Hugging Face classifier's (id2label)."""
    run = state.read_run(source) if Path(source).is_dir() else None
    if run is not None:
        return run.get("labels")
    if (Path(source) / "config.json").is_file():
        labels = pretrained.checkpoint(source).labels
        return list(labels) if labels else None
    return None


def _sequence_length(source, model, requested):
    run = state.read_run(source) if Path(source).is_dir() else None
    length = requested or (run["recipe"]["sequence_length"] if run else min(512, model.spec.max_sequence_length))
    if length > model.spec.max_sequence_length:
        raise ValueError(f"sequence_length={length} is above the model's {model.spec.max_sequence_length} positions.")
    return length


def evaluate(source, data, column=None, label_column=None, data_dir=None, batch_size=32, sequence_length=None):
    """Accuracy and confusion (classifier) or perplexity (causal LM) of `source` on `data`.

    Args:
        source: a training run's folder, a Hugging Face folder or a `.keras` file
            (with a tokenizer beside it: `tokenizer/`, or Hugging Face tokenizer files).
        data: a .txt/.csv/.tsv/.jsonl file or tfds:NAME[:SPLIT].
        column, label_column: the text column, and the label column for a classifier.
        data_dir: TensorFlow Datasets' data_dir for a tfds: source.
        batch_size: rows per forward pass.
        sequence_length: default: the run's training length, else min(512, the model's).

    Returns:
        An `Evaluation` (`.table()` prints it, `.as_dict()` is the JSON line).

    Example:
    >>> recipes.evaluate("runs/reviews", "test.csv", label_column="label").accuracy
    """
    source = str(source)
    model = zoo.load(source)
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(f"{source} has no tokenizer beside the model; evaluation tokenizes text with it.")
    if model.task not in ("classifier", "causal_lm"):
        raise ValueError(f"zoo eval measures classifiers (accuracy) and causal LMs (perplexity); {source} is a "
                         f"{model.task!r} model.")
    settings = Settings(model.task, _sequence_length(source, model, sequence_length), batch_size,
                        segments="segment_ids" in model.input)
    if model.task == "classifier":
        return _classifier(model, tokenizer, settings, _labels_of(source), data, column, label_column, data_dir)
    return _perplexity(model, tokenizer, settings, data, column, data_dir)


def _classifier(model, tokenizer, settings, labels, data, column, label_column, data_dir):
    if label_column is None:
        raise ValueError("A classifier is evaluated on labelled data: pass label_column (--label-column).")
    labels = labels or [f"LABEL_{i}" for i in range(model.output["logits"].shape[-1])]
    docs = data_lib.documents(data, column, label_column, data_dir)
    unknown = sorted(set(data_lib.labels_of(docs)) - set(labels))
    if unknown:
        raise ValueError(f"The data has label(s) {unknown} the model was not trained on; its labels are {labels}.")
    confusion = np.zeros((len(labels), len(labels)), "int64")
    for x, y in data_lib.pipeline(settings, tokenizer, docs, labels, training=False):
        predicted = np.argmax(model(x, training=False)["logits"], axis=-1)
        np.add.at(confusion, (np.asarray(y), predicted), 1)
    total = int(confusion.sum())
    return Evaluation("classifier", total, accuracy=float(np.trace(confusion) / total),
                      confusion=confusion.tolist(), labels=list(labels))


def _perplexity(model, tokenizer, settings, data, column, data_dir):
    docs = data_lib.documents(data, column, None, data_dir)
    nll, tokens, rows = 0.0, 0, 0
    for x, y in data_lib.pipeline(settings, tokenizer, docs, training=False):
        logits = model(x, training=False)["logits"]
        nll += float(tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))
        tokens += int(tf.size(y))
        rows += int(tf.shape(y)[0])
    if not tokens:
        raise ValueError(f"{data} holds fewer than {settings.sequence_length + 1} tokens: not one row to score; "
                         "pass a longer file or a smaller --sequence-length.")
    loss = nll / tokens
    return Evaluation("causal_lm", rows, loss=loss, perplexity=math.exp(loss), tokens=tokens)
