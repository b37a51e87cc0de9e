"""Conversation rows: what supervised fine-tuning (recipes.sft_data) and preference tuning (recipes.dpo_data)
both stand on. The run's chat tokenizer and template (the checkpoint's, or those saved with a resumed run), JSONL
rows read and refused by number, TRL's `tools` / `chat_template_kwargs` columns, the `Report` of what reading kept
and dropped, and the token-row layout: an example of n tokens trains n - 1 positions (inputs ids[:-1], targets
ids[1:], weights mask[1:]), padded one example a row or packed several to a row by best-fit decreasing over
shuffled windows of `PACK_WINDOW` examples, in an order that is a function of the seed and the epoch.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, field

import numpy as np

from recipes import pretrained, state
from zoo import reading
from zoo.chat import ChatTemplate, ChatTokenizer
from zoo.loading import TOKENIZER_DIR

PACK_WINDOW = 1024  # examples packed together (best-fit decreasing inside a shuffled window)


def chat_template(recipe, out_dir) -> ChatTemplate | None:
    """The template a run renders with: the one saved with its tokenizer (a resumed run), the
    recipe's `chat_template` file, or the checkpoint's own; None for a checkpoint without one
    (then only plain rows can train)."""
    saved = os.path.join(out_dir, TOKENIZER_DIR)
    if os.path.isdir(saved) and state.resumes(out_dir):
        return ChatTemplate.of(saved)
    folder = pretrained.checkpoint(recipe.weights).folder
    if recipe.chat_template:
        return ChatTemplate.find(folder, override=recipe.chat_template)
    return ChatTemplate.of(folder)


def tokenizer_and_template(recipe, out_dir) -> tuple[ChatTokenizer, ChatTemplate | None]:
    """The run's tokenizer (as transformers tokenizes: tokenizer.json) and chat template: those saved
    with a resumed run, else the checkpoint's."""
    saved = os.path.join(out_dir, TOKENIZER_DIR)
    source = saved if os.path.isdir(saved) and state.resumes(out_dir) else pretrained.checkpoint(recipe.weights).folder
    return ChatTokenizer.from_folder(source), chat_template(recipe, out_dir)


def shown_row(recipe, data_path, row, read_rows, out_dir=""):
    """(tokenizer, template, the data's format, its rows) for `--show-mask ROW`, the row number checked."""
    tokenizer, template = tokenizer_and_template(recipe, out_dir)
    kind, rows = read_rows(data_path)
    if not 1 <= row <= len(rows):
        raise ValueError(f"--show-mask {row}: {data_path} has rows 1 to {len(rows)}.")
    return tokenizer, template, kind, rows


def save_chat(tokenizer, template, folder):
    """The tokenizer and its template into `folder`: what a resumed run and a serving client read back."""
    tokenizer.save(folder)
    if template is not None:
        template.save(folder)


@dataclass
class Report:
    """What reading the examples kept and dropped, for the log."""

    rows: int = 0
    kept: int = 0
    too_long: int = 0
    longest: int = 0
    no_trained_token: int = 0
    untrained_first_token: int = 0  # kept ones whose answer starts the row: its first token has no prediction
    trained_tokens: int = 0
    tokens: int = 0
    dropped_rows: list = field(default_factory=list)  # the first few dropped rows' numbers, for the message
    unit: str = "example"  # what a row is read as ("pair": preference data)

    def lines(self, sequence_length) -> list[str]:
        out = [f"{self.kept} of {self.rows} {self.unit}s kept: {self.tokens:,} tokens, {self.trained_tokens:,} trained "
               "on."]
        if self.too_long:
            out.append(f"Dropped {self.too_long} {self.unit}(s) longer than {sequence_length} positions (the longest "
                       f"has {self.longest}); raise --sequence-length to keep them.")
        if self.no_trained_token:
            out.append(f"Dropped {self.no_trained_token} example(s) with no token to train on (no assistant "
                       "message, or empty answers).")
        if self.untrained_first_token:
            out.append(f"Dropped the first answer token of {self.untrained_first_token} {self.unit}(s): the answer "
                       "starts the sequence (an empty prompt, and no BOS token before it), so nothing predicts it; "
                       "give the prompt some text to train it.")
        if self.dropped_rows:
            out.append(f"Dropped rows (1-based): {', '.join(map(str, self.dropped_rows))}"
                       + (" ..." if len(self.dropped_rows) < self.too_long + self.no_trained_token else ""))
        return out


def read_rows(path, formats, described) -> tuple[str, list[dict]]:
    """(format, rows) of a JSONL file; a row of another format, or none, is refused by number.
    `formats` maps each format to the keys that make it (the first that fits a row is its format);
    `described` names them in messages."""
    path = os.fspath(path)
    if not path.endswith(".jsonl") or not os.path.isfile(path):
        raise FileNotFoundError(f"Fine-tuning data {path!r} is not a .jsonl file; pass JSONL rows in {described}.")
    rows = [row for _, row in reading.jsonl_records(path)]
    if not rows:
        raise ValueError(f"{path} holds no rows.")
    kind = format_of(rows[0], path, 1, formats, described)
    for number, row in enumerate(rows, 1):
        if (found := format_of(row, path, number, formats, described)) != kind:
            raise ValueError(f"{path}, row {number}: a {found!r} row in a {kind!r} file; "
                             "every row must have the first row's format.")
    return kind, rows


def format_of(row, path, number, formats, described) -> str:
    if isinstance(row, dict):
        for kind, keys in formats.items():
            if all(k in row for k in keys):
                return kind
    wanted = "; ".join(" + ".join(repr(k) for k in keys) for keys in formats.values())
    found = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ValueError(f"{path}, row {number}: no fine-tuning fields (found {found}); each row needs one of: {wanted} "
                     f"({described}).")


def chat_arguments(row, template_kwargs=None) -> tuple[list | None, dict]:
    """(tools, template keyword arguments) of one row, as TRL reads them: its `tools` column (a list of JSON
    schemas, or that list as a JSON string) and its `chat_template_kwargs` over the run's."""
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as error:
            raise ValueError(f"`tools` is a string that is not JSON ({error.msg}); give the list of tool schemas.") \
                from None
    kwargs = row.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or not (tools is None or isinstance(tools, list)):
        raise ValueError("`chat_template_kwargs` must be an object and `tools` a list of JSON schemas (TRL's columns).")
    return tools, {**(template_kwargs or {}), **kwargs}


def best_fit_decreasing(lengths, capacity) -> list[list[int]]:
    """Bins of item indices, each holding at most `capacity`: items longest first, each into the
    fullest bin it fits (TRL's "bfd")."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins, free = [], []  # free: sorted (room left, bin index)
    for i in order:
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            bins.append([i])
            bisect.insort(free, (capacity - lengths[i], len(bins) - 1))
        else:
            room, b = free.pop(at)
            bins[b].append(i)
            bisect.insort(free, (room - lengths[i], b))
    return bins


def row(examples_in_row, length, pad_id, packed):
    """(token_ids, padding_mask, targets, weights) of one row, int32 and float32 [length]."""
    ids = np.full(length, pad_id, np.int32)
    mask = np.zeros(length, np.int32)
    targets = np.zeros(length, np.int32)
    weights = np.zeros(length, np.float32)
    at = 0
    for number, example in enumerate(examples_in_row, 1):
        n = len(example.ids) - 1
        ids[at:at + n] = example.ids[:-1]
        targets[at:at + n] = example.ids[1:]
        weights[at:at + n] = example.mask[1:]
        mask[at:at + n] = number if packed else 1
        at += n
    return ids, mask, targets, weights


def epoch_rows(examples_, length, seed, epoch, packed) -> list[list]:
    """The rows of one epoch, in order: lists of examples (one each unless packed)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(examples_))
    if not packed:
        return [[examples_[i]] for i in order]
    rows = []
    for start in range(0, len(order), PACK_WINDOW):
        window = [examples_[i] for i in order[start:start + PACK_WINDOW]]
        bins = best_fit_decreasing([len(e.ids) - 1 for e in window], length)
        rows += [[window[i] for i in b] for b in bins]
    return [rows[i] for i in rng.permutation(len(rows))]
