"""The GRPO recipe (`zoo train --recipe grpo`): a LoRA run on the SFT tests' tiny Llama with the chat fixtures'
tokenizer and Qwen2.5-style template samples completions of conversational prompts, rewards them with a built-in
and a test reward named by import path, logs TRL's metrics, stops naming the function, row and error when the test
reward raises, with its last checkpoint intact, and resumes from it; G < 2 and a reward path that does not import
are refused before anything is written."""

import random

import pytest

import recipes
from recipes import state
from recipes.rewards import RewardError
from tests.recipes.test_sft import checkpoint, write_jsonl  # noqa: F401 (a fixture)

CALLS = {"batches": 0, "fail_at": None, "bad_answer": None}


def shorter(prompts, completions, answer, **columns):
    """A reward that varies within a group of a random model's completions: fewer characters, more reward. From
    its `fail_at`-th batch on, it raises on one row's completions (a reward function with a bug)."""
    if len(completions) > 1:
        CALLS["batches"] += 1
        if CALLS["batches"] == CALLS["fail_at"]:
            CALLS["bad_answer"] = answer[-1]
    if CALLS["fail_at"] and CALLS["bad_answer"] in answer:
        raise KeyError("no such column")
    return [-len(c[-1]["content"]) / 100 for c in completions]


def sums(count=8, seed=0):
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 49), rng.randint(10, 49)  # two digits each: prompts of one length, traced once
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}], "answer": a + b})
    return rows


def make_recipe(weights, **changes):
    settings = dict(batch_size=2, sequence_length=96, steps=4, log_every=1, checkpoint_every=2, learning_rate=1e-3,
                    precision="float32", lora_rank=4, lora_targets="all-linear", num_generations=2,
                    max_completion_length=6, num_iterations=2, beta=0.04,
                    rewards="recipes.rewards:numeric_answer,tests.recipes.test_grpo:shorter", reward_weights="1,0.5")
    return recipes.get("grpo", weights=str(weights)).replace(**{**settings, **changes})


def test_a_lora_run_samples_rewards_logs_trls_metrics_and_resumes(checkpoint, tmp_path):  # noqa: F811
    """The reward raises when the second batch is sampled (step 2, mu 2): the run stops naming the function, the
    dataset row and the error, with the step-2 checkpoint intact; the run started again resumes from it."""
    data = write_jsonl(tmp_path / "prompts.jsonl", sums())
    recipe = make_recipe(checkpoint)
    out = tmp_path / "run"
    CALLS.update(batches=0, fail_at=2, bad_answer=None)
    try:
        with pytest.raises(RewardError, match=r"'shorter' raised on row \d+: KeyError: 'no such column'"):
            recipes.run(recipe, str(data), str(out), verbose=0)
    finally:
        CALLS["fail_at"] = None
    assert [step for step, _ in state.checkpoints(str(out))] == [2]
    resumed = recipes.run(recipe, str(data), str(out), verbose=0)
    assert (resumed.start_step, resumed.step) == (2, 4)
    last = resumed.history[-1]
    for name in ("loss", "reward", "reward_std", "rewards/numeric_answer/mean", "rewards/shorter/mean",
                 "completions/mean_length", "completions/clipped_ratio", "kl", "entropy", "clip_ratio/region_mean",
                 "tokens_per_second/generation", "tokens_per_second/training"):
        assert name in last, name
    assert last["completions/max_length"] <= 6 and last["rewards/shorter/mean"] < 0
    assert (out / "adapter").is_dir()  # a LoRA run keeps its adapters


def test_bad_settings_are_refused_before_the_run(checkpoint, tmp_path):  # noqa: F811
    data = write_jsonl(tmp_path / "prompts.jsonl", sums())
    with pytest.raises(ValueError, match="num_generations must be an integer >= 2"):
        make_recipe(checkpoint, num_generations=1)
    with pytest.raises(ValueError, match="module 'no_such_rewards' does not import"):
        recipe = make_recipe(checkpoint, rewards="no_such_rewards:f", reward_weights=None)
        recipes.run(recipe, str(data), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="1 reward weights for 2 reward functions"):
        make_recipe(checkpoint, reward_weights="1")
    with pytest.raises(ValueError, match="train LoRA \\(--lora-rank\\), or set beta 0"):
        make_recipe(checkpoint, lora_rank=None, lora_targets=None)


def test_long_prompts_are_dropped_and_counted_or_cut_from_the_left(checkpoint, tmp_path):  # noqa: F811
    from recipes.grpo import GrpoTuning
    from recipes.kinds import Source

    rows = sums(4) + [{"prompt": "word " * 200, "answer": 1}]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    kind, source = GrpoTuning(), Source(str(data))
    dropped = kind.read(make_recipe(checkpoint), source, str(tmp_path / "a"))
    assert dropped.data == {"prompts": 4, "too_long": 1, "truncated": 0}
    cut = kind.read(make_recipe(checkpoint, truncate_prompts=True), source, str(tmp_path / "b"))
    assert cut.data == {"prompts": 5, "too_long": 0, "truncated": 1}
    long_ids = cut.train["prompts"][-1]
    assert len(long_ids) == 96 - 6  # sequence_length - max_completion_length: the prompt's last tokens
