"""Supervised fine-tuning data: JSONL rows in the formats TRL's SFTTrainer accepts, as token rows
with a per-token loss weight, padded one example a row or packed several to a row.

Row formats (the first row decides; every row must have the same):
  {"messages": [{"role", "content"}, ...]}           a conversation: loss on assistant tokens
  {"prompt": ..., "completion": ...}                  plain strings, or lists of messages: loss on
                                                      the completion
  {"text": "..."}                                      plain text: loss on every token
Conversation rows may carry TRL's `tools` and `chat_template_kwargs` columns, which reach the template as
transformers passes them. Conversations are rendered by the checkpoint's own chat template, the assistant turns
found as `zoo.chat.encode_chat` finds them (its `show_mask` draws one row); plain prompt,
completion and text rows end with the end-of-sequence token, as TRL appends it. `loss_on="all"`
takes the loss on every token of every format.

An example of n tokens trains n - 1 positions (inputs ids[:-1], targets ids[1:], weights
mask[1:]), so no position ever predicts across two examples. Examples longer than the sequence
length are DROPPED, not truncated (truncation cuts the answers off), and so are examples with no
token to train on; both are counted and reported (`Report`), as are answers that start their row
(an empty prompt and no BOS before it: nothing predicts the answer's first token, which is not
trained on). A malformed row is refused with its row number.

Packing (`packed=True`) fills each row with whole examples by best-fit decreasing (as TRL's
`pack_dataset(strategy="bfd")`), over windows of `conversation.PACK_WINDOW` shuffled examples so that rows
change between epochs. The padding mask then numbers the examples (1, 2, ...; 0 is padding),
which a model with `set_packed(True)` reads as documents: attention stays within each and
positions restart. Each batch's weights are scaled so that the loss is the mean over the batch's
trained tokens (Keras' "sum_over_batch_size" divides by batch x length).
Order is a function of the seed and the epoch, so `skip(n)` puts a resumed run at its batch.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from recipes import conversation
from recipes.conversation import Report
from recipes.recipe import LOSS_ON
from zoo.chat import ChatTemplateError

FORMATS = {"messages": ("messages",), "prompt-completion": ("prompt", "completion"), "text": ("text",)}
DESCRIBED = "TRL's conversational, prompt/completion and language-modeling formats"


def read_rows(path) -> tuple[str, list[dict]]:
    """(format, rows) of a JSONL file in one of `FORMATS`; a row of another format, or none, is refused by number."""
    return conversation.read_rows(path, FORMATS, DESCRIBED)


def text_and_spans(kind, row, template, eos, control_tokens=(), template_kwargs=None):
    """(text, the character spans trained on) of one row, None spans meaning every token."""
    if kind == "text":
        return str(row["text"]) + eos, None
    tools, kwargs = conversation.chat_arguments(row, template_kwargs)
    if kind == "messages":
        return template.render_with_spans(row["messages"], tools=tools, control_tokens=control_tokens, **kwargs)
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, list) or isinstance(completion, list):  # rendering checks the messages
        return template.prompt_and_completion(prompt, completion, tools=tools, control_tokens=control_tokens,
                                              **kwargs)
    text = str(prompt) + str(completion) + eos
    return text, [(len(str(prompt)), len(text))]


def examples(kind, rows, template, tokenizer, sequence_length, loss_on="assistant", eos=None,
             numbers=None, template_kwargs=None) -> tuple[list, Report]:
    """The rows as `zoo.chat.Encoded` examples that fit `sequence_length` positions and train on
    at least one token, and a `Report` of what was dropped.

    Args:
        kind, rows: what `read_rows` returns.
        template: the checkpoint's `zoo.chat.ChatTemplate` (None: plain rows only).
        tokenizer: the checkpoint's `zoo.chat.ChatTokenizer`.
        sequence_length: positions a row trains.
        loss_on: "assistant" (assistant turns, completions) or "all".
        eos: appended to plain text and completions (default: the template's eos_token).
        numbers: the 1-based numbers of the rows to take (default: all), as messages name them.
        template_kwargs: the template's keyword arguments for every row (a row's `chat_template_kwargs`
            override them); a row's `tools` go to the template too.
    """
    if loss_on not in LOSS_ON:
        raise ValueError(f"Unknown loss_on {loss_on!r}; known: {', '.join(LOSS_ON)}.")
    if template is None and kind != "text" and not (kind == "prompt-completion" and _plain(rows)):
        raise ChatTemplateError("Conversations need the checkpoint's chat template; pass --chat-template FILE.")
    eos = eos if eos is not None else (template.special_tokens.get("eos_token", "") if template else "")
    numbers = list(numbers) if numbers is not None else list(range(1, len(rows) + 1))
    texts, spans_of = [], []
    for number in numbers:
        try:
            text, spans_i = text_and_spans(kind, rows[number - 1], template, eos, tokenizer.control_tokens,
                                            template_kwargs)
        except ChatTemplateError as error:
            raise ChatTemplateError(f"Row {number}: {error}") from None
        except ValueError as error:
            raise ValueError(f"Row {number}: {error}") from None
        texts.append(text)
        spans_of.append(spans_i)
    if loss_on == "all":
        spans_of = [None] * len(texts)
    encoded = tokenizer.encode(texts, spans_of)
    report, kept = Report(rows=len(numbers)), []
    for number, example, spans in zip(numbers, encoded, spans_of):
        positions = len(example.ids) - 1
        report.longest = max(report.longest, positions)
        if example.mask[1:].sum() == 0:  # first: more positions would not give it one (the advice differs)
            report.no_trained_token += 1
        elif positions > sequence_length:
            report.too_long += 1
        else:
            kept.append(example)
            report.tokens += positions
            report.trained_tokens += int(example.mask[1:].sum())
            report.untrained_first_token += int(spans is not None and example.mask[0] == 1)  # not plain text's
            continue
        if len(report.dropped_rows) < 10:
            report.dropped_rows.append(number)
    report.kept = len(kept)
    return kept, report


def _plain(rows) -> bool:
    return all(isinstance(r["prompt"], str) and isinstance(r["completion"], str) for r in rows)


# ----------------------------------------------------------------------------- rows
def batches(examples_, recipe, pad_id=0, training=True, skip=0):
    """Python generator of (x, targets, weights) numpy batches; training: epochs forever, whole batches."""
    size, length = recipe.batch_size, recipe.sequence_length
    epoch, seen = 0, 0
    while True:
        # validation: epoch 0 each time
        rows = conversation.epoch_rows(examples_, length, recipe.seed, epoch, recipe.packing)
        stop = len(rows) - len(rows) % size if training else len(rows)
        for start in range(0, stop, size):
            seen += 1
            if seen <= skip:
                continue
            ids, mask, targets, weights = (np.stack(a) for a in zip(*(
                conversation.row(r, length, pad_id, recipe.packing) for r in rows[start:start + size])))
            total = weights.sum()
            weights *= weights.size / total if total else 0.0  # the mean over the batch's trained tokens
            yield {"token_ids": ids, "padding_mask": mask}, targets, weights
        if not training:
            return
        if stop == 0:
            raise ValueError(f"{len(rows)} row(s) an epoch make no batch of {size}; lower --batch-size.")
        epoch += 1


def dataset(examples_, recipe, pad_id=0, training=True, skip=0) -> tf.data.Dataset:
    """`batches` as a tf.data pipeline for `fit` (a global batch, under a strategy)."""
    length = recipe.sequence_length
    ints = tf.TensorSpec((None, length), tf.int32)
    spec = ({"token_ids": ints, "padding_mask": ints}, ints, tf.TensorSpec((None, length), tf.float32))
    ds = tf.data.Dataset.from_generator(lambda: batches(examples_, recipe, pad_id, training, skip),
                                        output_signature=spec)
    return ds.prefetch(tf.data.AUTOTUNE)


def statistics(examples_, recipe) -> dict:
    """One epoch's padding fraction and trained tokens per batch: what packing changes."""
    rows = conversation.epoch_rows(examples_, recipe.sequence_length, recipe.seed, 0, recipe.packing)
    real = sum(len(e.ids) - 1 for e in examples_)
    trained = sum(int(e.mask[1:].sum()) for e in examples_)
    return {"rows": len(rows), "padding_fraction": 1 - real / (len(rows) * recipe.sequence_length),
            "trained_tokens_per_row": trained / len(rows), "examples_per_row": len(examples_) / len(rows)}
