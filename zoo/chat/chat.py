"""A chat checkpoint's template and tokenizer together: what generation needs to turn messages into
a prompt and to know where an answer ends.

    chat = Chat.find("runs/chat/tokenizer")
    ids = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    chat.stop_ids        # the template's end-of-turn token and the eos token
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zoo.chat.template import ChatTemplate, ChatTemplateError
from zoo.chat.tokens import ChatTokenizer

_PROBE = "\u2063zoo-probe\u2063"  # an answer no template changes, to see what follows an assistant turn


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

    def prompt_ids(self, messages) -> np.ndarray:
        """The conversation rendered with the generation prompt, as int32 token ids."""
        text = self.template.render(messages, add_generation_prompt=True)
        return self.tokenizer.encode([text], [None])[0].ids

    def decode(self, ids) -> str:
        """An answer's ids as text, without the special tokens (the end-of-turn token)."""
        return self.tokenizer.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _stop_ids(self) -> list[int]:
        """The first token after an assistant message's text (<|im_end|>, <|eot_id|>, <end_of_turn>),
        and the eos token: generation stops at either."""
        stops = []
        try:
            text = self.template.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}])
        except ChatTemplateError:
            text = ""
        after = text[text.find(_PROBE) + len(_PROBE):] if _PROBE in text else ""
        if after.strip():
            ids = self.tokenizer.encode([after.lstrip(" ")], [None])[0].ids
            if len(ids):
                stops.append(int(ids[0]))
        eos = self.template.special_tokens.get("eos_token")
        eos_id = self.tokenizer.token_id(eos) if eos else None
        if eos_id is not None and eos_id not in stops:
            stops.append(int(eos_id))
        return stops
