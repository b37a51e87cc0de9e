"""recipes.rewards: GRPO's reward functions called as TRL calls them, named by import path, weighted with None
skipped; what cannot be trained on stops with the function, the row and the error; the built-in rewards."""

import sys

import numpy as np
import pytest

from recipes import rewards
from recipes.rewards import RewardError, load, numeric_answer, score, think_answer_format


def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def hint(prompts, completions, hint, **columns):
    """None where a row has no hint: skipped in the weighted sum."""
    return [None if h is None else float(h in c) for c, h in zip(completions, hint)]


def test_rewards_load_by_path_and_sum_with_weights_skipping_none():
    functions = load(["recipes.rewards:numeric_answer", "tests.recipes.test_rewards:hint"])
    assert functions == [numeric_answer, hint]
    prompts = ["2+2?", "2+2?", "3*3?", "3*3?"]
    completions = ["so #### 4", "it is \\boxed{5}", "nine: \\boxed{9}", "#### 9, so 9"]
    columns = {"answer": ["work... #### 4", "#### 4", 9, "9"], "hint": ["so", None, None, "so"]}
    per_function, total = score(functions, [1.0, 0.5], prompts, completions, columns)
    np.testing.assert_array_equal(per_function, [[1, 1], [0, np.nan], [1, np.nan], [1, 1]])
    np.testing.assert_array_equal(total, [1.5, 0.0, 1.0, 1.5])
    _, total = score([hint], None, prompts, completions, columns)
    assert np.isnan(total[1]) and total[0] == 1.0  # every function None: unscorable (advantage 0 later)


def test_builtin_rewards():
    completions = ["#### 1,234", "\\boxed{ -3.50 }", "The answer is 7", "#### 5 then \\boxed{6}", [
        {"role": "assistant", "content": "<think>x</think> <answer>#### 8</answer>"}]]
    assert numeric_answer(None, completions, [1234, "-3.5", 7, "#### 6", "8"]) == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert numeric_answer(None, ["#### 1"], ["no number here"]) == [None]
    assert think_answer_format(None, completions) == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert rewards.final_answer_format(None, completions + ["So 3 + 4 = 7.\n#### 7\n", "#### 7\nThe answer is 7."]) == [
        1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    yes_no = rewards.format_reward(r"^(yes|no)\.$", "yes_no")
    assert rewards.name_of(yes_no) == "yes_no" and yes_no(None, ["yes.", "maybe."]) == [1.0, 0.0]


def test_a_reward_that_raises_names_itself_the_row_and_the_error():
    def picky(prompts, completions, **columns):
        return [1.0 / (len(c) - 3) for c in completions]

    raised = r"'picky' raised on row 12: ZeroDivisionError: float division by zero"
    with pytest.raises(RewardError, match=raised) as info:
        score([picky], None, ["p"] * 3, ["ab", "abc", "abcd"], rows=[11, 12, 13])
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_nan_wrong_types_and_lengths_are_refused_with_the_row():
    with pytest.raises(RewardError, match="'nan_reward' returned NaN for row 1: return None to skip"):
        def nan_reward(prompts, completions, **columns):
            return [1.0, float("nan")]
        score([nan_reward], None, ["p", "p"], ["a", "b"])
    with pytest.raises(RewardError, match="'text_reward' returned 'good' for row 0: a reward is a number"):
        def text_reward(prompts, completions, **columns):
            return ["good", 1.0]
        score([text_reward], None, ["p", "p"], ["a", "b"])
    with pytest.raises(RewardError, match="'two_rewards' returned 2 rewards for 3 completions"):
        def two_rewards(prompts, completions, **columns):
            return [1.0, 2.0]
        score([two_rewards], None, ["p"] * 3, ["a", "b", "c"])
    with pytest.raises(RewardError, match="2 reward weights for 1 reward functions"):
        score([length], [1.0, 2.0], ["p"], ["a"])


def test_reward_paths_that_do_not_load_are_named(tmp_path, monkeypatch):
    (tmp_path / "broken_rewards.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardError, match=r"'broken_rewards:f': module 'broken_rewards' does not import: "
                                          r"ModuleNotFoundError: No module named 'not_a_module_anywhere'"):
        load("broken_rewards:f")
    sys.modules.pop("broken_rewards", None)
    with pytest.raises(RewardError, match="'recipes.rewards:nothing': 'recipes.rewards' has no 'nothing'"):
        load("recipes.rewards:nothing")
    with pytest.raises(RewardError, match="import path, 'pkg.module:function'; got 'recipes.rewards.numeric'"):
        load("recipes.rewards.numeric")
    with pytest.raises(RewardError, match="'recipes.rewards:THINK_ANSWER' is a str, not a function"):
        load(["recipes.rewards:THINK_ANSWER"])
