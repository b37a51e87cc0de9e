"""What each recipe supplies to the training skeleton (recipes.runner), and the registry that finds it.

The skeleton runs every recipe the same way: setup, data, the run's folder, model and optimizer (resumed), the
loop with validation and checkpoints, the final model. A `Kind` is what differs: how its data are read and
batched (`check`, `read`, `datasets`), its loss (`loss`) and the metrics it logs (`logged`). A recipe names its
kind (`Recipe.kind`); `register` a new one here and the skeleton runs it, with no other file edited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from zoo.registry import Registry


@dataclass(frozen=True)
class Source:
    """Where a run's data are: the path (or tfds:NAME) and how to read it (documents: the columns)."""

    path: str
    column: str | None = None
    label_column: str | None = None
    data_dir: str | None = None
    validation_every: int = 0  # every n-th document, example or pair is held out; 0: none


@dataclass
class Examples:
    """What a kind read from its data, checked before the run's folder is written."""

    train: object  # the kind's own: documents, encoded examples, pairs
    valid: object = None
    data: dict | None = None  # run.json's "data" record and `Result.data`: what reading and packing did
    labels: list | None = None  # a classifier's label names
    corpus: object = None  # the text a new vocabulary is trained on (None: the weights' or the recipe's)
    beside_tokenizer: Callable | None = None  # writes the chat files beside the tokenizer, and into hf_out
    tokens_per_batch: float | None = None  # what tokens/s counts (None: every position of a batch)
    extra: dict = field(default_factory=dict)  # what `before_fit` adds (the reference's stored scores)


class Kind:
    """One recipe kind on the skeleton. Override what differs; the defaults train the next token's (or the
    task head's) cross-entropy and log the losses."""

    tokenizes = False  # whether its batches are tokenized by the run's saved tokenizer (documents), not at read
    eager = False  # whether fit runs its step eagerly (GRPO: Python reward functions inside the step)

    def check(self, recipe, source: Source):
        """Refuse what cannot run, before anything is read."""

    def read(self, recipe, source: Source, out_dir) -> Examples:
        raise NotImplementedError

    def datasets(self, recipe, examples: Examples, tokenizer, skip: int, distributed: bool):
        """(train, valid): the training batches from batch `skip` on (one global batch each), and the
        validation batches or None."""
        raise NotImplementedError

    def loss(self, model, recipe):
        """Set the kind's loss on the built model, where it is not compile's cross-entropy."""

    def before_fit(self, recipe, model, cluster, out_dir, examples: Examples):
        """Anything the model must do before the first step (preference tuning: score the reference)."""

    def logged(self, key) -> bool:
        """Whether fit's log `key` goes to the history and TensorBoard."""
        return key.removeprefix("val_").endswith("loss")


_KINDS = Registry("recipe kind", Kind)
register, names = _KINDS.register, _KINDS.names


def of(recipe) -> Kind:
    """The kind that trains `recipe`."""
    return _KINDS.get(recipe.kind)
