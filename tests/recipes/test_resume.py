"""A run interrupted anywhere and started again on the same out_dir ends bitwise
equal to an uninterrupted run of the same length: weights, dropout seed states and
optimizer state (moments, step counters, accumulators, loss scale).

Exact because the causal-LM pipeline is deterministic (seeded shuffle, ordered
maps, `skip` to the resumed micro-batch), every model variable (dropout seed
states included) and every optimizer variable is checkpointed, and each run seeds
the same global RNG. The masked-LM pipeline is not: tf.text draws its masks from
stateful random ops, so a resumed MLM run sees other masks than an uninterrupted
one; these tests train the causal LM.

One uninterrupted reference run (8 steps, a checkpoint every 2) is shared by the
tests. One chain of runs interrupts the same out_dir twice, each run resuming the
last one's: a real SIGKILL inside a checkpoint write (a child process), then an
in-process exception mid-update. Each run costs seconds of tracing, so no
interruption gets a run of its own from the start.

The SIGKILL is what only a process boundary shows (no cleanup, no atexit, nothing of
the dead run's memory): it is tested once, here, on the runner every recipe shares.
The other recipe paths (fused, LoRA, DPO) are interrupted in-process at the same
point, inside the step-4 checkpoint write (`run_interrupted_at_step_4`), which also
shows that a write failing in a run keeps the earlier checkpoint bytewise; each
such path's own state (stored reference, adapters only, rounding keys) must resume
bitwise all the same.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file

import recipes
from recipes import state
from tests.common import fresh_process_env, tiny_recipe

STEPS = 8
# One configuration exercises every piece of state a resume must restore: dropout on
# (seed states) under `full` recomputation, 2 micro-batches per update (the data
# position is 2 x step; accumulators), mixed_float16 (loss scale and its counter).
CONFIG = dict(precision="mixed_float16", checkpointing="full", accumulation_steps=2, keep_checkpoints=3)


def make_recipe(vocabulary):
    recipe = tiny_recipe("dec-base", steps=STEPS, log_every=2, checkpoint_every=2, batch_size=4,
                         learning_rate=3e-3, vocabulary=vocabulary, **CONFIG)
    # One block: what a resume restores is per variable, and a block's (seed states, recomputation) are all
    # there in one; each run traces ~25% faster than with two.
    return recipe.replace(model_overrides={**recipe.model_overrides, "dropout": 0.1, "num_layers": 1})


class Interrupted(Exception):
    pass


class InterruptAt(keras.callbacks.Callback):
    """Raises after `micro_batches` training batches, as a crash between two batches would."""

    def __init__(self, micro_batches):
        super().__init__()
        self.micro_batches, self.seen = micro_batches, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.micro_batches:
            raise Interrupted(f"after micro-batch {self.seen}")


def fast_loss_scale_growth():
    """Keras doubles the float16 loss scale after 2,000 finite steps; here after 2, so
    that the scale and its step counter change within the run and a resume must
    restore them. Returns a function that undoes the patch."""
    import keras.src.trainers.trainer as trainer

    real = trainer.LossScaleOptimizer

    class FastGrowth(real):
        def __init__(self, inner_optimizer, **kwargs):
            super().__init__(inner_optimizer, dynamic_growth_steps=2, **kwargs)

    trainer.LossScaleOptimizer = FastGrowth
    return lambda: setattr(trainer, "LossScaleOptimizer", real)


@pytest.fixture(autouse=True)
def _fast_loss_scale_growth():
    undo = fast_loss_scale_growth()
    yield
    undo()


def train(vocabulary, data, out_dir, callbacks=()):
    return recipes.run(make_recipe(vocabulary), data, str(out_dir), column="text", callbacks=callbacks,
                       verbose=0)


def final_state(out_dir):
    """{name: array} of the last checkpoint: model and optimizer variables by path."""
    step, folder = state.checkpoints(str(out_dir))[-1]
    with open(os.path.join(folder, "state.json"), encoding="utf-8") as f:
        names = json.load(f)
    arrays = {}
    for kind in ("model", "optimizer"):
        stored = load_file(os.path.join(folder, f"{kind}.safetensors"))
        # Paths without their first part: an optimizer built again in one process is "adam_w_1".
        arrays.update({f"{kind}:{i}:{path.split('/', 1)[-1]}": stored[f"{i:05d}"]
                       for i, path in enumerate(names[f"{kind}_variables"])})
    return step, arrays


def assert_same_state(resumed_dir, reference):
    step, got = final_state(resumed_dir)
    ref_step, expected = reference
    assert step == ref_step == STEPS
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def leftovers(out_dir):
    """Anything in checkpoints/ that is not a complete step-N folder (temporaries of atomic writes)."""
    root = os.path.join(str(out_dir), state.CHECKPOINTS)
    return sorted(n for n in os.listdir(root) if not (n.startswith("step-") and "." not in n))


def snapshot(folder):
    return {os.path.relpath(os.path.join(d, n), folder): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(folder) for n in names}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, recipes_news, recipes_vocab):
    """The uninterrupted run: (out_dir, final (step, arrays))."""
    undo = fast_loss_scale_growth()  # module scope: the autouse patch is not active yet
    try:
        out = tmp_path_factory.mktemp("reference")
        result = train(recipes_vocab["llama"], recipes_news, out)
    finally:
        undo()
    assert [row["step"] for row in result.history] == [2, 4, 6, 8]
    assert all(np.isfinite(row["loss"]) for row in result.history)
    assert [step for step, _ in state.checkpoints(str(out))] == [4, 6, 8]  # keep_checkpoints=3
    final = final_state(out)
    scale = [value for name, value in final[1].items() if name.endswith("dynamic_scale")]
    assert len(scale) == 1 and float(scale[0]) != 2.0**15, "the loss scale must change during the run"
    return out, final


# ----------------------------------------------------------------------------- the real SIGKILL
KILL_SCRIPT = """
import json, os, signal, sys
import tensorflow as tf
import recipes
from recipes import state
from tests.recipes.test_resume import fast_loss_scale_growth

real = state.save_file

def save_file(tensors, filename, *args, **kwargs):
    # Inside the write of the step-4 checkpoint: its model file is written, the optimizer's is not.
    if "step-000000004" in filename and filename.endswith("optimizer.safetensors"):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no atexit, no finally
    return real(tensors, filename, *args, **kwargs)

state.save_file = save_file
fast_loss_scale_growth()
tf.config.optimizer.set_experimental_options(json.loads(sys.argv[4]))
recipe = recipes.Recipe(**json.loads(sys.argv[1]))
recipes.run(recipe, sys.argv[2], sys.argv[3], column="text", verbose=0)
"""


def run_killed_at_step_4(recipe, data, out_dir):
    """`recipe` in a child process that SIGKILLs itself inside the step-4 checkpoint write;
    asserts it died so, with only the step-2 checkpoint complete. The child optimizes graphs as this process does
    (Grappler's rewrites round differently: tests/conftest.py), so that its steps are bitwise this process's."""
    import tensorflow as tf

    env = fresh_process_env(TF_CPP_MIN_LOG_LEVEL="2")
    grappler = json.dumps(tf.config.optimizer.get_experimental_options())
    args = [sys.executable, "-c", KILL_SCRIPT, json.dumps(recipe.to_dict()), data, str(out_dir), grappler]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stdout[-2000:] + done.stderr[-3000:]
    assert [step for step, _ in state.checkpoints(str(out_dir))] == [2]


class Killed(BaseException):
    """Raised where `run_killed_at_step_4` kills its child; a BaseException, as a
    KeyboardInterrupt, so that no `except Exception` of the run's can swallow it."""


def run_interrupted_at_step_4(run, out_dir):
    """`run()`, a recipes.run on `out_dir` with a checkpoint every 2 steps, interrupted in this
    process where `run_killed_at_step_4` kills its child: inside the write of the step-4
    checkpoint, its model file written and its optimizer's not. Asserts that the complete
    step-2 checkpoint is all the run left, bytewise as it was when the write failed, and no
    temporary (atomic_path removes its own here; after a real kill the next run does)."""
    real, before = state.save_file, {}

    def save_file(tensors, filename, *args, **kwargs):
        if "step-000000004" in filename and filename.endswith("optimizer.safetensors"):
            before.update(snapshot(os.path.join(str(out_dir), state.CHECKPOINTS)))
            raise Killed(filename)
        return real(tensors, filename, *args, **kwargs)

    state.save_file = save_file
    try:
        with pytest.raises(Killed):
            run()
    finally:
        state.save_file = real
    assert [step for step, _ in state.checkpoints(str(out_dir))] == [2]
    assert leftovers(out_dir) == []
    complete = {k: v for k, v in before.items() if k.startswith("step-")}  # without the half-written temporary
    assert sorted({k.split(os.sep)[0] for k in complete}) == ["step-000000002"]
    assert snapshot(os.path.join(str(out_dir), state.CHECKPOINTS)) == complete


def test_sigkill_inside_a_checkpoint_write_then_resume(tmp_path, recipes_news, recipes_vocab, reference, capsys):
    """One run interrupted twice, each time resumed on the same out_dir:
    1. Killed (SIGKILL, a child process) half-way through writing the step-4 checkpoint: the complete
    step-2 checkpoint is all the next run sees; it restarts at step 2 and removes the half-written folder.
    2. That run is interrupted half-way through update 6 (after its micro-batch 7 of 2 per update: updates
    3 to 5 are its first 6): the last checkpoint is step 4, its own.
    3. Resumed from step 4, skipping 4 x 2 = 8 micro-batches, it ends equal to the uninterrupted run:
    weights, seed states, moments, loss scale and counters. (A write failing inside a run:
    `run_interrupted_at_step_4`, in the fused, LoRA and DPO tests.)"""
    out = tmp_path / "run"
    vocabulary = recipes_vocab["llama"]
    run_killed_at_step_4(make_recipe(vocabulary), recipes_news, out)
    partial = leftovers(out)
    assert len(partial) == 1 and partial[0].startswith(".step-000000004.tmp-"), partial  # killed inside the write
    assert os.listdir(out / state.CHECKPOINTS / partial[0]) == ["model.safetensors"]
    assert not (out / "model.keras").exists()

    capsys.readouterr()
    with pytest.raises(Interrupted):
        train(vocabulary, recipes_news, out, callbacks=[InterruptAt(7)])
    assert "Resuming dec-base from step 2" in capsys.readouterr().out
    assert [step for step, _ in state.checkpoints(str(out))] == [2, 4]
    assert leftovers(out) == []
    assert not (out / "model.keras").exists()

    result = train(vocabulary, recipes_news, out)
    assert "Resuming dec-base from step 4" in capsys.readouterr().out
    assert (result.start_step, result.step) == (4, STEPS) and [row["step"] for row in result.history] == [6, 8]
    assert [step for step, _ in state.checkpoints(str(out))] == [4, 6, 8]
    assert (out / "model.keras").is_file()
    assert_same_state(out, reference[1])


def test_out_dir_of_another_recipe_is_refused_untouched(tmp_path, recipes_news, recipes_vocab, reference):
    """A finished run's out_dir, resumed with another learning rate: refused before
    anything is written, every file (checkpoints, logs, model.keras) as it was."""
    out = tmp_path / "copy"
    shutil.copytree(reference[0], out)
    before = snapshot(out)
    assert "model.keras" in before and any(name.startswith("logs") for name in before)
    other = make_recipe(recipes_vocab["llama"]).replace(learning_rate=1e-3)
    with pytest.raises(ValueError, match=r"different recipe \(fields \['learning_rate'\] differ\)"):
        recipes.run(other, recipes_news, str(out), column="text", verbose=0)
    assert snapshot(out) == before


# ----------------------------------------------------------------------------- the checkpoint writer alone
def test_checkpoint_write_failing_half_way_keeps_the_earlier_copy(tmp_path, monkeypatch):
    """recipes.state.save through zoo.files.atomic_path: a write that raises half-way
    (after the model file) leaves the earlier checkpoint of the same step bytewise
    intact and no temporary; so does a failing write of a new step. What a kill
    between atomic_path's two renames would leave is repaired on the next run."""
    layer = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((3,)), layer])
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    out, root = str(tmp_path), tmp_path / state.CHECKPOINTS
    state.save(out, 2, model, opt)
    before = snapshot(root)
    layer.kernel.assign(np.ones((3, 2)))
    real = state.save_file

    def failing(tensors, filename, *args, **kwargs):
        if filename.endswith("optimizer.safetensors"):
            assert os.path.isfile(os.path.join(os.path.dirname(filename), "model.safetensors"))  # half-way
            raise KeyboardInterrupt
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(state, "save_file", failing)
    for step in (2, 4):  # the same step again (a resumed run), then a new one
        with pytest.raises(KeyboardInterrupt):
            state.save(out, step, model, opt)
        assert snapshot(root) == before and os.listdir(root) == ["step-000000002"]
    monkeypatch.setattr(state, "save_file", real)
    state.save(out, 2, model, opt)
    assert snapshot(root) != before and os.listdir(root) == ["step-000000002"]
    saved = snapshot(root)

    # Killed between "move the earlier copy aside" and "move the new one in": both survive as temporaries.
    os.replace(root / "step-000000002", root / ".step-000000002.old-0badf00d")
    (root / ".step-000000002.tmp-0badf00d").mkdir()
    (root / ".step-000000002.tmp-0badf00d" / "model.safetensors").write_bytes(b"half")
    (root / ".step-000000004.tmp-12345678").mkdir()
    state.discard_partial(out)
    assert os.listdir(root) == ["step-000000002"] and snapshot(root) == saved
    assert state.restore(str(root / "step-000000002"), model, opt) == 2
