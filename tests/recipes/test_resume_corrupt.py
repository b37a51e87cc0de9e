"""A checkpoint the disk damaged after it was written whole (truncated weights, a state.json that is not JSON) does not
stop a resume: the run goes back to the newest checkpoint that reads whole, names the corrupt one in a warning and
keeps it aside, unchanged. With none intact the run says so and resumes nothing."""

import hashlib
import json
import os

import keras
import numpy as np
import pytest

import recipes
from recipes import state


def model_and_optimizer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.AdamW(1e-3)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def digest(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))}


def test_a_corrupt_newest_checkpoint_is_kept_aside_and_the_one_before_resumes(tmp_path):
    out = str(tmp_path)
    model, optimizer = model_and_optimizer()
    weights = {}
    for step in (2, 4, 6):
        model.set_weights([w + step for w in model.get_weights()])
        weights[step] = [w.copy() for w in model.get_weights()]
        state.save(out, step, model, optimizer, keep=3)
    folders = dict(state.checkpoints(out))
    # step 6: weights truncated mid-file; step 4: state.json overwritten with something that is not JSON
    with open(os.path.join(folders[6], "model.safetensors"), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    with open(os.path.join(folders[4], "state.json"), "w") as f:
        f.write('{"step": 4, "model_variables": [')
    damaged = {step: digest(folders[step]) for step in (4, 6)}

    # A worker that is not the chief skips them and moves nothing.
    with pytest.warns(UserWarning) as warned:
        assert state.restore_latest(out, *model_and_optimizer(), chief=False)[0] == 2
    assert [str(w.message).split(":")[0] for w in warned] == ["Checkpoint step 6 is corrupt",
                                                              "Checkpoint step 4 is corrupt"]
    assert all("Left for the chief to move aside" in str(w.message) for w in warned)
    assert [s for s, _ in state.checkpoints(out)] == [2, 4, 6]

    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    with pytest.warns(UserWarning) as warned:
        step, folder = state.restore_latest(out, model, optimizer)
    assert (step, folder) == (2, folders[2])
    for w, saved in zip(model.get_weights(), weights[2]):
        np.testing.assert_array_equal(w, saved)
    messages = [str(w.message) for w in warned]
    assert "step 6 is corrupt" in messages[0], messages
    assert "model.safetensors is not a whole safetensors file" in messages[0], messages
    assert "step 4 is corrupt" in messages[1] and "state.json is not valid JSON" in messages[1], messages
    # Kept aside unchanged, named in the warning, and out of the checkpoints a run resumes from or prunes.
    for step in (4, 6):
        assert digest(folders[step] + ".corrupt") == damaged[step]
        assert f"Kept as {folders[step]}.corrupt" in messages[(6 - step) // 2]
    assert state.checkpoints(out) == [(2, folders[2])]
    for step in (4, 6, 8):  # the resumed run writes its checkpoints again, keep=2 prunes only intact ones
        state.save(out, step, model, optimizer, keep=2)
    assert [s for s, _ in state.checkpoints(out)] == [6, 8]
    assert os.path.isdir(folders[6] + ".corrupt") and os.path.isdir(folders[4] + ".corrupt")


def test_no_intact_checkpoint_stops_the_run_and_says_so(tmp_path):
    out = str(tmp_path)
    model, optimizer = model_and_optimizer()
    state.save(out, 2, model, optimizer)
    (folder,) = (f for _, f in state.checkpoints(out))
    os.remove(os.path.join(folder, "optimizer.safetensors"))
    with pytest.warns(UserWarning, match="step 2 is corrupt"), pytest.raises(ValueError) as refused:
        state.restore_latest(out, model, optimizer)
    assert f"No intact checkpoint in {out!r}: {folder}.corrupt cannot be read" in str(refused.value)
    assert "run the same command again to start the run from step 0" in str(refused.value)
    assert state.restore_latest(out, model, optimizer) == (0, None)  # the same command again: a fresh start
    assert sorted(os.listdir(folder + ".corrupt")) == ["model.safetensors", "state.json"]


def test_a_checkpoint_of_another_model_is_refused_not_skipped(tmp_path):
    """Files that read whole but do not fit the run are the user's mix-up, not the disk's: no fallback past them."""
    out = str(tmp_path)
    state.save(out, 2, *model_and_optimizer())
    state.save(out, 4, keras.Sequential([keras.Input((3,)), keras.layers.Dense(5)]), model_and_optimizer()[1])
    with pytest.raises(ValueError, match="model variable .* has shape"):
        state.restore_latest(out, *model_and_optimizer())
    assert [s for s, _ in state.checkpoints(out)] == [2, 4]


def test_a_folder_without_a_checkpoint_starts_fresh(tmp_path):
    """A run stopped before its first checkpoint (refused, or crashed while building) left run.json and nothing
    trained: the corrected command (another batch size, another model) starts fresh there instead of being refused
    as a different run; once a checkpoint exists, it is a run to resume and a different recipe is refused."""
    out = str(tmp_path)
    first, corrected = (recipes.get("dec-base", batch_size=size) for size in (16, 4))
    meta = {name: {"model": "dec-base", "task": r.task, "spec": r.spec.to_dict(), "recipe": r.to_dict()}
            for name, r in (("first", first), ("corrected", corrected))}
    (tmp_path / state.RUN_FILE).write_text(json.dumps(meta["first"]))
    assert not state.resumes(out)
    state.check_compatible(out, meta["corrected"])
    state.save(out, 2, *model_and_optimizer())
    assert state.resumes(out)
    with pytest.raises(ValueError, match=r"different recipe \(fields \['batch_size'\] differ\)"):
        state.check_compatible(out, meta["corrected"])
