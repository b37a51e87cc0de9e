"""A run killed with SIGKILL mid-training and started again on the same out_dir
ends with exactly the weights of an uninterrupted run of the same length.

Exact (bitwise) because the causal-LM pipeline is deterministic (seeded shuffle,
ordered maps, skip to the resumed position), the model's dropout seeds are
checkpointed with its weights, and the optimizer state (moments, step counter)
is restored. The masked-LM pipeline is not: tf.text draws its masks from stateful
random ops, so a resumed MLM run sees other masks than an uninterrupted one.
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

from recipes import state
from tests.common import REPO, tiny_recipe

SCRIPT = """
import json, os, signal, sys
import keras, recipes
recipe = recipes.Recipe(**json.loads(sys.argv[1]))
kill_at = int(sys.argv[4])

class KillAt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if kill_at and int(self.model.optimizer.iterations) >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no atexit, mid-run

recipes.run(recipe, sys.argv[2], sys.argv[3], column="text", callbacks=[KillAt()], verbose=0)
"""


def _train(recipe, data, out_dir, kill_at=0):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, "-c", SCRIPT, json.dumps(recipe.to_dict()), data, out_dir, str(kill_at)]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path, recipes_news, recipes_vocab):
    recipe = tiny_recipe("dec-base", steps=12, log_every=4, checkpoint_every=4, precision="float32",
                  learning_rate=3e-3, vocabulary=recipes_vocab["llama"])
    # Dropout on, so that resuming must also restore the dropout seed state.
    recipe = recipe.replace(model_overrides={**recipe.model_overrides, "dropout": 0.1})
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")

    runs = [_train(recipe, recipes_news, straight), _train(recipe, recipes_news, killed, kill_at=9)]
    outputs = [p.communicate(timeout=600)[0] for p in runs]
    assert runs[0].returncode == 0, outputs[0]
    assert runs[1].returncode == -signal.SIGKILL, outputs[1]
    # Killed after step 9: the checkpoints of steps 4 and 8 are complete, nothing half-written.
    assert [step for step, _ in state.checkpoints(killed)] == [4, 8]
    assert not os.path.exists(os.path.join(killed, "model.keras"))
    assert not [n for n in os.listdir(os.path.join(killed, "checkpoints")) if ".tmp" in n]

    resumed = _train(recipe, recipes_news, killed)
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    assert "Resuming dec-base from step 8" in output

    final = {}
    for name, folder in (("straight", straight), ("killed", killed)):
        step, path = state.checkpoints(folder)[-1]
        assert step == 12
        final[name] = load_file(os.path.join(path, "model.safetensors"))
        final[name + "_opt"] = load_file(os.path.join(path, "optimizer.safetensors"))
    for key in final["straight"]:
        np.testing.assert_array_equal(final["killed"][key], final["straight"][key], err_msg=key)
    for key in final["straight_opt"]:
        np.testing.assert_array_equal(final["killed_opt"][key], final["straight_opt"][key], err_msg=key)
    assert len(final["straight"]) > 10
