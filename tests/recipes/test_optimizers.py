"""A recipe chooses its optimizer: `adamw`, `adafactor` (factored, zoo.optimizers), `keras-adafactor`
or `lion` (recipes/optim.py).
Each trains a shrunken recipe on real text, keeps the state `zoo.memory.optimizer_state`
says, and leaves norms and biases out of weight decay; an unknown name is refused
with the known ones."""

import argparse
import json
import math

import keras
import numpy as np
import pytest

import recipes
import zoo
from recipes import cli, optim
from tests.common import TINY_DEC, tiny_recipe
from zoo.memory.optimizer_state import RECIPE_OPTIMIZERS, state_bytes

KERAS_CLASS = {"adamw": keras.optimizers.AdamW, "adafactor": zoo.optimizers.Adafactor,
               "keras-adafactor": keras.optimizers.Adafactor, "lion": keras.optimizers.Lion}
# A 2-layer model in 30 steps: AdamW's test rate; Lion's sign steps want a smaller one (Chen et al.
# 2023: 3-10x); Adafactor's steps are relative to the weights' RMS (the paper's 1e-2 is for long runs).
LEARNING_RATE = {"adamw": 3e-3, "adafactor": 3e-2, "lion": 1e-3}


def test_the_four_optimizers_are_known_everywhere():
    assert RECIPE_OPTIMIZERS == ("adamw", "adafactor", "keras-adafactor", "lion") == optim.RECIPE_OPTIMIZERS
    assert recipes.get("dec-base").optimizer == "adamw"


def test_an_unknown_optimizer_is_refused_with_the_known_names():
    known = "known optimizers: adamw, adafactor, keras-adafactor, lion"
    with pytest.raises(ValueError, match=f"Unknown optimizer 'adam'; {known}"):
        recipes.get("dec-base", optimizer="adam")
    assert state_bytes("sgd", [(2, 3)]) == 0  # the one table also knows what plain Keras models plan with
    with pytest.raises(ValueError, match=f"Unknown optimizer 'adagrad'; {known}, adam"):
        state_bytes("adagrad", [(2, 3)])
    parser = argparse.ArgumentParser(prog="zoo")
    cli.register(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "dec-base", "--data", "x.txt", "--optimizer", "adam"])


def test_the_optimizer_flag_reaches_the_recipe(capsys):
    parser = argparse.ArgumentParser(prog="zoo")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", "dec-base", "--data", "x.txt", "--optimizer", "lion", "--show"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["optimizer"] == "lion"


def test_the_weights_dtype_flags_reach_the_model_and_the_optimizer(capsys):
    """`zoo train --weights-dtype bfloat16 [--rounding nearest]` -> recipe fields -> the model's policy
    ("bfloat16") and each rounding optimizer's `rounding`; stochastic unless nearest is asked for by name.
    (dec-base's recipe accumulates 64 micro-batches; bfloat16 weights refuse that, naming --accumulation-steps 1.)"""
    parser = argparse.ArgumentParser(prog="zoo")
    cli.register(parser.add_subparsers(dest="command", required=True))
    model = zoo.get("dec-base", task="causal_lm", dtype="bfloat16", **TINY_DEC)
    for flags, rounding in [([], "stochastic"), (["--rounding", "nearest"], "nearest")]:
        args = parser.parse_args(["train", "dec-base", "--data", "x.txt", "--show", "--accumulation-steps", "1",
                                  "--weights-dtype", "bfloat16", *flags])
        assert args.func(args) == 0
        recipe = recipes.Recipe(**json.loads(capsys.readouterr().out))
        assert (recipe.weights_dtype, recipe.weights_rounding, recipe.dtype_policy) == ("bfloat16", rounding,
                                                                                        "bfloat16")
        for name in ("adamw", "adafactor", "lion"):
            opt = optim.optimizer(recipe.replace(optimizer=name), model)
            assert isinstance(opt, optim.SumReplicaGradients) and opt.rounding == rounding
            opt.build(model.trainable_variables)  # refuses bfloat16 variables without rounding
    assert recipes.get("dec-base").weights_rounding is None and recipes.get("dec-base").dtype_policy == "mixed_bfloat16"


def test_bad_weights_dtype_fields_name_the_fix():
    with pytest.raises(ValueError, match="cannot be combined with precision 'mixed_float16'.*'mixed_bfloat16'"):
        recipes.get("dec-base", weights_dtype="bfloat16", precision="mixed_float16")
    with pytest.raises(ValueError, match="Unknown weights dtype 'float16'; known: float32, bfloat16"):
        recipes.get("dec-base", weights_dtype="float16")
    with pytest.raises(ValueError, match="Unknown rounding 'up'; known: 'stochastic'"):
        recipes.get("dec-base", weights_dtype="bfloat16", rounding="up", accumulation_steps=1)
    with pytest.raises(ValueError, match="float32 weights have nothing to round.*--weights-dtype bfloat16"):
        recipes.get("dec-base", rounding="nearest")
    with pytest.raises(ValueError, match="'keras-adafactor' cannot train bfloat16 weights.*adamw, adafactor, lion"):
        recipes.get("dec-base", weights_dtype="bfloat16", optimizer="keras-adafactor", accumulation_steps=1)
    with pytest.raises(ValueError, match=r"gradient accumulation \(accumulation_steps=2\)"):
        recipes.get("dec-base", weights_dtype="bfloat16", accumulation_steps=2)
    parser = argparse.ArgumentParser(prog="zoo")
    cli.register(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "dec-base", "--data", "x.txt", "--weights-dtype", "int8"])


@pytest.fixture(scope="module")
def tiny_model():
    """One tiny decoder for the tests below, which only read it (an optimizer built on its variables adds
    variables of its own, not the model's)."""
    return zoo.get("dec-base", task="causal_lm", dtype="mixed_bfloat16", **TINY_DEC)


@pytest.mark.parametrize("name", RECIPE_OPTIMIZERS)
def test_state_bytes_is_the_sum_of_the_optimizer_variables(name, tiny_model):
    """Built on a tiny decoder (rank-1 norms and biases, rank-2 kernels and embeddings),
    with and without gradient accumulation: the rule's bytes are the variables' bytes."""
    model = tiny_model
    variables = model.trainable_variables
    shapes = [tuple(v.shape) for v in variables]
    params = sum(math.prod(s) for s in shapes)
    for k in (1, 3):
        opt = optim.optimizer(recipes.get("dec-base", optimizer=name, accumulation_steps=k), model)
        assert isinstance(opt, optim.SumReplicaGradients) and isinstance(opt, KERAS_CLASS[name])
        opt.build(variables)
        state = [v for v in opt.variables if not v.path.endswith(("/iteration", "/learning_rate"))]
        real = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in state)
        assert state_bytes(name, shapes, accumulation_steps=k) == real
        per_param = real / params - (4 if k > 1 else 0)
        if name == "adamw":
            assert per_param == 8
        elif name == "lion":
            assert per_param == 4
        elif name == "adafactor":  # row and column statistics only (hidden 64: a large share of a tiny model)
            assert 0 < per_param < 0.25
        else:  # a full-size velocity plus the factors (Keras keeps both)
            assert 4 < per_param < 4.2


@pytest.mark.parametrize("name", RECIPE_OPTIMIZERS)
def test_weight_decay_skips_norms_and_biases(name, tiny_model):
    model = tiny_model
    opt = optim.optimizer(recipes.get("dec-base", optimizer=name), model)
    assert opt.weight_decay == pytest.approx(0.1) and opt.global_clipnorm == 1.0
    decayed = {v.path for v in model.trainable_variables if opt._use_weight_decay(v)}
    assert decayed and all(len(v.shape) == 2 for v in model.trainable_variables if v.path in decayed)
    assert not any(("norm" in p) or p.endswith("bias") for p in decayed)
    assert len(decayed) == sum(len(v.shape) >= 2 for v in model.trainable_variables)


@pytest.mark.parametrize("name", ["adafactor", "keras-adafactor"])
def test_adafactor_follows_the_recipe_schedule(name, tiny_model):
    """The learning rate is the recipe's schedule (warmup from 0), capped at 1/sqrt(t): Keras' Adafactor
    always caps it (whatever its relative_step), the factored one with relative_step (the recipes')."""
    recipe = recipes.get("dec-base", optimizer=name, warmup_steps=10, steps=100, learning_rate=1e-2)
    opt = optim.optimizer(recipe, tiny_model)
    assert opt.relative_step is (name == "adafactor") and isinstance(opt._learning_rate, optim.WarmupDecay)
    assert float(opt.learning_rate) == 0.0  # warmup starts from 0, unlike Keras' relative step


# keras-adafactor takes the factored one's steps (tests/zoo/test_adafactor.py): no run of its own.
@pytest.mark.parametrize("name", ["adamw", "adafactor", "lion"])
def test_each_optimizer_trains_on_real_text(name, tmp_path, recipes_news, recipes_vocab):
    """30 updates of the shrunken dec-base recipe (its betas, weight decay, clipping and
    mixed_bfloat16 kept) on the news corpus: the last 10 steps' loss is clearly below the first 10's."""
    recipe = tiny_recipe("dec-base", steps=30, optimizer=name, learning_rate=LEARNING_RATE[name],
                         vocabulary=recipes_vocab["llama"], checkpoint_every=30)
    result = recipes.run(recipe, recipes_news, str(tmp_path), column="text", verbose=0)
    losses = [row["loss"] for row in result.history]
    assert [row["step"] for row in result.history] == [10, 20, 30]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.2, losses
    assert type(result.model.optimizer).__name__ == {"adamw": "AdamW", "adafactor": "Adafactor", "lion": "Lion"}[name]
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["recipe"]["optimizer"] == name


def test_a_run_from_before_the_optimizer_field_resumes_as_adamw(tmp_path):
    """run.json written before `Recipe.optimizer` existed: its run was AdamW, so today's
    AdamW recipe resumes it and a Lion recipe is refused as a different recipe."""
    from recipes import state

    recipe = recipes.get("dec-base")
    meta = {"model": "dec-base", "task": recipe.task, "spec": recipe.spec.to_dict(), "recipe": recipe.to_dict()}
    old = {**meta, "recipe": {k: v for k, v in meta["recipe"].items() if k != "optimizer"}}
    (tmp_path / state.RUN_FILE).write_text(json.dumps(old))
    (tmp_path / state.CHECKPOINTS / "step-000000002").mkdir(parents=True)  # a run to resume, not a fresh start
    assert state.read_run(str(tmp_path))["recipe"]["optimizer"] == "adamw"
    state.check_compatible(str(tmp_path), meta)
    lion = {**meta, "recipe": recipe.replace(optimizer="lion").to_dict()}
    with pytest.raises(ValueError, match=r"fields \['optimizer'\] differ"):
        state.check_compatible(str(tmp_path), lion)


def test_a_run_of_keras_adafactor_names_keras_adafactor(tmp_path):
    """A run.json from before the factored Adafactor (no weights_dtype) trained "adafactor" with Keras':
    it reads as keras-adafactor, resumes with it, and a factored recipe is refused naming the fix; a
    checkpoint with Keras' velocity slots is refused by the factored optimizer."""
    from recipes import state

    recipe = recipes.get("dec-base", optimizer="keras-adafactor")
    meta = {"model": "dec-base", "task": recipe.task, "spec": recipe.spec.to_dict(), "recipe": recipe.to_dict()}
    old = {k: v for k, v in meta["recipe"].items() if k not in ("weights_dtype", "rounding")}
    (tmp_path / state.RUN_FILE).write_text(json.dumps({**meta, "recipe": {**old, "optimizer": "adafactor"}}))
    (tmp_path / state.CHECKPOINTS / "step-000000002").mkdir(parents=True)  # a run to resume, not a fresh start
    assert state.read_run(str(tmp_path))["recipe"]["optimizer"] == "keras-adafactor"
    state.check_compatible(str(tmp_path), meta)
    factored = {**meta, "recipe": recipe.replace(optimizer="adafactor").to_dict()}
    with pytest.raises(ValueError, match="trained with Keras' Adafactor.*optimizer='keras-adafactor'"):
        state.check_compatible(str(tmp_path), factored)

    folder = tmp_path / "step-000000002"
    folder.mkdir()
    names = {"model_variables": [], "optimizer_variables": ["adafactor/iteration", "adafactor/kernel_velocity"]}
    (folder / "state.json").write_text(json.dumps(names))
    opt = optim.optimizer(recipes.get("dec-base", optimizer="adafactor"), keras.Sequential([keras.Input((1,))]))
    with pytest.raises(ValueError, match="written by Keras' Adafactor.*--optimizer keras-adafactor"):
        state.restore(str(folder), keras.Sequential([keras.Input((1,))]), opt)
