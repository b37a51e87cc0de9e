"""The reference model of preference tuning, in one place. Where it comes from is the recipe's
(`Recipe.preference_reference`): a LoRA run's base with its adapters off, in the step (nothing here), or
log-probabilities stored before training, scored by `--reference FOLDER` (loaded for that pass only) or by the
starting weights. Stored scores go to `REFERENCE_FILE` in the run's folder, written whole or not at all, with a
fingerprint of the pairs and of the reference, so a resumed run reads them back instead of scoring (which, past
step 0, the trained policy could no longer do).
"""

from __future__ import annotations

import gc
import hashlib
import os

import numpy as np

import zoo
from recipes import dpo_data, state
from zoo.files import atomic_path

REFERENCE_FILE = "reference_logps.npz"


def stored_scores(recipe, model, cluster, out_dir, train_pairs, valid_pairs) -> dict:
    """{"train", "valid"}: the reference's log-probabilities of each pair [pairs, 2], read back or scored now by
    the chief (before the first step); both None where the reference is not stored (LoRA's base, SimPO)."""
    if recipe.preference_reference != "stored":
        return {"train": None, "valid": None}
    path = os.path.join(out_dir, REFERENCE_FILE)
    want = fingerprint(recipe, [*train_pairs, *valid_pairs])  # reads the reference's weights: only when needed
    stored = read(path, want)
    if stored is None and recipe.reference is None and state.checkpoints(out_dir):
        raise ValueError(f"{out_dir} resumes a run whose reference scores ({REFERENCE_FILE}) are missing or were "
                         "made for other pairs, and the starting weights they came from have been trained since. "
                         "Start a new --out-dir, or pass --reference FOLDER (the starting model).")
    if stored is None and cluster.chief:
        score(recipe, model, path, want, train_pairs, valid_pairs)
    cluster.barrier()
    stored = read(path, want)
    if stored is None:
        raise ValueError(f"This worker does not see the chief's reference scores at {path}; --out-dir must be "
                         "storage every host shares.")
    return {"train": stored["train"], "valid": stored["valid"] if valid_pairs else None}


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
    scores = {name: zoo.preference.reference_logps(scorer, dpo_data.reference_batches(
        pairs, recipe.batch_size, recipe.sequence_length)) for name, pairs in (("train", train_pairs),
                                                                               ("valid", valid_pairs))}
    del scorer
    gc.collect()
    with atomic_path(path, overwrite=True) as tmp:
        with open(tmp, "wb") as f:  # np.savez adds .npz to a bare path
            np.savez(f, fingerprint=np.array(want), **scores)


def read(path, want):
    """The stored scores when the file exists and fits `want` (an .npz holds arrays only: no pickle)."""
    if not os.path.isfile(path):
        return None
    with np.load(path, allow_pickle=False) as stored:
        if str(stored["fingerprint"]) != want:
            return None
        return {"train": stored["train"], "valid": stored["valid"]}
