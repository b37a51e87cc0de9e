"""GRPO's reward functions, as TRL's GRPOTrainer calls them: `f(prompts, completions, **columns) -> list[float |
None]`, one reward per completion, every dataset column but the prompt handed over by name (a list per column, one
entry per completion), named by import path (`--reward pkg.module:function`, several, with `--reward-weights`).

    functions = load(["recipes.rewards:numeric_answer", "recipes.rewards:think_answer_format"])
    per_function, rewards = score(functions, [1.0, 0.2], prompts, completions, {"answer": answers}, rows)

`score` gives [N, F] rewards (NaN where a function returned None: skipped in the weighted sum, as TRL does) and
their weighted sum (zoo.ops.grpo.weighted_rewards), and stops on what would train on garbage: a function that
raises (named, with the row it fails on and its error), a NaN or a non-number (named, with the row), or a list of
the wrong length.

Built in: `numeric_answer` (exact match of the last number after `####` or in `\\boxed{}` with the `answer`
column, GSM8K-style), `final_answer_format` (the completion ends on `#### N`) and `think_answer_format` (the
`<think>...</think><answer>...</answer>` layout; `format_reward(pattern)` makes one for another regular expression).
"""

from __future__ import annotations

import importlib
import math
import re
from decimal import Decimal, InvalidOperation

import numpy as np

from zoo.ops.grpo import weighted_rewards


class RewardError(ValueError):
    """A reward function failed, or returned what cannot be trained on; the message names the function and row."""


def load(paths) -> list:
    """The callables named by `pkg.module:function` paths (a path may also name a callable object).

    Raises:
        RewardError: a path that is not `module:name`, a module that does not import (with its error), a name the
            module lacks, or something that is not callable.
    """
    functions = []
    for path in [paths] if isinstance(paths, str) else list(paths):
        module_name, sep, attribute = str(path).partition(":")
        if not sep or not module_name or not attribute:
            raise RewardError(f"A reward is named by its import path, 'pkg.module:function'; got {path!r}.")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # noqa: BLE001 - any import failure is the user's to see, with the path
            raise RewardError(f"Reward {path!r}: module {module_name!r} does not import: "
                              f"{type(error).__name__}: {error}") from error
        function = module
        for part in attribute.split("."):
            if not hasattr(function, part):
                raise RewardError(f"Reward {path!r}: {module_name!r} has no {attribute!r}.")
            function = getattr(function, part)
        if not callable(function):
            raise RewardError(f"Reward {path!r} is a {type(function).__name__}, not a function "
                              "f(prompts, completions, **columns) -> list[float | None].")
        functions.append(function)
    return functions


def name_of(function) -> str:
    """The name a reward's metrics go under (TRL's `rewards/<name>/mean`)."""
    return getattr(function, "__name__", None) or type(function).__name__


def _call(function, prompts, completions, columns):
    return function(prompts=prompts, completions=completions, **columns)


def _failing_row(function, prompts, completions, columns):
    """The first row on which `function`, called on that row alone, raises: (index, error), or None."""
    for i in range(len(completions)):
        try:
            _call(function, prompts[i:i + 1], completions[i:i + 1], {k: v[i:i + 1] for k, v in columns.items()})
        except Exception as error:  # noqa: BLE001
            return i, error
    return None


def score(functions, weights, prompts, completions, columns=None, rows=None):
    """Every reward of every completion, and their weighted sum.

    Args:
        functions: reward callables (`load`).
        weights: one per function, or None (all 1.0).
        prompts, completions: one entry per completion (a prompt repeated for each of its G completions), text or
            messages, as TRL hands them.
        columns: {column: list, one entry per completion}: the dataset's other columns.
        rows: the dataset row of each completion, for the messages (None: its index here).

    Returns:
        `(per_function [N, F] float32, NaN for None; rewards [N] float32, NaN where every function gave None)`.

    Raises:
        RewardError: naming the function, the row and the problem.
    """
    columns = dict(columns or {})
    count = len(completions)
    if len(prompts) != count or any(len(v) != count for v in columns.values()):
        raise RewardError(f"{len(prompts)} prompts, {count} completions and columns of "
                          f"{sorted({len(v) for v in columns.values()})} entries: give one of each per completion.")
    rows = list(range(count)) if rows is None else list(rows)
    if weights is not None and len(weights) != len(functions):
        raise RewardError(f"{len(weights)} reward weights for {len(functions)} reward functions: give one each.")
    per_function = np.full((count, len(functions)), np.nan, np.float32)
    for j, function in enumerate(functions):
        name = name_of(function)
        try:
            values = _call(function, prompts, completions, columns)
        except Exception as error:  # noqa: BLE001 - named with its row, the original error chained
            failing = _failing_row(function, prompts, completions, columns)
            where = (f"on row {rows[failing[0]]}" if failing else f"on the batch of rows {rows[0]}..{rows[-1]}")
            cause = failing[1] if failing else error
            raise RewardError(f"Reward function {name!r} raised {where}: {type(cause).__name__}: {cause}") from cause
        values = list(values) if values is not None else None
        if values is None or len(values) != count:
            got = "None" if values is None else f"{len(values)} rewards"
            raise RewardError(f"Reward function {name!r} returned {got} for {count} completions (rows {rows[0]}.."
                              f"{rows[-1]}): return one reward (a number or None) per completion.")
        for i, value in enumerate(values):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise RewardError(f"Reward function {name!r} returned {value!r} for row {rows[i]}: a reward is a "
                                  "number, or None to skip it.")
            if math.isnan(value):
                raise RewardError(f"Reward function {name!r} returned NaN for row {rows[i]}: return None to skip a "
                                  "completion it cannot score.")
            per_function[i, j] = value
    return per_function, weighted_rewards(per_function, weights)


# --- built-in rewards ------------------------------------------------------------------------------------------
_NUMBER = r"-?[\d,]*\.?\d+"
_HASHES = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")
_BOXED = re.compile(r"\\boxed\{\s*\$?\s*(" + _NUMBER + r")\s*\}")
THINK_ANSWER = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"


def text_of(completion) -> str:
    """A completion's text: the string, or (conversational) its last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def final_number(text) -> Decimal | None:
    """The answer a text ends on: the last `#### N` or `\\boxed{N}` (commas and a `$` allowed), else None."""
    found = [(m.start(), m.group(1)) for pattern in (_HASHES, _BOXED) for m in pattern.finditer(str(text))]
    if not found:
        return None
    try:
        return Decimal(max(found)[1].replace(",", ""))
    except InvalidOperation:
        return None


def _gold(answer) -> Decimal | None:
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return Decimal(str(answer))
    number = final_number(answer)
    if number is not None:
        return number
    try:
        return Decimal(str(answer).strip().replace(",", ""))
    except InvalidOperation:
        return None


def numeric_answer(prompts, completions, answer, **columns) -> list[float | None]:
    """1.0 where the completion's final `#### N` or `\\boxed{N}` equals the `answer` column's number (a number, or
    a GSM8K answer text ending in `#### N`), else 0.0; None where the answer column holds no number."""
    rewards = []
    for completion, gold in zip(completions, answer):
        expected = _gold(gold)
        if expected is None:
            rewards.append(None)
            continue
        got = final_number(text_of(completion))
        rewards.append(1.0 if got is not None and got == expected else 0.0)
    return rewards


def format_reward(pattern, name="format", flags=re.DOTALL):
    """A reward named `name` (its metrics' name) of 1.0 where the completion matches `pattern` (a regular
    expression, matched from the start; end it with `$` to match the whole), else 0.0."""
    compiled = re.compile(pattern, flags)

    def matches_format(prompts, completions, **columns) -> list[float]:
        return [1.0 if compiled.match(text_of(c)) else 0.0 for c in completions]

    matches_format.__name__ = name
    return matches_format


think_answer_format = format_reward(THINK_ANSWER, "think_answer_format")
final_answer_format = format_reward(r"^.*####\s*-?[\d,]+\.?\d*\s*$", "final_answer_format")
final_answer_format.__doc__ = """1.0 where the completion ends on a GSM8K-style `#### N` line (what `numeric_answer`
reads), else 0.0: the format half of an answer reward, which can teach the layout before the answers are right."""
think_answer_format.__doc__ = """1.0 where the completion is `<think>...</think>` then `<answer>...</answer>` (TRL's
and DeepSeek-R1's format reward), else 0.0."""
