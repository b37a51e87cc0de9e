"""A chat checkpoint's template and tokenizer together: what generation needs to turn messages into
a prompt and to know where an answer ends.

    chat = Chat.find("runs/chat/tokenizer")
    ids = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    chat.stop_ids        # the template's end-of-turn token and the eos token
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.chat.template import ChatTemplate, ChatTemplateError
from zoo.chat.tokens import ChatTokenizer, Encoded


@dataclass(frozen=True)
class EncodedChat(Encoded):
    """A rendered conversation: `ids` and `mask` (1 = trained), the `text`, the assistant turns' character
    `spans`, and each token's character `offsets`."""

    text: str = ""
    spans: tuple = ()
    offsets: np.ndarray | None = None

    def show_mask(self, tokenizer=None, mask=None, open_mark="\u27e6", close_mark="\u27e7") -> str:
        """The text with each run of trained tokens between ⟦ and ⟧: what a training row learns, at a glance.
        `mask`: another mask over the same tokens (a reference's) to draw instead."""
        mask = np.asarray(self.mask if mask is None else mask)
        out, at, inside = [], 0, False
        for (start, end), trained in zip(self.offsets, mask):
            if trained and not inside:
                out.append(self.text[at:start] + open_mark)
                at, inside = start, True
            elif not trained and inside:
                out.append(self.text[at:start] + close_mark)
                at, inside = start, False
            out.append(self.text[at:end])
            at = end
        out.append(self.text[at:] if not inside else self.text[at:] + close_mark)
        return "".join(out)


def encode_chat(template: ChatTemplate, tokenizer: ChatTokenizer, messages, tools=None, add_generation_prompt=False,
                **template_kwargs) -> EncodedChat:
    """A conversation as the model trains on it: the checkpoint's own template renders it (tools and the
    template's keyword arguments, `enable_thinking=False`, `date_string=...`, as transformers passes them), the
    checkpoint's tokenizer encodes it as transformers does, and `mask` marks the assistant turns' tokens
    (`ChatTemplate.render_with_spans`: the reasoning, text and tool calls the template keeps, and the
    end-of-turn token). SFT and generation go through it, and DPO scores the same spans
    (`ChatTemplate.prompt_and_completion`); `show_mask` draws what is trained.

    Example:
    >>> chat = encode_chat(template, tokenizer, [{"role": "user", "content": "Hi"},
    ...                                          {"role": "assistant", "content": "Hello!"}])
    >>> print(chat.show_mask())
    <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n⟦Hello!<|im_end|>⟧\n
    """
    text, spans = template.render_with_spans(messages, add_generation_prompt, tools,
                                              control_tokens=tokenizer.control_tokens, **template_kwargs)
    encoded, offsets = tokenizer.encode_with_offsets(text, spans)
    return EncodedChat(encoded.ids, encoded.mask, text, tuple(spans), offsets)


# Conversations whose whitespace and scripts tell tokenizers apart (keras-hub's BytePairTokenizer splits
# "\n Grüße" as "\n " + "Grüße", Hugging Face `tokenizers` as "\n" + " Grüße"), for `Chat.serving_mismatch`.
SERVING_PROBES = (
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."}],
    [{"role": "system", "content": "Answer in one sentence."},
     {"role": "user", "content": "  Héllo, wörld!\n Grüße 👋 and 你好世界, naïve café?  \n"},
     {"role": "assistant", "content": "\n  Ça va très bien 🙂 — 日本語のテキスト, über alles.\t \n\n"}],
    [{"role": "user", "content": "Indent it:\n\ndef f(x):\n    return  x + 1\n\n\n  done"},
     {"role": "assistant", "content": "```python\ndef f(x):\n    return x + 1\n```\n\n 1,000,000 items; it's 3.14!"}],
)


class Chat:
    def __init__(self, template: ChatTemplate, tokenizer: ChatTokenizer):
        self.template, self.tokenizer = template, tokenizer
        self.stop_ids = self._stop_ids()

    @classmethod
    def find(cls, folder, override=None) -> Chat:
        """The chat of a Hugging Face folder or a training run (its tokenizer/ folder); raises
        ChatTemplateError, naming the fix, when the folder has no chat template."""
        folder = Path(folder)
        if (folder / "tokenizer").is_dir():
            folder = folder / "tokenizer"
        return cls(ChatTemplate.find(folder, override), ChatTokenizer.from_folder(folder))

    @classmethod
    def of(cls, folder) -> Chat | None:
        """`find`, or None when the folder has no chat template (a base model) or no tokenizer.json."""
        try:
            return cls.find(folder)
        except (ChatTemplateError, FileNotFoundError):
            return None

    def save(self, folder):
        """Write the template and the tokenizer.json it is rendered for into `folder`."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(folder)
        self.template.save(folder)

    def prompt_ids(self, messages, tools=None, **template_kwargs) -> np.ndarray:
        """The conversation rendered with the generation prompt, as int32 token ids (`encode`'s, without the
        assistant spans generation does not need)."""
        text = self.template.render(messages, add_generation_prompt=True, tools=tools, **template_kwargs)
        return self.tokenizer.encode([text], [None])[0].ids

    def encode(self, messages, tools=None, add_generation_prompt=False, **template_kwargs) -> EncodedChat:
        """`encode_chat` with this chat's template and tokenizer."""
        return encode_chat(self.template, self.tokenizer, messages, tools, add_generation_prompt, **template_kwargs)

    def serving_mismatch(self, tokenize) -> str | None:
        """Where `tokenize` (text -> ids: a serving graph's tokenizer) tokenizes this chat's conversations
        (`SERVING_PROBES`, rendered by its template) unlike training does; None where it never does."""
        for messages in SERVING_PROBES:
            try:
                text = self.template.render(messages, add_generation_prompt=False)
            except ChatTemplateError:
                continue
            want = self.tokenizer.encode([text], [None])[0].ids.tolist()
            got = [int(i) for i in tokenize(text)]
            if got != want:
                at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                pieces = [self.tokenizer.tokenizer.decode([i], skip_special_tokens=False) for i in want[at:at + 3]]
                served = [self.tokenizer.tokenizer.decode([i], skip_special_tokens=False) for i in got[at:at + 3]]
                return (f"{text[:40]!r}... tokenizes as {served!r} where training has {pieces!r} (token {at} of "
                        f"{len(want)})")
        return None

    def decode(self, ids) -> str:
        """An answer's ids as text, without the special tokens (the end-of-turn token)."""
        return self.tokenizer.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _stop_ids(self) -> list[int]:
        """The template's end-of-turn token (<|im_end|>, <|eot_id|>, <end_of_turn>) and the eos token, as ids
        (the first token of each): generation stops at either."""
        stops = []
        for end in self.template.turn_ends(self.tokenizer.control_tokens):
            ids = self.tokenizer.encode([end], [None])[0].ids
            if len(ids) and int(ids[0]) not in stops:
                stops.append(int(ids[0]))
        return stops
