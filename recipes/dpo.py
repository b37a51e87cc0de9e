"""`recipes.dpo.run`: preference tuning of a pretrained (usually SFT-tuned) decoder on prompt / chosen /
rejected pairs: DPO (sigmoid, IPO, robust) or SimPO, with no second model in memory.

It reads top to bottom: the checkpoint's tokenizer and chat template; the pairs (rendered, tokenized,
the completions masked; over-long ones dropped and counted); the run's folder; the model restored from
the last checkpoint; the reference; `fit`; the Hugging Face folder out. The reference is, in this order:
  - `--reference FOLDER`: that model scores every pair once, before training, and is dropped;
  - a LoRA run: the same model with its adapters off, in the step (nothing stored);
  - otherwise the starting weights score every pair once, before the first step.
Stored scores are recipes.reference's.

    zoo train --recipe dpo --weights sft-merged/ --data pairs.jsonl --out-dir runs/dpo \\
        --lora-rank 16 --lora-targets all-linear --quantize int4 --checkpointing full --sequence-length 1024
"""

from __future__ import annotations

import functools

import keras
import numpy as np

from recipes import dpo_data as data
from recipes import runner
from recipes.conversation import save_chat, tokenizer_and_template
from recipes.reference import stored_scores


def run(recipe, data_path, out_dir, steps=None, validation_every=0, validation_batches=8, callbacks=(),
        verbose="auto", hf_out=None, strategy=None, devices=None, merge=False, collective_timeout=None):
    """Tune `recipe` (recipe "dpo" or "simpo", `recipes.get("dpo", weights=...)`) on the JSONL pairs at
    `data_path` into `out_dir`, resuming what `out_dir` holds. Arguments as `recipes.run`;
    `validation_every` holds out every n-th pair. Returns a `recipes.Result` whose history carries
    TRL's metric names (rewards/accuracies, ...) and whose tokens/s counts completion tokens."""
    recipe, cluster = runner.begin(recipe, steps, strategy, devices, collective_timeout)
    if recipe.weights is None:
        raise ValueError("Preference tuning starts from a pretrained decoder (usually the SFT run's, merged: "
                         "--hf-out MERGED --merge): pass weights= (--weights FOLDER).")
    runner.check_lengths(recipe)

    # 1. The checkpoint's tokenizer and chat template (saved with a resumed run).
    tokenizer, template = tokenizer_and_template(recipe, out_dir)

    # 2. The pairs: every row checked, over-long pairs dropped and counted; every n-th held out.
    kind, rows = data.read_rows(data_path)
    numbers = range(1, len(rows) + 1)
    held = {n for n in numbers if validation_every and (n - 1) % validation_every == 0}
    train_pairs, report = data.pairs(kind, rows, template, tokenizer, recipe.sequence_length,
                                     numbers=[n for n in numbers if n not in held],
                                     template_kwargs=recipe.chat_template_kwargs)
    for line in report.lines(recipe.sequence_length):
        print(line)
    if not train_pairs:
        raise ValueError(f"No pair of {data_path} fits {recipe.sequence_length} positions; raise --sequence-length, "
                         "or check the rows (report above).")
    if len(train_pairs) < recipe.batch_size:  # here, before out_dir is written; the batches' own check is a backstop
        raise ValueError(f"{len(train_pairs)} pair(s) make no batch of {recipe.batch_size}; lower --batch-size or "
                         "give more pairs.")
    valid_pairs = []
    if held:
        valid_pairs, valid_report = data.pairs(kind, rows, template, tokenizer, recipe.sequence_length,
                                               numbers=sorted(held), template_kwargs=recipe.chat_template_kwargs)
        print("Validation: " + " ".join(valid_report.lines(recipe.sequence_length)))

    # 3. The run's folder: the tokenizer with the template beside it, run.json.
    meta, base = runner.run_meta(recipe, out_dir, None, merge, hf_out)
    meta["data"] = data.statistics(train_pairs, recipe.sequence_length)
    keras.utils.set_random_seed(recipe.seed)

    beside_tokenizer = functools.partial(save_chat, tokenizer, template)
    if cluster.chief:
        runner.prepare(recipe, out_dir, None, meta, beside_tokenizer=beside_tokenizer)
    cluster.barrier()

    # 4. The model, restored; 5. the reference's stored scores, read back or scored now (recipes.reference).
    model, start = runner.restore(recipe, cluster, out_dir, base)
    reference = stored_scores(recipe, model, cluster, out_dir, train_pairs, valid_pairs)

    # 6. fit; 7. the Hugging Face folder.
    skip = start * recipe.accumulation_steps
    train = cluster.distribute(data.dataset(train_pairs, recipe, training=True, skip=skip,
                                            reference=reference["train"]))
    valid = data.dataset(valid_pairs, recipe, training=False, reference=reference["valid"]) if valid_pairs else None
    completion = np.mean([p.chosen.mask[1:].sum() + p.rejected.mask[1:].sum() for p in train_pairs])
    result = runner.train_and_save(recipe, model, cluster, out_dir, start, train, valid, validation_batches,
                                   validation_every, callbacks, verbose, base,
                                   tokens_per_batch=completion * recipe.batch_size)
    result.data = meta["data"]
    if hf_out and cluster.chief:
        runner.write_hf(recipe, model, out_dir, hf_out, runner.saved_tokenizer(recipe, out_dir), None, merge)
        beside_tokenizer(hf_out)
    return result
