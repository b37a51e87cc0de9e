"""`recipes.dpo.run`: preference tuning of a pretrained (usually SFT-tuned) decoder on prompt / chosen /
rejected pairs: DPO (sigmoid, IPO, robust) or SimPO, with no second model in memory.

It reads top to bottom: the checkpoint's tokenizer and chat template; the pairs (rendered, tokenized,
the completions masked; over-long ones dropped and counted); the run's folder; the model restored from
the last checkpoint; the reference; `fit`; the Hugging Face folder out. The reference is, in this order:
  - `--reference FOLDER`: that model scores every pair once, before training, and is dropped;
  - a LoRA run: the same model with its adapters off, in the step (nothing stored);
  - otherwise the starting weights score every pair once, before the first step.
Stored scores go to `reference_logps.npz` in the run's folder, written whole or not at all, with a
fingerprint of the pairs and of the reference, so a resumed run reads them back instead of scoring
(which, past step 0, the trained policy could no longer do).

    zoo train --recipe dpo --weights sft-merged/ --data pairs.jsonl --out-dir runs/dpo \\
        --lora-rank 16 --lora-targets all-linear --quantize int4 --checkpointing full --sequence-length 1024
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os

import keras
import numpy as np

import zoo
from recipes import dpo_data as data
from recipes import runner, state
from recipes.sft import save_chat, tokenizer_and_template
from zoo.files import atomic_path

REFERENCE_FILE = "reference_logps.npz"


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

    # 4. The reference's stored scores, if they are (a resumed run must find them); 5. the model, restored.
    path, want, stored = os.path.join(out_dir, REFERENCE_FILE), None, None
    if recipe.preference_reference == "stored":  # the fingerprint reads the reference's weights: only when needed
        want = fingerprint(recipe, [*train_pairs, *valid_pairs])
        stored = _read(path, want)
    if recipe.preference_reference == "stored" and stored is None and recipe.reference is None and (
            state.checkpoints(out_dir)):
        raise ValueError(f"{out_dir} resumes a run whose reference scores ({REFERENCE_FILE}) are missing or were "
                         "made for other pairs, and the starting weights they came from have been trained since. "
                         "Start a new --out-dir, or pass --reference FOLDER (the starting model).")
    model, start = runner.restore(recipe, cluster, out_dir, base)
    reference = {"train": None, "valid": None}
    if recipe.preference_reference == "stored":
        if stored is None and cluster.chief:
            score(recipe, model, path, want, train_pairs, valid_pairs)
        cluster.barrier()
        stored = _read(path, want)
        if stored is None:
            raise ValueError(f"This worker does not see the chief's reference scores at {path}; --out-dir must be "
                             "storage every host shares.")
        reference = {"train": stored["train"], "valid": stored["valid"] if valid_pairs else None}

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


def fingerprint(recipe, pairs) -> str:
    """What the stored scores depend on: the pairs' tokens and masks, the reference's weights, precision."""
    digest = hashlib.sha256()
    source = recipe.reference or recipe.weights
    digest.update(zoo.hub.weights.fingerprint(zoo.hub.local_folder(source)).encode())
    digest.update(f"{recipe.precision}|{recipe.quantize}".encode())
    for pair in pairs:
        for part in (pair.chosen, pair.rejected):
            digest.update(np.asarray(part.ids, np.int32).tobytes())
            digest.update(np.asarray(part.mask, np.int8).tobytes())
    return digest.hexdigest()


def score(recipe, model, path, want, train_pairs, valid_pairs):
    """Score every pair with the reference (`recipe.reference`, loaded for this pass only, or `model`, the
    starting weights) and write the scores to `path`, whole or not at all."""
    scorer = model
    if recipe.reference:  # a second model only for this pass, loaded as the policy's base is
        print(f"Scoring the pairs with the reference model {recipe.reference}...")
        scorer = zoo.hub.load(recipe.reference, task="causal_lm", dtype=recipe.dtype_policy, tokenizer=False,
                              quantize=recipe.quantize or None)
        if scorer.spec.vocab_size != model.spec.vocab_size:
            raise ValueError(f"The reference model {recipe.reference} has a vocabulary of {scorer.spec.vocab_size} "
                             f"tokens, the policy {model.spec.vocab_size}: the reference must share the policy's "
                             "tokenizer.")
    else:
        print("Scoring the pairs with the starting weights (the reference)...")
    scores = {name: zoo.preference.reference_logps(scorer, data.reference_batches(
        pairs, recipe.batch_size, recipe.sequence_length)) for name, pairs in (("train", train_pairs),
                                                                               ("valid", valid_pairs))}
    del scorer
    gc.collect()
    with atomic_path(path, overwrite=True) as tmp:
        with open(tmp, "wb") as f:  # np.savez adds .npz to a bare path
            np.savez(f, fingerprint=np.array(want), **scores)


def _read(path, want):
    """The stored scores when the file exists and fits `want` (an .npz holds arrays only: no pickle)."""
    if not os.path.isfile(path):
        return None
    with np.load(path, allow_pickle=False) as stored:
        if str(stored["fingerprint"]) != want:
            return None
        return {"train": stored["train"], "valid": stored["valid"]}
