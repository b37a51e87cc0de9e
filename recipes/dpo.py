"""The preference recipes on the skeleton (recipes.runner): DPO (sigmoid, IPO, robust) or SimPO on prompt /
chosen / rejected pairs, tuning a pretrained (usually SFT-tuned) decoder with no second model in memory.

It supplies its data (the checkpoint's tokenizer and chat template; the pairs rendered, tokenized and the
completions masked, over-long ones dropped and counted), its loss (zoo.preference's step on the model) and
its metrics (TRL's rewards/... and logps/...). Before the first step it reads or scores the reference
(recipes.reference), which is, in this order:
  - `--reference FOLDER`: that model scores every pair once, before training, and is dropped;
  - a LoRA run: the same model with its adapters off, in the step (nothing stored);
  - otherwise the starting weights score every pair once, before the first step.

    zoo train --recipe dpo --weights sft-merged/ --data pairs.jsonl --out-dir runs/dpo \\
        --lora-rank 16 --lora-targets all-linear --quantize int4 --checkpointing full --sequence-length 1024
"""

from __future__ import annotations

import functools

import numpy as np

import zoo
from recipes import dpo_data as data
from recipes import kinds
from recipes.conversation import save_chat, shown_row, tokenizer_and_template
from recipes.kinds import Examples
from recipes.reference import stored_scores


def show_mask(recipe, data_path, row, out_dir="") -> str:
    """Pair `row` (1-based) of `data_path` as the run will score it: each answer's text with the scored tokens
    between ⟦ and ⟧, and the counts (`zoo train --recipe dpo --show-mask ROW`)."""
    tokenizer, template, kind, rows = shown_row(recipe, data_path, row, data.read_rows, out_dir)
    return f"-- row {row}\n" + data.show_pair(kind, rows, row, template, tokenizer, recipe.chat_template_kwargs,
                                              recipe.completion_mask)


class PreferenceTuning(kinds.Kind):
    """Its data: pairs [P, 2, S] (chosen, rejected), with the reference's stored scores where it has them;
    its loss and metrics: zoo.preference's, under TRL's names; tokens/s counts completion tokens."""

    def check(self, recipe, source):
        if recipe.weights is None:
            raise ValueError("Preference tuning starts from a pretrained decoder (usually the SFT run's, merged: "
                             "--hf-out MERGED --merge): pass weights= (--weights FOLDER).")

    def read(self, recipe, source, out_dir) -> Examples:
        """The pairs: every row checked, over-long pairs dropped and counted; every n-th held out."""
        tokenizer, template = tokenizer_and_template(recipe, out_dir)
        kind, rows = data.read_rows(source.path)
        numbers = range(1, len(rows) + 1)
        every = source.validation_every
        held = {n for n in numbers if every and (n - 1) % every == 0}
        train_pairs, report = data.pairs(kind, rows, template, tokenizer, recipe.sequence_length,
                                         numbers=[n for n in numbers if n not in held],
                                         template_kwargs=recipe.chat_template_kwargs,
                                         completion_mask=recipe.completion_mask)
        for line in report.lines(recipe.sequence_length):
            print(line)
        if not train_pairs:
            raise ValueError(f"No pair of {source.path} fits {recipe.sequence_length} positions; raise "
                             "--sequence-length, or check the rows (report above).")
        if len(train_pairs) < recipe.batch_size:  # here, before out_dir is written; the batches' check is a backstop
            raise ValueError(f"{len(train_pairs)} pair(s) make no batch of {recipe.batch_size}; lower --batch-size "
                             "or give more pairs.")
        valid_pairs = []
        if held:
            valid_pairs, valid_report = data.pairs(kind, rows, template, tokenizer, recipe.sequence_length,
                                                   numbers=sorted(held), template_kwargs=recipe.chat_template_kwargs,
                                                   completion_mask=recipe.completion_mask)
            print("Validation: " + " ".join(valid_report.lines(recipe.sequence_length)))
        completion = np.mean([p.chosen.mask[1:].sum() + p.rejected.mask[1:].sum() for p in train_pairs])
        return Examples(train=train_pairs, valid=valid_pairs,
                        data=data.statistics(train_pairs, recipe.sequence_length),
                        beside_tokenizer=functools.partial(save_chat, tokenizer, template),
                        tokens_per_batch=completion * recipe.batch_size)

    def loss(self, model, recipe):
        zoo.preference.set_preference(model, recipe.preference, recipe.beta, recipe.loss_type, recipe.label_smoothing,
                                      recipe.simpo_gamma, recipe.preference_reference)

    def before_fit(self, recipe, model, cluster, out_dir, examples):
        """The reference's stored scores, read back or scored now (none for LoRA's base or SimPO)."""
        examples.extra["reference"] = stored_scores(recipe, model, cluster, out_dir, examples.train, examples.valid)

    def datasets(self, recipe, examples, tokenizer, skip, distributed):
        reference = examples.extra["reference"]
        train = data.dataset(examples.train, recipe, training=True, skip=skip, reference=reference["train"])
        valid = None
        if examples.valid:
            valid = data.dataset(examples.valid, recipe, training=False, reference=reference["valid"])
        return train, valid

    def logged(self, key) -> bool:
        """The losses, and zoo.preference's metrics: TRL's names, rewards/... and logps/... (val_ for validation)."""
        return super().logged(key) or key.removeprefix("val_").startswith(("rewards/", "logps/"))


PREFERENCE = PreferenceTuning()
kinds.register("dpo", PREFERENCE)
kinds.register("simpo", PREFERENCE)
