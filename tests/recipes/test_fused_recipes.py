"""Recipes with the fused update: conflicting fields are refused with the fix, and a run
(causal LM, exact global clip, dropout; bfloat16 weights with stochastic rounding and the
factored Adafactor) interrupted inside a checkpoint write and started again ends bitwise equal
to an uninterrupted run: the fused step keeps no state of its own beyond the model's and the
optimizer's variables, and the rounding's bits are keyed by (step, variable). The interruption
is in-process (tests/recipes/test_resume.py: the real SIGKILL, on the runner this path shares)."""


import numpy as np
import pytest

import recipes
from tests.common import tiny_recipe
from tests.recipes.test_resume import final_state, run_interrupted_at_step_4

STEPS = 6


def make_recipe(vocabulary):
    # Adafactor's steps are relative to the weights' RMS: a rate of 3e-2 (tests/recipes/test_optimizers.py).
    recipe = tiny_recipe("dec-base", steps=STEPS, log_every=2, checkpoint_every=2, batch_size=4, learning_rate=3e-2,
                         vocabulary=vocabulary, checkpointing="full", fused=True, clipnorm=0.5,
                         precision="mixed_bfloat16", weights_dtype="bfloat16", optimizer="adafactor",
                         keep_checkpoints=3)
    # One block, as tests/recipes/test_resume.py's: a resume is per variable, and tracing costs less.
    return recipe.replace(model_overrides={**recipe.model_overrides, "dropout": 0.1, "num_layers": 1})


def test_conflicting_fields_name_the_fix():
    with pytest.raises(ValueError, match="needs checkpointing='full'.*--checkpointing full"):
        tiny_recipe("dec-base", fused=True, checkpointing="selective")
    with pytest.raises(ValueError, match=r"gradient accumulation \(accumulation_steps=4\).*Raise the batch size"):
        tiny_recipe("dec-base", fused=True, checkpointing="full", accumulation_steps=4)
    with pytest.raises(ValueError, match="Unknown fused_clip 'layer'; known: global, per-block"):
        tiny_recipe("dec-base", fused=True, checkpointing="full", fused_clip="layer")
    with pytest.raises(ValueError, match="Unknown checkpointing policy 'most'; known: none, full, selective, auto"):
        tiny_recipe("dec-base", checkpointing="most")


def test_fused_run_interrupted_and_resumed_equals_an_uninterrupted_one(tmp_path, recipes_news, recipes_vocab, capsys):
    recipe = make_recipe(recipes_vocab["llama"])
    reference = recipes.run(recipe, recipes_news, str(tmp_path / "reference"), column="text", verbose=0)
    assert reference.model.fused_update == "global"
    assert {v.dtype for v in reference.model.trainable_variables} == {"bfloat16"}
    assert reference.model.optimizer.rounding == "stochastic"
    losses = [row["loss"] for row in reference.history]
    assert len(losses) == 3 and losses[-1] < losses[0]

    killed = tmp_path / "killed"
    run_interrupted_at_step_4(lambda: recipes.run(recipe, recipes_news, str(killed), column="text", verbose=0),
                              killed)

    capsys.readouterr()
    resumed = recipes.run(recipe, recipes_news, str(killed), column="text", verbose=0)
    assert "Resuming dec-base from step 2" in capsys.readouterr().out
    assert (resumed.start_step, resumed.step) == (2, STEPS)
    (step, got), (ref_step, expected) = final_state(killed), final_state(tmp_path / "reference")
    assert step == ref_step == STEPS and sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_auto_picks_the_fastest_configuration_that_fits():
    from recipes.runner import choose_auto
    from zoo import memory

    # The full-size model: the planner is arithmetic, nothing is built. One sequence, so that the gradients,
    # not the backward's start (activations, logits), set the peak and fused is the smallest.
    recipe = recipes.get("dec-base", checkpointing="auto", batch_size=1, sequence_length=512, accumulation_steps=1)
    e = {c: memory.estimate(recipe.spec, 1, 512, recipe.precision, c, task="causal_lm").total for c in memory.CONFIGS}
    assert e["none"] > e["full"] > e["full+fused"]
    picked = {budget: choose_auto(recipe.replace(memory_budget=budget)) for budget in
              (e["none"], e["full"], e["full+fused"])}
    assert (picked[e["none"]].checkpointing, picked[e["none"]].fused) == ("none", False)
    assert (picked[e["full"]].checkpointing, picked[e["full"]].fused) in {("full", False), ("selective", False)}
    assert (picked[e["full+fused"]].checkpointing, picked[e["full+fused"]].fused) == ("full", True)
    with pytest.raises(ValueError, match="smallest estimate is .* GiB \\(full\\+fused\\)"):
        choose_auto(recipe.replace(memory_budget=e["full+fused"] - 1))
    with pytest.raises(ValueError, match="Cannot read 'lots' as a size: use e.g. 24GiB"):
        recipe.replace(memory_budget="lots")
