"""A run's state on disk: what it trains (run.json) and its checkpoints.

    out_dir/run.json                    model, spec, task, recipe, labels
    out_dir/checkpoints/step-000100/    model.safetensors  (every model variable,
                                        dropout seed states included; with LoRA only
                                        the trainable ones and the seed states)
                                        optimizer.safetensors (moments, step counter,
                                        accumulators, loss scale)
                                        state.json         (step, variable paths; with
                                        LoRA the base they go on, zoo.loading.base_record)

Everything is written into a temporary sibling and renamed into place, so a run
killed at any instant leaves either the old checkpoint or the new one, never half
of one. Weights are safetensors (never pickles).
"""

import os
import shutil
import warnings

import numpy as np
from safetensors.numpy import save_file

from recipes.recipe import LEGACY_TASKS, Recipe
from zoo import lora
from zoo.files import atomic_path, write_json
from zoo.loading import check_base
from zoo.optimizers import Adafactor
from zoo.reading import UnreadableFile, load_safetensors, read_json

RUN_FILE = "run.json"
CHECKPOINTS = "checkpoints"
KERAS_ADAFACTOR = ("Recipes called Keras' Adafactor (a full-size velocity) 'adafactor' before it became the zoo's "
                   "factored Adafactor; Keras' is now 'keras-adafactor'.")


def read_run(out_dir):
    """The run.json of `out_dir` (None if absent), with task names of older runs updated."""
    path = os.path.join(out_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    run = read_json(path)
    for record in (run, run.get("recipe", {})):
        if "task" in record:
            record["task"] = LEGACY_TASKS.get(record["task"], record["task"])
    if "recipe" in run:
        recipe = run["recipe"]
        # A run from before weights_dtype (added with the factored Adafactor) trained "adafactor" with Keras'.
        if recipe.get("optimizer") == "adafactor" and "weights_dtype" not in recipe:
            recipe["optimizer"] = "keras-adafactor"
        # A preference run from before completion_mask scored conversations by TRL's rule (recipes.dpo_data).
        if recipe.get("preference") and "completion_mask" not in recipe:
            recipe["completion_mask"] = "trl"
        for name, default in Recipe.defaults().items():  # fields added since: their defaults (what the run used)
            recipe.setdefault(name, default)
    return run


def check_compatible(out_dir, meta):
    """Refuse an out_dir that holds another model's (or another recipe's) run."""
    old = read_run(out_dir)
    if old is None:
        if os.path.isdir(os.path.join(out_dir, CHECKPOINTS)):
            raise ValueError(f"out_dir {out_dir!r} holds checkpoints but no {RUN_FILE}; it is not a recipes run. "
                             "Pass an empty or new --out-dir.")
        return
    if not resumes(out_dir):
        return  # stopped before its first checkpoint (a refused batch size, a crash while building): nothing to keep
    if old["spec"] != meta["spec"] or old["task"] != meta["task"]:
        raise ValueError(
            f"out_dir {out_dir!r} holds a checkpoint of another model ({old['model']!r}, task {old['task']!r}, "
            f"{old['spec']['num_layers']} layers x {old['spec']['hidden_dim']}), not of {meta['model']!r} "
            f"(task {meta['task']!r}, {meta['spec']['num_layers']} layers x {meta['spec']['hidden_dim']}). "
            "Pass a new --out-dir to start a fresh run; nothing was changed."
        )
    if old.get("base") and meta.get("base"):
        check_base(old["base"], found=meta["base"])
    keys = set(old["recipe"]) | set(meta["recipe"])
    changed = sorted(k for k in keys if old["recipe"].get(k) != meta["recipe"].get(k))
    if "optimizer" in changed and old["recipe"]["optimizer"] == "keras-adafactor":
        raise ValueError(f"out_dir {out_dir!r} holds a run trained with Keras' Adafactor. {KERAS_ADAFACTOR} Resume it "
                         "with optimizer='keras-adafactor' (zoo train --optimizer keras-adafactor), or pass a new "
                         "--out-dir.")
    if changed:
        raise ValueError(
            f"out_dir {out_dir!r} holds a run of the same model with a different recipe (fields {changed} differ); "
            "resuming would mix two schedules. Use the same recipe and steps, or a new --out-dir."
        )


def checkpoints(out_dir):
    """[(step, folder)] of complete checkpoints, oldest first."""
    root = os.path.join(out_dir, CHECKPOINTS)
    if not os.path.isdir(root):
        return []
    found = [(int(n.split("-")[1]), os.path.join(root, n)) for n in os.listdir(root)
             if n.startswith("step-") and "." not in n]
    return sorted(found)


def resumes(out_dir) -> bool:
    """Whether a run on `out_dir` resumes (a checkpoint to start from) rather than starting fresh: a folder a run
    left before its first checkpoint holds nothing trained, and its run.json and tokenizer are written again."""
    return bool(checkpoints(out_dir))


def discard_partial(out_dir):
    """Clean up after a checkpoint write that was killed mid-way (SIGKILL, power loss),
    which gave `atomic_path` no chance to: its temporary `.step-N.tmp-*` folder is
    removed, and an earlier copy moved aside as `.step-N.old-*` is put back if the
    new one never took its place."""
    root = os.path.join(out_dir, CHECKPOINTS)
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        final = os.path.join(root, name[1:].split(".", 1)[0])
        if name.startswith(".step-") and ".old-" in name and not os.path.exists(final):
            os.replace(path, final)
        elif name.startswith(".step-") and (".tmp-" in name or ".old-" in name):
            shutil.rmtree(path, ignore_errors=True)


def _arrays(variables):
    # .numpy(): np.asarray(v.value) fails on a MultiWorkerMirroredStrategy copy of the optimizer's step counter
    # (int64, aggregation "only_first_replica": "object __array__ method not producing an array").
    return {f"{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}


def model_variables(model) -> list:
    """What a checkpoint keeps of the model: every variable, or with LoRA only the trainable ones
    (adapters, a new head) and the dropout seed states; the frozen base is the run's `base`.
    Never Keras' save_weights: with LoRA it writes merged kernels and loads A = B = 0 (docs/lora.md)."""
    if not lora.has_lora(model):
        return model.variables
    return [v for v in model.variables if v.trainable or v.path.endswith("seed_generator_state")]


def save(out_dir, step, model, optimizer, keep=2, base=None):
    root = os.path.join(out_dir, CHECKPOINTS)
    final = os.path.join(root, f"step-{step:09d}")
    # The same step saved again (a resumed run) replaces the earlier copy only once the new one is whole.
    with atomic_path(final, overwrite=True) as tmp:
        tmp.mkdir(parents=True)
        variables = model_variables(model)
        save_file(_arrays(variables), os.path.join(tmp, "model.safetensors"))
        save_file(_arrays(optimizer.variables), os.path.join(tmp, "optimizer.safetensors"))
        write_json(os.path.join(tmp, "state.json"), {
            "step": step, "model_variables": [v.path for v in variables],
            "optimizer_variables": [v.path for v in optimizer.variables], **({"base": base} if base else {}),
        })
    for _, old in checkpoints(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _assign(variables, arrays, names, what, folder):
    if len(arrays) != len(variables):
        raise ValueError(f"Checkpoint {folder!r} holds {len(arrays)} {what} variables, the run has {len(variables)}: "
                         "it was written by a different model or optimizer setup.")
    for i, v in enumerate(variables):
        value = arrays[f"{i:05d}"]
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"Checkpoint {folder!r}: {what} variable {names[i]!r} has shape {value.shape}, "
                             f"the run's {v.path!r} has {tuple(v.shape)}.")
        v.assign(value)


def _check_optimizer(folder, names, optimizer):
    """Keras' Adafactor keeps a velocity beside its factors; the factored Adafactor never does."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, Adafactor) and any(name.endswith("_velocity") for name in names):
        raise ValueError(f"Checkpoint {folder!r} was written by Keras' Adafactor, not the factored Adafactor this run "
                         f"builds. {KERAS_ADAFACTOR} Restore it with optimizer='keras-adafactor' "
                         "(zoo train --optimizer keras-adafactor).")


class CorruptCheckpoint(ValueError):
    """A checkpoint's files cannot be read whole (truncated, overwritten, missing): the disk's doing, not the run's."""


def _read(folder, name):
    """One file of a checkpoint (state.json or a safetensors file); one that cannot be read: CorruptCheckpoint."""
    path = os.path.join(folder, name)
    try:
        return read_json(path) if name.endswith(".json") else load_safetensors(path)
    except (UnreadableFile, OSError) as error:  # truncated, overwritten or missing
        raise CorruptCheckpoint(str(error)) from None


def restore(folder, model, optimizer, base=None) -> int:
    """Load a checkpoint into the built model and optimizer; with LoRA, `base` (the run's base
    record) must be the one the checkpoint was trained on. Returns its step. Every file is read
    before anything is assigned: a corrupt one changes nothing."""
    state = _read(folder, "state.json")
    if state.get("base") and base:
        check_base(state["base"], found=base)
    _check_optimizer(folder, state["optimizer_variables"], optimizer)
    model_arrays, optimizer_arrays = _read(folder, "model.safetensors"), _read(folder, "optimizer.safetensors")
    _assign(model_variables(model), model_arrays, state["model_variables"], "model", folder)
    _assign(optimizer.variables, optimizer_arrays, state["optimizer_variables"], "optimizer", folder)
    return state["step"]


def restore_latest(out_dir, model, optimizer, base=None, chief=True):
    """(step, folder) of the newest checkpoint of `out_dir` that reads whole, restored into the model and optimizer;
    (0, None) when there is none. A newer one that does not read whole is named in a warning and, by the chief, moved
    aside as `step-N.corrupt` (kept, never deleted: it may be recovered by hand). When every checkpoint is corrupt the
    run stops and says so: running the same command again then starts from step 0."""
    corrupt = []
    for step, folder in reversed(checkpoints(out_dir)):
        try:
            return restore(folder, model, optimizer, base), folder
        except CorruptCheckpoint as error:
            kept = _move_aside(folder) if chief else folder  # only the chief writes into out_dir
            corrupt.append(kept)
            where = f"Kept as {kept}" if chief else "Left for the chief to move aside"
            warnings.warn(f"Checkpoint step {step} is corrupt: {error}. {where}; resuming from the one before it.",
                          stacklevel=2)
    if corrupt:
        raise ValueError(f"No intact checkpoint in {out_dir!r}: {', '.join(corrupt)} cannot be read. They are kept "
                         "aside; run the same command again to start the run from step 0, or pass a new --out-dir.")
    return 0, None


def _move_aside(folder):
    """`step-N` -> `step-N.corrupt` (or `.corrupt-2`, ...): out of `checkpoints()`, and of the `keep` count."""
    target, n = f"{folder}.corrupt", 1
    while os.path.exists(target):
        n += 1
        target = f"{folder}.corrupt-{n}"
    os.replace(folder, target)
    return target
