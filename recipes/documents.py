"""The documents recipes on the skeleton (recipes.runner): masked LM, causal LM and classify, from scratch or
from weights, on .txt/.csv/.tsv/.jsonl/tfds data (recipes.data), tokenized by the run's tokenizer (the weights',
the recipe's vocabulary files, or one trained on the corpus: recipes.vocab)."""

from __future__ import annotations

from recipes import data as data_lib
from recipes import kinds, pretrained
from recipes.kinds import Examples


class Documents(kinds.Kind):
    tokenizes = True

    def check(self, recipe, source):
        if recipe.task == "classifier" and source.label_column is None:
            raise ValueError("The classify recipe needs labels: pass label_column (--label-column).")

    def read(self, recipe, source, out_dir) -> Examples:
        label_column = source.label_column if recipe.task == "classifier" else None
        docs = data_lib.documents(source.path, source.column, label_column, source.data_dir)
        train_docs, valid_docs = data_lib.split(docs, source.validation_every)
        labels = data_lib.labels_of(train_docs) if recipe.task == "classifier" else None
        if labels is not None and len(labels) < 2:
            raise ValueError(f"Column {source.label_column!r} holds {len(labels)} distinct label(s) ({labels}); "
                             "classification needs at least 2.")
        if labels is not None and recipe.weights:
            pretrained.check_labels(recipe.weights, labels)
        corpus = train_docs.map(lambda text, label: text) if labels is not None else train_docs  # its text
        return Examples(train=train_docs, valid=valid_docs, labels=labels, corpus=corpus)

    def datasets(self, recipe, examples, tokenizer, skip, distributed):
        train = data_lib.pipeline(recipe, tokenizer, examples.train, examples.labels, training=True, skip=skip)
        valid = None
        if examples.valid is not None:
            valid = data_lib.pipeline(recipe, tokenizer, examples.valid, examples.labels, training=False)
            if distributed:  # every replica needs an equal slice: whole batches only
                valid = valid.unbatch().batch(recipe.batch_size, drop_remainder=True)
        return train, valid


kinds.register("documents", Documents())
