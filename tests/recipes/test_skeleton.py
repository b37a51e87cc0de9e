"""The training skeleton (recipes.runner) runs a recipe kind that only supplies its data and its loss: a toy
kind defined here alone (recipes.kinds) trains, writes checkpoints, and resumes from the last one, its
batches asked for from where the run stopped."""

import keras
import numpy as np
import tensorflow as tf

import recipes
from recipes import kinds, state
from tests.common import TINY_RECIPE_DEC

TEXT = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "the mat and the log"] * 8


class Copying(kinds.Kind):
    """Data: rows of random tokens whose second half repeats the first; loss: only the second half counts (the
    copy), through per-token weights on compile's cross-entropy."""

    def __init__(self):
        self.skips = []

    def read(self, recipe, source, out_dir):
        rng = np.random.default_rng(recipe.seed)
        half = rng.integers(3, 200, size=(32, recipe.sequence_length // 2 + 1))
        rows = np.concatenate([half, half], axis=1)[:, :recipe.sequence_length + 1].astype(np.int32)
        return kinds.Examples(train=rows, corpus=tf.data.Dataset.from_tensor_slices(TEXT))

    def datasets(self, recipe, examples, tokenizer, skip, distributed):
        self.skips.append(skip)
        rows, length = examples.train, recipe.sequence_length
        weights = (np.arange(length) >= length // 2).astype(np.float32)[None].repeat(len(rows), 0)
        x = {"token_ids": rows[:, :-1], "padding_mask": np.ones_like(rows[:, :-1])}
        data = tf.data.Dataset.from_tensor_slices((x, rows[:, 1:], weights))
        return data.batch(recipe.batch_size, drop_remainder=True).repeat().skip(skip), None

    def loss(self, model, recipe):
        model.set_loss_chunk(0)  # whole-sequence logits, so that the weights above reach every position


COPYING = kinds.register("copying", Copying(), overwrite=True)


class CopyingRecipe(recipes.Recipe):
    @property
    def kind(self):
        return "copying"


def recipe(steps):
    base = recipes.get("dec-base", model_overrides=TINY_RECIPE_DEC, sequence_length=16, batch_size=4,
                       accumulation_steps=1, warmup_steps=0, log_every=2, checkpoint_every=2, precision="float32")
    return CopyingRecipe(**{**base.to_dict(), "steps": steps})


class StopAfterFirstInterval(keras.callbacks.Callback):
    """Stop `fit` after its first interval, as a killed run would (its checkpoint is written)."""

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


def test_a_kind_of_data_and_loss_alone_trains_checkpoints_and_resumes_on_the_skeleton(tmp_path):
    out = tmp_path / "run"
    COPYING.skips.clear()
    stopped = recipes.run(recipe(4), "unused", out, callbacks=[StopAfterFirstInterval()], verbose=0)
    assert stopped.step == 2 and np.isfinite(stopped.history[-1]["loss"])
    assert [step for step, _ in state.checkpoints(out)] == [2]

    resumed = recipes.run(recipe(4), "unused", out, verbose=0)
    assert (resumed.start_step, resumed.step) == (2, 4) and [row["step"] for row in resumed.history] == [4]
    assert int(resumed.model.optimizer.iterations) == 4  # the optimizer's state came back with the weights
    assert COPYING.skips == [0, 2]  # the kind's batches, from where each run started
    assert [step for step, _ in state.checkpoints(out)] == [2, 4] and (out / "model.keras").exists()


def test_a_flag_of_another_recipes_section_is_refused_by_name(capsys):
    """Issue 48: a DPO flag on a pre-training run names the flag, the recipes that read it and the fix."""
    from zoo.cli import main

    assert main(["train", "dec-base", "--data", "x.txt", "--beta", "0.2", "--show"]) == 2
    assert "--beta belongs to the dpo / simpo / grpo recipes" in capsys.readouterr().err
    assert main(["train", "dec-base", "--data", "x.txt", "--batch-size", "4", "--show"]) == 0  # everyone's
