"""Preference data: JSONL rows in TRL's preference formats, as pairs of token rows (chosen, rejected) whose
masks mark the completion tokens, in [pairs, 2, S] batches for `zoo.preference`'s step.

Row formats (the first row decides; every row must have the same):
  {"prompt", "chosen", "rejected"}   explicit prompt: strings, or a list of messages and, for each answer, a
                                     list of assistant messages
  {"chosen", "rejected"}             implicit prompt: two strings, or two whole conversations that share every
                                     turn but the last (the answers); the prompt is what they share, as TRL's
                                     `extract_prompt` takes it
Conversations are rendered by the checkpoint's chat template (zoo.chat), plain strings are concatenated and
the answers end with the end-of-sequence token (unless they already do).

The token ids are those of trl 1.16's `DPOTrainer._prepare_dataset`, exactly (tests/fixtures/dpo_peft/data.json):
prompt + answer is tokenized as one text. What is scored of them:
  - conversations (`completion_mask="spans"`, the default): each answer's chat span, from the end of the prompt's
    generation prompt through the end-of-turn token of its last turn (`ChatTemplate.prompt_and_completion`, the
    function SFT's prompt/completion rows train through; transformers' assistant mask of that turn). The
    separator a template writes after the end-of-turn token (ChatML's and Gemma's newline, Phi-3.5's
    `\n<|endoftext|>`) is not scored, nor header whitespace that tokenizes with the answer;
  - plain text, and conversations with `completion_mask="trl"`: TRL's rule. The prompt alone is tokenized too,
    and the completion starts where the two token sequences part (the shorter of the chosen's and the rejected's
    common prefix with the prompt) and runs to the end: a token that merges across the boundary (a prompt ending
    in a space) is scored with the completion, and so is a conversation's text after the end-of-turn token.
Plain text is tokenized with the tokenizer's own special tokens (a BOS, where its post-processor adds one), as
TRL's `tokenizer(text)` does; rendered conversations carry the template's.

A pair of n-token sequences trains n - 1 positions per side (inputs ids[:-1], targets ids[1:], weights
mask[1:], as recipes.conversation lays rows out). A pair with either side longer than the sequence length is
DROPPED (not truncated: truncation cuts the answers off), counted and reported. A pair whose answers start the sequence
(an empty prompt, and a tokenizer that adds no BOS) is kept, and its first answer token, which nothing
predicts, is not scored (nor in TRL; its IPO counts that token all the same: docs/dpo.md); the report counts
those pairs. An empty answer, or a row that does not fit its format, is refused with its row number and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from recipes import conversation
from recipes.recipe import COMPLETION_MASKS
from zoo.chat import ChatTemplateError, Encoded, EncodedChat, mask_from_offsets

FORMATS = {"explicit": ("prompt", "chosen", "rejected"), "implicit": ("chosen", "rejected")}
DESCRIBED = "TRL's preference formats: explicit prompt/chosen/rejected, implicit chosen/rejected"


@dataclass(frozen=True)
class Pair:
    """One preference pair: the 1-based row it came from, and the two token sequences (prompt + answer),
    each with `mask` 1 on its completion tokens."""

    number: int
    chosen: Encoded
    rejected: Encoded


def read_rows(path) -> tuple[str, list[dict]]:
    """("explicit" or "implicit", rows) of a JSONL file; a row of neither format is refused by number."""
    return conversation.read_rows(path, FORMATS, DESCRIBED)


def conversational(row) -> bool:
    """TRL's `is_conversational`: the answers are lists of messages."""
    return isinstance(row.get("chosen"), list)


def extract_prompt(chosen, rejected):
    """TRL's `extract_prompt`: (prompt, chosen, rejected) from two texts or conversations that share the
    prompt; for text, a space before the first differing character goes to the answers."""
    at = 0
    for at in range(min(len(chosen), len(rejected))):
        if chosen[at] != rejected[at]:
            if chosen[at - 1] == " ":
                at -= 1
            break
    return chosen[:at], chosen[at:], rejected[at:]


def _split(kind, row, is_conversational):
    """(prompt, chosen, rejected) of one row, checked; raises ValueError saying what is wrong."""
    sides = ("chosen", "rejected") if kind == "implicit" else ("prompt", "chosen", "rejected")
    wanted = list if is_conversational else str
    for side in sides:
        if not isinstance(row[side], wanted):
            raise ValueError(f"{side!r} is a {type(row[side]).__name__} where the file's first row makes it "
                             f"{'a list of messages' if is_conversational else 'a string'}; every row must have the "
                             "first row's form (plain strings, or conversations).")
    if row["chosen"] == row["rejected"]:  # either format: no preference to learn
        raise ValueError("chosen and rejected are the same: there is no preference to learn"
                         + (", and no answer to tell from the prompt." if kind == "implicit" else "."))
    if not is_conversational:
        return extract_prompt(row["chosen"], row["rejected"]) if kind == "implicit" else tuple(row[s] for s in sides)
    if kind == "implicit":
        prompt, chosen, rejected = extract_prompt(row["chosen"], row["rejected"])
        if len(chosen) != 1 or len(rejected) != 1:
            raise ValueError(f"chosen and rejected must be conversations that share every turn but the last (the "
                             f"answers); these share {len(prompt)} of {len(row['chosen'])} and "
                             f"{len(row['rejected'])} turns. Put the answers in the last turn, or use explicit "
                             "prompt/chosen/rejected rows.")
    else:
        prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
    if not prompt:
        raise ValueError("the prompt is empty: a conversational pair answers a prompt of one or more messages.")
    for side, messages in (("chosen", chosen), ("rejected", rejected)):
        if not messages:
            raise ValueError(f"{side} holds no message; it must be the assistant's answer "
                             "([{'role': 'assistant', 'content': ...}]).")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                role = message.get("role") if isinstance(message, dict) else type(message).__name__
                raise ValueError(f"{side}'s message {i} is {role!r}, not the assistant's: chosen and rejected are "
                                 "the assistant's answer ([{'role': 'assistant', 'content': ...}]); put the other "
                                 "turns in the prompt.")
    return prompt, chosen, rejected


def _empty(answer) -> bool:
    if isinstance(answer, str):
        return answer == ""
    return all(message.get("content") in ("", None, []) for message in answer)


def _texts(prompt, chosen, rejected, template, eos, tools=None, template_kwargs=None, control_tokens=()):
    """The prompt alone, as TRL renders it before tokenizing, and each answer's (prompt + answer, the
    character spans scored: None for TRL's rule), with the row's `tools` and template keyword arguments.
    A conversation's answer is `ChatTemplate.prompt_and_completion`'s, the span SFT trains."""
    if isinstance(prompt, str):
        chosen, rejected = (a if a.endswith(eos) else a + eos for a in (chosen, rejected))
        return prompt, [(prompt + chosen, None), (prompt + rejected, None)]
    kw = dict(tools=tools, **(template_kwargs or {}))
    return (template.render(prompt, add_generation_prompt=True, **kw),
            [template.prompt_and_completion(prompt, answer, control_tokens=control_tokens, **kw)
             for answer in (chosen, rejected)])


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _scored(encoding, spans, start) -> Encoded:
    """One side's ids and mask: the tokens that overlap its character spans (transformers' rule), or where `spans`
    is None (TRL's rule) every token from `start` on."""
    ids = np.asarray(encoding.ids, np.int32)
    if spans is None:
        return Encoded(ids, (np.arange(len(ids)) >= start).astype(np.int8))
    return Encoded(ids, mask_from_offsets(encoding.offsets, spans, len(ids)))


def pairs(kind, rows, template, tokenizer, sequence_length, numbers=None, eos=None,
          template_kwargs=None, completion_mask="spans") -> tuple[list[Pair], conversation.Report]:
    """The rows as `Pair`s that fit `sequence_length` positions, and a `conversation.Report` (unit "pair") of
    what was dropped.

    Args:
        kind, rows: what `read_rows` returns.
        template: the checkpoint's `zoo.chat.ChatTemplate` (None: plain rows only).
        tokenizer: the checkpoint's `zoo.chat.ChatTokenizer`.
        sequence_length: positions a sequence trains (n tokens are n - 1 positions).
        numbers: the 1-based numbers of the rows to take (default: all), as messages name them.
        eos: appended to plain answers that do not end with it (default: the template's eos_token).
        template_kwargs: the template's keyword arguments (a row's `chat_template_kwargs` override them; its
            `tools` reach the template too, as TRL passes them).
        completion_mask: for conversations, "spans" (each answer's chat span, what SFT trains) or "trl" (every
            token after the prompt's, as TRL's DPOTrainer); plain text always takes TRL's.
    """
    if completion_mask not in COMPLETION_MASKS:
        raise ValueError(f"Unknown completion_mask {completion_mask!r}; known: {', '.join(COMPLETION_MASKS)}.")
    is_conversational = conversational(rows[0])  # the file's first row, so that every split agrees
    if is_conversational and template is None:
        raise ChatTemplateError("Conversations need the checkpoint's chat template; pass --chat-template FILE.")
    eos = _eos(template, eos)
    numbers = list(numbers) if numbers is not None else list(range(1, len(rows) + 1))
    texts, spans = [], []
    for number in numbers:
        try:
            prompt, chosen, rejected = _split(kind, rows[number - 1], is_conversational)
            for side, answer in (("chosen", chosen), ("rejected", rejected)):
                if _empty(answer):
                    raise ValueError(f"the {side} answer is empty; every pair needs two answers to compare (drop "
                                     "the row, or fill it in).")
            prompt_text, answers = _texts(prompt, chosen, rejected, template, eos,
                                          *conversation.chat_arguments(rows[number - 1], template_kwargs),
                                          control_tokens=tokenizer.control_tokens)
        except ChatTemplateError as error:
            raise ChatTemplateError(f"Row {number}: {error}") from None
        except ValueError as error:
            raise ValueError(f"Row {number}: {error}") from None
        texts += [prompt_text, *(text for text, _ in answers)]
        spans += [None if completion_mask == "trl" else answer_spans for _, answer_spans in answers]
    # TRL: tokenizer(text) for plain text; a rendered conversation carries the template's special tokens
    encodings = tokenizer.tokenizer.encode_batch(texts, add_special_tokens=not is_conversational)
    report, kept = conversation.Report(rows=len(numbers), unit="pair"), []
    for i, number in enumerate(numbers):
        prompt, *answers = encodings[3 * i:3 * i + 3]
        start = min(_common_prefix(np.asarray(prompt.ids), np.asarray(a.ids)) for a in answers)
        sides = [_scored(answer, answer_spans, start) for answer, answer_spans in zip(answers, spans[2 * i:2 * i + 2])]
        for side, encoded, answer_spans in zip(("chosen", "rejected"), sides, spans[2 * i:2 * i + 2]):
            if not encoded.mask[1:].any():
                where = f"after the prompt's {start} (it adds nothing to the prompt's tokens)" if answer_spans is None \
                    else "in its chat span (the template renders nothing of it)"
                raise ValueError(f"Row {number}: the {side} answer has no token to score {where}; fill it in or drop "
                                 "the row.")
        positions = max(len(s.ids) for s in sides) - 1
        report.longest = max(report.longest, positions)
        if positions > sequence_length:
            report.too_long += 1
            if len(report.dropped_rows) < 10:
                report.dropped_rows.append(number)
            continue
        kept.append(Pair(number, *sides))
        report.tokens += sum(len(s.ids) - 1 for s in sides)
        report.trained_tokens += sum(int(s.mask[1:].sum()) for s in sides)
        report.untrained_first_token += int(any(s.mask[0] for s in sides))
    report.kept = len(kept)
    return kept, report


def _eos(template, eos=None) -> str:
    """What plain answers end with: `eos`, else the template's eos_token."""
    return eos if eos is not None else (template.special_tokens.get("eos_token", "") if template else "")


def show_pair(kind, rows, number, template, tokenizer, template_kwargs=None, completion_mask="spans") -> str:
    """Row `number` (1-based) as `pairs` scores it: each answer's text with the scored tokens between ⟦ and ⟧, and
    the counts (`zoo train --recipe dpo --show-mask ROW`)."""
    (pair,), _ = pairs(kind, rows, template, tokenizer, 10**9, numbers=[number], template_kwargs=template_kwargs,
                       completion_mask=completion_mask)
    row, is_conversational = rows[number - 1], conversational(rows[0])
    _, answers = _texts(*_split(kind, row, is_conversational), template, _eos(template),
                        *conversation.chat_arguments(row, template_kwargs))
    shown = []
    for side, encoded, (text, _) in zip(("chosen", "rejected"), (pair.chosen, pair.rejected), answers):
        offsets = tokenizer.tokenizer.encode(text, add_special_tokens=not is_conversational).offsets
        drawn = EncodedChat(encoded.ids, encoded.mask, text, (), np.asarray(offsets).reshape(-1, 2)).show_mask()
        shown.append(f"-- {side}: {len(encoded.ids)} tokens, {int(encoded.mask[1:].sum())} scored\n{drawn}")
    return "\n".join(shown)


# ----------------------------------------------------------------------------- batches
def _batch(pairs_, length, reference_rows=None):
    """(x, y) of a list of pairs: each side a row of conversation.row's layout (pad id 0), stacked [P, 2, length]."""
    rows = [conversation.row([side], length, 0, False) for p in pairs_ for side in (p.chosen, p.rejected)]
    ids, mask, targets, weights = (np.stack(a).reshape(len(pairs_), 2, length) for a in zip(*rows))
    y = {"targets": targets, "weights": weights}
    if reference_rows is not None:
        y["reference_logps"] = reference_rows
    return {"token_ids": ids, "padding_mask": mask}, y


def _checked_reference(pairs_, reference):
    if reference is None:
        return None
    reference = np.asarray(reference, np.float32)
    if reference.shape != (len(pairs_), 2):
        raise ValueError(f"reference holds {reference.shape} log-probabilities; want [{len(pairs_)}, 2] (chosen, "
                         "rejected), one row per pair in the order of `pairs`.")
    return reference


def batches(pairs_, recipe, training=True, skip=0, reference=None):
    """Python generator of (x, y) numpy batches of `recipe.batch_size` pairs; training: epochs forever in
    the seeded order of conversation.epoch_rows, whole batches only, the first `skip` batches skipped."""
    size, length = recipe.batch_size, recipe.sequence_length
    reference = _checked_reference(pairs_, reference)
    epoch, seen = 0, 0
    while True:
        order = [i for (i,) in conversation.epoch_rows(list(range(len(pairs_))), length, recipe.seed, epoch, False)]
        stop = len(order) - len(order) % size if training else len(order)
        if training and stop == 0:
            raise ValueError(f"{len(order)} pair(s) make no batch of {size}; lower --batch-size.")
        for start in range(0, stop, size):
            seen += 1
            if seen <= skip:
                continue
            at = order[start:start + size]
            yield _batch([pairs_[i] for i in at], length, None if reference is None else reference[at])
        if not training:
            return
        epoch += 1


def dataset(pairs_, recipe, training=True, skip=0, reference=None) -> tf.data.Dataset:
    """`batches` as a tf.data pipeline for `fit`: (x, y) with x {"token_ids", "padding_mask"} int32
    [P, 2, S] and y {"targets" int32, "weights" float32 [P, 2, S], "reference_logps" float32 [P, 2] when
    `reference` is given}; index 0 of the second axis is the chosen sequence, 1 the rejected."""
    ints = tf.TensorSpec((None, 2, recipe.sequence_length), tf.int32)
    y = {"targets": ints, "weights": tf.TensorSpec((None, 2, recipe.sequence_length), tf.float32)}
    if reference is not None:
        y["reference_logps"] = tf.TensorSpec((None, 2), tf.float32)
    spec = ({"token_ids": ints, "padding_mask": ints}, y)
    ds = tf.data.Dataset.from_generator(lambda: batches(pairs_, recipe, training, skip, reference),
                                        output_signature=spec)
    return ds.prefetch(tf.data.AUTOTUNE)


def reference_batches(pairs_, batch_size, sequence_length):
    """One pass in the pairs' order, the last batch partial: (indices, x, y) numpy, the layout of `dataset`,
    for the pass that scores every pair with the reference before training."""
    for start in range(0, len(pairs_), batch_size):
        indices = np.arange(start, min(start + batch_size, len(pairs_)))
        yield (indices, *_batch([pairs_[i] for i in indices], sequence_length))


def statistics(pairs_, sequence_length=None) -> dict:
    """Counts and mean lengths of the pairs, and the padding fraction of their rows padded to
    `sequence_length` (default: the longest sequence, as a batch-wise padder would see the worst batch)."""
    sides = [s for p in pairs_ for s in (p.chosen, p.rejected)]
    positions = [len(s.ids) - 1 for s in sides]
    length = sequence_length or max(positions, default=0)
    chosen, rejected = [len(p.chosen.ids) for p in pairs_], [len(p.rejected.ids) for p in pairs_]
    return {"pairs": len(pairs_), "chosen_tokens": float(np.mean(chosen or [0])),
            "rejected_tokens": float(np.mean(rejected or [0])),
            "completion_tokens": float(np.mean([int(s.mask[1:].sum()) for s in sides] or [0])),
            "padding_fraction": 1 - sum(positions) / (len(sides) * length) if sides and length else 0.0}
