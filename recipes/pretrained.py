"""Starting a recipe from pretrained weights: a Hugging Face folder or Hub repo id.

The checkpoint says what the model is (its `config.json`), so a registered model
name is optional; when one is given, the checkpoint must have its shape. The
checkpoint's own tokenizer is used, never a newly trained vocabulary, and a
classifier checkpoint's labels must be the data's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import zoo
from zoo.reading import read_json


@dataclass(frozen=True)
class Checkpoint:
    folder: str
    spec: zoo.ModelSpec
    task: str  # the checkpoint's own task ("classifier" for BertForSequenceClassification)
    labels: tuple | None  # a classifier's label names, in id order


@functools.lru_cache(maxsize=16)
def checkpoint(weights: str) -> Checkpoint:
    """What the checkpoint at `weights` (a folder or Hub repo id) is, from its config.json."""
    folder = zoo.hub.local_folder(weights)
    path = folder / "config.json"
    if (folder / zoo.hub.peft.CONFIG).is_file() or (folder / zoo.loading.ADAPTER_DIR).is_dir():
        raise ValueError(f"{weights} holds LoRA adapters, not a base model, and LoRA goes on a model once. Merge "
                         "them into their base first (`zoo train` on the run again with --hf-out MERGED --merge), "
                         "then start from --weights MERGED.")
    if not path.is_file():
        raise FileNotFoundError(f"{weights} has no config.json; --weights takes a Hugging Face model folder "
                                "or Hub repo id." + zoo.hub.gguf_hint(folder))
    config = read_json(path)
    spec, task, _ = zoo.hub.spec_from_config(config)
    id2label = config.get("id2label")
    labels = tuple(id2label[str(i)] for i in range(len(id2label))) if task == "classifier" and id2label else None
    return Checkpoint(str(folder), spec, task, labels)


def check_shape(weights: str, model: str):
    """Refuse weights whose shape is not the named registered model's, naming each difference."""
    differences = checkpoint(weights).spec.shape_differences(zoo.spec(model))
    diff = [f"{f}: checkpoint {ours!r}, {model} {theirs!r}" for f, ours, theirs in differences]
    if diff:
        raise ValueError(f"The weights at {weights} are not a {model!r} model ({'; '.join(diff)}). "
                         "Drop the model name to train the checkpoint's own shape.")


def check_labels(weights: str, labels):
    """A classifier checkpoint keeps its head only for the same labels in the same order."""
    own = checkpoint(weights).labels
    if own is None:
        return
    generic = all(name == f"LABEL_{i}" for i, name in enumerate(own))
    if generic and len(own) != len(labels):
        raise ValueError(f"The classifier at {weights} has {len(own)} classes, but the data has {len(labels)} "
                         f"({list(labels)}); fine-tune from its base model instead.")
    if not generic and tuple(labels) != own:
        raise ValueError(f"The classifier at {weights} was trained on labels {list(own)}, but the data has "
                         f"{list(labels)}; fine-tune from its base model, or relabel the data to match.")


def tokenizer(weights: str):
    found = zoo.hub.load_tokenizer(checkpoint(weights).folder)
    if found is None:
        raise FileNotFoundError(f"{weights} has no tokenizer files (vocab.txt, vocab.json + merges.txt, "
                                "tokenizer.model or tokenizer.json); fine-tuning uses the checkpoint's own tokenizer.")
    return found


def load_model(recipe, num_classes=None):
    """The recipe's model with the checkpoint's weights (a new head where the checkpoint has none); with
    `quantize`, each kernel is quantized as it is read, so the float model never exists (the runner's
    `zoo.quantization.quantize_base` then finds it quantized and changes nothing)."""
    shape_overrides = {k: v for k, v in recipe.model_overrides.items() if k != "num_classes"}
    task_args = {"num_classes": num_classes} if recipe.task == "classifier" else {}
    return zoo.hub.load(recipe.weights, task=recipe.task, checkpointing=recipe.checkpointing,
                        dtype=recipe.dtype_policy, tokenizer=False, quantize=recipe.quantize or None,
                        **shape_overrides, **task_args)
