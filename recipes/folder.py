"""The run's folder before training, which the chief writes and every worker reads: run.json (checked against
what out_dir already holds), and the run's tokenizer, written whole with the recipe kind's chat files beside it:
the one a resumed run already wrote, the pretrained weights' own, the recipe's vocabulary files, or one trained
on the kind's corpus."""

from __future__ import annotations

import os
import shutil
import tempfile

import zoo
from recipes import pretrained, state
from recipes import vocab as vocab_lib
from zoo.files import atomic_path, write_json
from zoo.loading import TOKENIZER_DIR, base_record


def record(recipe, out_dir, labels=None, merge=False, hf_out=None):
    """(run.json's record, the LoRA base record or None), checked against what out_dir already holds."""
    if merge and not (recipe.lora_rank and hf_out):
        raise ValueError("merge (--merge) writes a LoRA run's adapters merged into its base as --hf-out; it needs "
                         "lora_rank (--lora-rank) and hf_out (--hf-out).")
    meta = {"model": recipe.name, "task": recipe.task, "spec": recipe.spec.to_dict(),
            "recipe": recipe.to_dict(), "labels": labels}
    base = None
    if recipe.lora_rank:  # what the adapters go on, fingerprinted: a run keeps only the adapters
        base = base_record(recipe.weights, recipe.task, recipe.quantize, len(labels) if labels else None)
        meta["base"] = base
    state.check_compatible(out_dir, meta)
    return meta, base


def write(recipe, out_dir, corpus, meta, beside_tokenizer=None):
    """The chief's part before training: the tokenizer (checked, written) and run.json.
    `beside_tokenizer(folder)` writes more files into the tokenizer's folder (a chat template)."""
    scratch = tempfile.mkdtemp(prefix="recipes-vocab-")
    try:
        tokenizer, source = _choose(recipe, out_dir, corpus, scratch)
        if beside_tokenizer is not None and source == scratch:
            beside_tokenizer(scratch)
        if tokenizer.vocabulary_size() > recipe.spec.vocab_size:
            raise ValueError(f"The tokenizer has {tokenizer.vocabulary_size()} tokens but {recipe.name!r} embeds "
                             f"only {recipe.spec.vocab_size}; use a smaller vocabulary or override vocab_size.")
        vocab_lib.special_ids(tokenizer)
        # All checks passed: from here on out_dir is written.
        os.makedirs(out_dir, exist_ok=True)
        saved = os.path.join(out_dir, TOKENIZER_DIR)
        if source != saved:  # whole or not at all: a resumed run reads it back
            with atomic_path(saved, overwrite=True) as tmp:
                if recipe.weights:  # the checkpoint's tokenizer, settings included
                    shutil.copytree(source, tmp)
                else:
                    vocab_lib.copy(source, vocab_lib.family_of(recipe.spec), tmp)
        write_json(os.path.join(out_dir, state.RUN_FILE), meta)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    state.discard_partial(out_dir)
    return tokenizer


def saved_tokenizer(recipe, out_dir):
    """The tokenizer a run already wrote into out_dir (None if there is none yet)."""
    saved = os.path.join(out_dir, TOKENIZER_DIR)
    if recipe.weights:  # the checkpoint's own tokenizer, in whichever files it came (None if none yet)
        return zoo.hub.load_tokenizer(saved) if os.path.isdir(saved) else None
    family = vocab_lib.family_of(recipe.spec)
    return vocab_lib.load(saved, family, recipe.lowercase) if vocab_lib.files_in(saved, family) else None


def chiefs_tokenizer(recipe, out_dir):
    tokenizer = saved_tokenizer(recipe, out_dir)
    if tokenizer is None:
        raise ValueError(f"This worker does not see the tokenizer the chief wrote into {out_dir!r}: a multi-worker "
                         "run's --out-dir must be storage every host shares (NFS, a mounted bucket), at the same path.")
    return tokenizer


def _choose(recipe, out_dir, corpus, scratch):
    """(tokenizer, its files): the one already in out_dir (resume), the pretrained
    weights' own, the recipe's vocabulary files, or one trained on `corpus` (its text, written to
    `scratch`)."""
    family = vocab_lib.family_of(recipe.spec)
    saved = os.path.join(out_dir, TOKENIZER_DIR)
    if state.resumes(out_dir) and (tokenizer := saved_tokenizer(recipe, out_dir)) is not None:
        return tokenizer, saved
    if recipe.weights:
        tokenizer = pretrained.tokenizer(recipe.weights)
        zoo.hub.save_tokenizer(tokenizer, scratch)
        return tokenizer, scratch
    if recipe.vocabulary:
        return vocab_lib.load(recipe.vocabulary, family, recipe.lowercase), recipe.vocabulary
    print(f"Training a {'WordPiece' if family == 'bert' else 'byte-level BPE'} vocabulary of "
          f"{recipe.spec.vocab_size} tokens on the corpus...")
    return vocab_lib.train(corpus, family, recipe.spec.vocab_size, scratch, recipe.lowercase), scratch
