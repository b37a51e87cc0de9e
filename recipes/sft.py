"""`recipes.sft.run`: supervised fine-tuning of a pretrained decoder on conversations, prompt/completion
pairs or text (TRL's SFTTrainer formats), with the checkpoint's own chat template, the loss on
assistant tokens only, and optional packing.

It reads top to bottom: the checkpoint's tokenizer and chat template; the examples (rendered,
tokenized, masked; over-long and untrainable ones dropped and counted); the run's folder (the
tokenizer with its template beside it, run.json); the model (LoRA, quantized base, fused update,
packing) restored from the last checkpoint; `fit`; the Hugging Face folder out. Everything the
other recipes have (validation, resume, LoRA/QLoRA, strategies) is theirs: recipes.runner's steps.

    zoo train --recipe sft --weights smollm2/ --data chat.jsonl --out-dir runs/chat --packing \\
        --lora-rank 16 --quantize int4 --sequence-length 1024
"""

from __future__ import annotations

import functools

import keras

from recipes import runner
from recipes import sft_data as data
from recipes.conversation import save_chat, tokenizer_and_template
from zoo.chat import EncodedChat


def show_mask(recipe, data_path, row, out_dir="") -> str:
    """Row `row` (1-based) of `data_path` as the run will train it: the rendered text with the trained tokens
    between ⟦ and ⟧, and the counts (`zoo train --recipe sft --show-mask ROW`)."""
    tokenizer, template = tokenizer_and_template(recipe, out_dir)
    kind, rows = data.read_rows(data_path)
    if not 1 <= row <= len(rows):
        raise ValueError(f"--show-mask {row}: {data_path} has rows 1 to {len(rows)}.")
    data.examples(kind, rows, template, tokenizer, 10**9, recipe.loss_on, numbers=[row],  # refuses, by row, as a run
                  template_kwargs=recipe.chat_template_kwargs)
    eos = template.special_tokens.get("eos_token", "") if template is not None else ""
    text, spans = data.text_and_spans(kind, rows[row - 1], template, eos, tokenizer.control_tokens,
                                       recipe.chat_template_kwargs)
    encoded, offsets = tokenizer.encode_with_offsets(text, None if recipe.loss_on == "all" else spans)
    shown = EncodedChat(encoded.ids, encoded.mask, text, tuple(spans or ()), offsets)
    return f"{shown.show_mask()}\n-- row {row}: {len(shown.ids)} tokens, {int(shown.mask.sum())} trained"


def run(recipe, data_path, out_dir, steps=None, validation_every=0, validation_batches=8, callbacks=(),
        verbose="auto", hf_out=None, strategy=None, devices=None, merge=False, collective_timeout=None):
    """Fine-tune `recipe` (recipe "sft", `recipes.get("sft", weights=...)`) on the JSONL rows at
    `data_path` into `out_dir`, resuming what `out_dir` holds. Arguments as `recipes.run`;
    `validation_every` holds out every n-th row. Returns a `recipes.Result` whose tokens/s counts
    the tokens trained on (assistant tokens), and whose `data` says what packing did."""
    recipe, cluster = runner.begin(recipe, steps, strategy, devices, collective_timeout)
    if recipe.weights is None:
        raise ValueError("Supervised fine-tuning starts from a pretrained decoder and its chat template: pass "
                         "weights= (--weights FOLDER): a Hugging Face folder, or a GGUF file converted by "
                         "zoo.hub.convert_gguf.")
    runner.check_lengths(recipe)

    # 1. The checkpoint's tokenizer (as transformers tokenizes: tokenizer.json) and chat template.
    tokenizer, template = tokenizer_and_template(recipe, out_dir)

    # 2. The examples: every row checked, over-long and untrainable ones dropped and counted.
    kind, rows = data.read_rows(data_path)
    numbers = range(1, len(rows) + 1)  # every `validation_every`-th row is held out
    held = [n for n in numbers if validation_every and (n - 1) % validation_every == 0]
    kept = set(numbers) - set(held)
    train_examples, report = data.examples(kind, rows, template, tokenizer, recipe.sequence_length, recipe.loss_on,
                                           numbers=[n for n in numbers if n in kept],
                                           template_kwargs=recipe.chat_template_kwargs)
    for line in report.lines(recipe.sequence_length):
        print(line)
    if not train_examples:
        fixes = (["raise --sequence-length"] if report.too_long else []) + (
            ["give rows an assistant message with an answer"] if report.no_trained_token else [])
        raise ValueError(f"No example of {data_path} fits {recipe.sequence_length} positions with a token to train "
                         f"on; {' or '.join(fixes) or 'check the rows'} (report above).")
    valid_examples = None
    if held:
        valid_examples, valid_report = data.examples(kind, rows, template, tokenizer, recipe.sequence_length,
                                                     recipe.loss_on, numbers=held,
                                                     template_kwargs=recipe.chat_template_kwargs)
        print("Validation: " + " ".join(valid_report.lines(recipe.sequence_length)))
    stats = data.statistics(train_examples, recipe)
    print(f"{'Packed' if recipe.packing else 'Padded'} rows of {recipe.sequence_length}: {stats['rows']} an epoch, "
          f"{stats['examples_per_row']:.2f} examples and {stats['trained_tokens_per_row']:.0f} trained tokens a row, "
          f"{stats['padding_fraction']:.1%} padding.")
    if stats["rows"] < recipe.batch_size:  # here, before out_dir is written; the batches' own check is a backstop
        raise ValueError(f"{stats['rows']} row(s) an epoch make no batch of {recipe.batch_size}; lower --batch-size "
                         "or give more rows.")

    # 3. The run's folder: the tokenizer with the template beside it, run.json.
    meta, base = runner.run_meta(recipe, out_dir, None, merge, hf_out)
    meta["data"] = {"format": kind, **stats}
    keras.utils.set_random_seed(recipe.seed)

    beside_tokenizer = functools.partial(save_chat, tokenizer, template)
    if cluster.chief:
        runner.prepare(recipe, out_dir, None, meta, beside_tokenizer=beside_tokenizer)
    cluster.barrier()

    # 4. The model, restored; 5. fit; 6. the Hugging Face folder.
    model, start = runner.restore(recipe, cluster, out_dir, base)
    skip = start * recipe.accumulation_steps
    train = cluster.distribute(data.dataset(train_examples, recipe, training=True, skip=skip))
    valid = data.dataset(valid_examples, recipe, training=False) if valid_examples else None
    tokens_per_batch = stats["trained_tokens_per_row"] * recipe.batch_size
    result = runner.train_and_save(recipe, model, cluster, out_dir, start, train, valid, validation_batches,
                                   validation_every, callbacks, verbose, base, tokens_per_batch=tokens_per_batch)
    result.data = meta["data"]
    if hf_out and cluster.chief:
        runner.write_hf(recipe, model, out_dir, hf_out, runner.saved_tokenizer(recipe, out_dir), None, merge)
        beside_tokenizer(hf_out)
    return result
