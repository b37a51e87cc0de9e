"""The SFT recipe on the skeleton (recipes.runner): supervised fine-tuning of a pretrained decoder on
conversations, prompt/completion pairs or text (TRL's SFTTrainer formats), with the checkpoint's own chat
template, the loss on assistant tokens only, and optional packing. It supplies its data (the checkpoint's
tokenizer and template, the examples rendered, tokenized and masked, over-long and untrainable ones dropped
and counted, the chat files beside the tokenizer); everything else (the run's folder, the model with LoRA,
quantized base, fused update or packing, resume, validation, strategies, the Hugging Face folder) is the
skeleton's. `show_mask` draws one row as a run trains it.

    zoo train --recipe sft --weights smollm2/ --data chat.jsonl --out-dir runs/chat --packing \\
        --lora-rank 16 --quantize int4 --sequence-length 1024
"""

from __future__ import annotations

import functools

from recipes import kinds
from recipes import sft_data as data
from recipes.conversation import save_chat, shown_row, tokenizer_and_template
from recipes.kinds import Examples
from zoo.chat import EncodedChat


def show_mask(recipe, data_path, row, out_dir="") -> str:
    """Row `row` (1-based) of `data_path` as the run will train it: the rendered text with the trained tokens
    between ⟦ and ⟧, and the counts (`zoo train --recipe sft --show-mask ROW`)."""
    tokenizer, template, kind, rows = shown_row(recipe, data_path, row, data.read_rows, out_dir)
    data.examples(kind, rows, template, tokenizer, 10**9, recipe.loss_on, numbers=[row],  # refuses, by row, as a run
                  template_kwargs=recipe.chat_template_kwargs)
    eos = template.special_tokens.get("eos_token", "") if template is not None else ""
    text, spans = data.text_and_spans(kind, rows[row - 1], template, eos, tokenizer.control_tokens,
                                       recipe.chat_template_kwargs)
    encoded, offsets = tokenizer.encode_with_offsets(text, None if recipe.loss_on == "all" else spans)
    shown = EncodedChat(encoded.ids, encoded.mask, text, tuple(spans or ()), offsets)
    return f"{shown.show_mask()}\n-- row {row}: {len(shown.ids)} tokens, {int(shown.mask.sum())} trained"


class SupervisedFineTuning(kinds.Kind):
    """Its data: the rows rendered, tokenized and masked at read time; its loss: the next token's cross-entropy,
    weighted per token (the trained tokens only), as compile's with the batches' weights."""

    def check(self, recipe, source):
        if recipe.weights is None:
            raise ValueError("Supervised fine-tuning starts from a pretrained decoder and its chat template: pass "
                             "weights= (--weights FOLDER): a Hugging Face folder, or a GGUF file converted by "
                             "zoo.hub.convert_gguf.")

    def read(self, recipe, source, out_dir) -> Examples:
        """The examples: every row checked, over-long and untrainable ones dropped and counted; every
        `validation_every`-th row held out."""
        tokenizer, template = tokenizer_and_template(recipe, out_dir)
        kind, rows = data.read_rows(source.path)
        numbers = range(1, len(rows) + 1)
        held = [n for n in numbers if source.validation_every and (n - 1) % source.validation_every == 0]
        kept = set(numbers) - set(held)
        train_examples, report = data.examples(kind, rows, template, tokenizer, recipe.sequence_length,
                                               recipe.loss_on, numbers=[n for n in numbers if n in kept],
                                               template_kwargs=recipe.chat_template_kwargs)
        for line in report.lines(recipe.sequence_length):
            print(line)
        if not train_examples:
            fixes = (["raise --sequence-length"] if report.too_long else []) + (
                ["give rows an assistant message with an answer"] if report.no_trained_token else [])
            raise ValueError(f"No example of {source.path} fits {recipe.sequence_length} positions with a token to "
                             f"train on; {' or '.join(fixes) or 'check the rows'} (report above).")
        valid_examples = None
        if held:
            valid_examples, valid_report = data.examples(kind, rows, template, tokenizer, recipe.sequence_length,
                                                         recipe.loss_on, numbers=held,
                                                         template_kwargs=recipe.chat_template_kwargs)
            print("Validation: " + " ".join(valid_report.lines(recipe.sequence_length)))
        stats = data.statistics(train_examples, recipe)
        print(f"{'Packed' if recipe.packing else 'Padded'} rows of {recipe.sequence_length}: {stats['rows']} an "
              f"epoch, {stats['examples_per_row']:.2f} examples and {stats['trained_tokens_per_row']:.0f} trained "
              f"tokens a row, {stats['padding_fraction']:.1%} padding.")
        if stats["rows"] < recipe.batch_size:  # here, before out_dir is written; the batches' own check is a backstop
            raise ValueError(f"{stats['rows']} row(s) an epoch make no batch of {recipe.batch_size}; lower "
                             "--batch-size or give more rows.")
        return Examples(train=train_examples, valid=valid_examples, data={"format": kind, **stats},
                        beside_tokenizer=functools.partial(save_chat, tokenizer, template),
                        tokens_per_batch=stats["trained_tokens_per_row"] * recipe.batch_size)

    def datasets(self, recipe, examples, tokenizer, skip, distributed):
        train = data.dataset(examples.train, recipe, training=True, skip=skip)
        valid = data.dataset(examples.valid, recipe, training=False) if examples.valid else None
        return train, valid


kinds.register("sft", SupervisedFineTuning())
