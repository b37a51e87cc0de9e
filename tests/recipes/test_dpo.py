"""Preference tuning runs (`zoo train --recipe dpo`): a LoRA run whose reference is its base (adapters off),
logging TRL's metrics and writing a PEFT adapter; a full run whose reference is scored once before training
and stored with the run, interrupted inside a checkpoint write (in-process; the real SIGKILL: test_resume.py)
and resumed bitwise from that store; a resumed run that lost its store refused with the fix. The checkpoint is
the SFT tests' tiny Llama with the chat fixtures' tokenizer and Qwen2.5-style template; the pairs are made here
(chosen: the right sum, rejected: a wrong one)."""

import json
import random

import numpy as np
import pytest

import recipes
import zoo
from recipes import dpo_data, reference
from tests.common import TINY_DEC
from tests.recipes.test_resume import final_state, run_interrupted_at_step_4
from tests.recipes.test_sft import checkpoint, write_jsonl  # noqa: F401 (a fixture)
from zoo.chat import ChatTemplate, ChatTokenizer

STEPS = 4


def sums(count=24, seed=0):
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}],
                     "chosen": [{"role": "assistant", "content": f"{a} plus {b} is {a + b}."}],
                     "rejected": [{"role": "assistant", "content": f"{a} plus {b} is {a + b + rng.randint(1, 9)}."}]})
    return rows


def make_recipe(weights, **changes):
    settings = dict(batch_size=2, sequence_length=72, steps=STEPS, log_every=2, checkpoint_every=2,
                    learning_rate=1e-3, precision="float32")
    return recipes.get("dpo", weights=str(weights)).replace(**{**settings, **changes})


@pytest.fixture(scope="module")
def starting(checkpoint):  # noqa: F811
    """The pairs of `sums()` and the checkpoint's own log-probabilities of them, scored once: what a full run
    stores as its reference, and what a named reference (the same checkpoint) must give."""
    tokenizer, template = ChatTokenizer.from_folder(checkpoint), ChatTemplate.of(checkpoint)
    length = make_recipe(checkpoint).sequence_length
    pairs, _ = dpo_data.pairs("explicit", sums(), template, tokenizer, length)
    start = zoo.hub.load(checkpoint, task="causal_lm", tokenizer=False)
    return pairs, zoo.preference.reference_logps(start, dpo_data.reference_batches(pairs, 5, length))


def test_a_lora_run_references_its_base_logs_trls_metrics_and_writes_an_adapter(checkpoint, tmp_path):  # noqa: F811
    data = write_jsonl(tmp_path / "pairs.jsonl", sums())
    recipe = make_recipe(checkpoint, lora_rank=4, lora_targets="all-linear", learning_rate=2e-2, steps=4)
    result = recipes.run(recipe, str(data), str(tmp_path / "run"), validation_every=4, verbose=0,
                         hf_out=str(tmp_path / "hf"))
    assert not (tmp_path / "run" / reference.REFERENCE_FILE).exists()  # the reference is the base: nothing stored
    last = result.history[-1]
    for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                 "logps/rejected"):
        assert name in last and f"val_{name}" in last
    assert last["rewards/margins"] > 0 and last["loss"] < np.log(2)  # it learns to prefer the right sums
    assert (tmp_path / "hf" / "adapter_config.json").is_file() and (tmp_path / "hf" / "tokenizer.json").is_file()


def test_a_full_run_stores_its_reference_and_resumes_bitwise_after_an_interruption(checkpoint, starting,  # noqa: F811
                                                                                    tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", sums())
    recipe = make_recipe(checkpoint)
    recipes.run(recipe, str(data), str(tmp_path / "straight"), verbose=0)

    # The stored scores are the starting model's log-probabilities of the pairs, in order.
    with np.load(tmp_path / "straight" / reference.REFERENCE_FILE) as stored:
        np.testing.assert_allclose(stored["train"], starting[1], rtol=1e-6)

    killed = tmp_path / "killed"
    run_interrupted_at_step_4(lambda: recipes.run(recipe, str(data), str(killed), verbose=0), killed)
    capsys.readouterr()
    resumed = recipes.run(recipe, str(data), str(killed), verbose=0)
    out = capsys.readouterr().out
    assert "from step 2" in out and "Scoring the pairs" not in out  # the store is read back, not scored again
    assert (resumed.start_step, resumed.step) == (2, STEPS)
    (step, got), (_, want) = final_state(killed), final_state(tmp_path / "straight")
    assert step == STEPS and sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    (killed / reference.REFERENCE_FILE).unlink()  # a reference that cannot be had any more
    with pytest.raises(ValueError, match="reference scores .* are missing .* pass --reference FOLDER"):
        recipes.run(recipe, str(data), str(killed), verbose=0)


def test_recipe_settings_are_refused_by_name(checkpoint):  # noqa: F811
    with pytest.raises(ValueError, match="beta must be a positive number"):
        make_recipe(checkpoint, beta=0.0)
    with pytest.raises(ValueError, match="SimPO has no reference"):
        recipes.get("simpo", weights=str(checkpoint)).replace(reference=str(checkpoint))
    with pytest.raises(ValueError, match="drop packing"):
        make_recipe(checkpoint, packing=True)
    assert json.loads(json.dumps(make_recipe(checkpoint).to_dict()))["preference"] == "dpo"


def test_a_named_reference_scores_the_pairs_once_and_must_share_the_vocabulary(checkpoint, starting,  # noqa: F811
                                                                              tmp_path):
    recipe = make_recipe(checkpoint, reference=str(checkpoint))
    assert recipe.preference_reference == "stored"
    pairs, expected = starting  # the named reference is the checkpoint: its scores are the starting ones
    policy = zoo.get("dec-base", task="causal_lm", **{**TINY_DEC, "vocab_size": 1000})  # other weights
    reference.score(recipe, policy, tmp_path / "scores.npz", "print", pairs, pairs[:2])
    with np.load(tmp_path / "scores.npz") as stored:
        np.testing.assert_allclose(stored["train"], expected, rtol=1e-6)
        assert stored["valid"].shape == (2, 2) and str(stored["fingerprint"]) == "print"
    other = zoo.get("dec-base", task="causal_lm", **{**TINY_DEC, "vocab_size": 1200})
    with pytest.raises(ValueError, match="must share the policy's tokenizer"):
        reference.score(recipe, other, tmp_path / "refused.npz", "print", pairs, [])
    assert not (tmp_path / "refused.npz").exists()


def test_show_mask_draws_both_answers_as_they_are_scored(checkpoint, tmp_path, capsys):  # noqa: F811
    """`zoo train --recipe dpo --show-mask ROW` draws each answer's scored tokens: its chat span by default, TRL's
    completion (the newline after <|im_end|> too) with --completion-mask trl."""
    from zoo.cli import main

    path = write_jsonl(tmp_path / "pairs.jsonl", sums(3))
    chosen, rejected = (sums(3)[1][side][0]["content"] for side in ("chosen", "rejected"))
    for flags, after in (((), "⟧\n"), (("--completion-mask", "trl"), "\n⟧")):
        code = main(["train", "--recipe", "dpo", "--weights", str(checkpoint), "--data", str(path), "--show-mask",
                     "2", *flags])
        out = capsys.readouterr().out
        assert code in (0, None) and out.startswith("-- row 2\n-- chosen: ")
        assert f"<|im_start|>assistant\n⟦{chosen}<|im_end|>{after}" in out
        assert f"<|im_start|>assistant\n⟦{rejected}<|im_end|>{after}" in out and "scored" in out
