"""Rendered conversations -> token ids and the assistant-token mask, as transformers makes them.

transformers' fast tokenizers are Hugging Face `tokenizers` (a keras-hub dependency): it encodes the
whole rendered text once, with no special tokens added (the template wrote them), and marks every
token whose character offsets overlap an assistant span. Here the same library encodes the same
text from the checkpoint's own `tokenizer.json`, so ids and offsets are transformers' by
construction. (keras-hub's BytePairTokenizer, which the model's serving graphs use, splits some
whitespace differently from `tokenizers`: "\\n Grüße" becomes "\\n " + "Grüße" where `tokenizers` gives
"\\n" + " Grüße"; training data must be tokenized as the checkpoint was.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.reading import read_json

TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Encoded:
    """One example: `ids` [n] int32 and `mask` [n] int8 (1 = a token the loss is taken on)."""

    ids: np.ndarray
    mask: np.ndarray


def mask_from_offsets(offsets, spans, length) -> np.ndarray:
    """transformers' rule (5.x): a token is marked when its character offsets overlap a span at
    all, so a token that starts before a span and runs into it is trained on too."""
    mask = np.zeros(length, np.int8)
    offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
    for start, end in spans:
        mask[(offsets[:, 0] < end) & (offsets[:, 1] > start)] = 1
    return mask


class ChatTokenizer:
    """The checkpoint's tokenizer as `tokenizers` reads it: ids and character offsets of whole texts."""

    def __init__(self, tokenizer, origin="a tokenizer"):
        self.tokenizer, self.origin = tokenizer, origin

    @classmethod
    def from_folder(cls, folder) -> ChatTokenizer:
        """`tokenizer.json`, or byte-level BPE `vocab.json` + `merges.txt` with the special tokens
        tokenizer_config.json lists (what zoo.hub.save_tokenizer writes)."""
        from tokenizers import AddedToken, Tokenizer
        from tokenizers.implementations import ByteLevelBPETokenizer

        folder = Path(folder)
        if (folder / TOKENIZER_FILE).is_file():
            return cls(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), str(folder / TOKENIZER_FILE))
        if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            bpe = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
            config = folder / "tokenizer_config.json"
            added = read_json(config, missing={}).get("added_tokens_decoder", {})
            bpe.add_special_tokens([AddedToken(t["content"], special=True, normalized=False)
                                    for t in added.values() if t.get("special", True)])
            return cls(bpe._tokenizer, str(folder))
        raise FileNotFoundError(f"{folder} has no {TOKENIZER_FILE} (nor vocab.json + merges.txt): chat fine-tuning "
                                "tokenizes as transformers does, from the checkpoint's own tokenizer files.")

    def save(self, folder):
        """Write `tokenizer.json` into `folder` (beside a run's keras-hub tokenizer files)."""
        self.tokenizer.save(str(Path(folder) / TOKENIZER_FILE))

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @functools.cached_property
    def control_tokens(self) -> tuple[str, ...]:
        """The special added tokens (<|im_end|>, <|eot_id|>, [/INST], ...): what tells a template's turns apart."""
        return tuple(t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special)

    def encode_with_offsets(self, text, spans) -> tuple[Encoded, np.ndarray]:
        """One text as ids and mask (spans None: every token), and each token's [start, end) characters."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, np.int32)
        offsets = np.asarray(encoding.offsets, np.int64).reshape(-1, 2)
        mask = np.ones(len(ids), np.int8) if spans is None else mask_from_offsets(offsets, spans, len(ids))
        return Encoded(ids, mask), offsets

    def encode(self, texts, spans_per_text) -> list[Encoded]:
        """Each text and its trained character spans as ids and a mask; spans None: every token."""
        out = []
        for encoding, spans in zip(self.tokenizer.encode_batch(list(texts), add_special_tokens=False),
                                   spans_per_text):
            ids = np.asarray(encoding.ids, np.int32)
            mask = np.ones(len(ids), np.int8) if spans is None else mask_from_offsets(encoding.offsets, spans,
                                                                                       len(ids))
            out.append(Encoded(ids, mask))
        return out
