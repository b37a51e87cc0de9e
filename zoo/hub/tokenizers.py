"""Tokenizer files in and out: Hugging Face `vocab.txt` (WordPiece), `vocab.json` +
`merges.txt` (byte-level BPE), `tokenizer.model` (SentencePiece: Gemma, Llama 2, Mistral)
and `tokenizer.json` <-> keras-hub tokenizers.

The one place zoo reads tokenizer files: `zoo.hub.load` attaches the folder's
tokenizer to the model, and the training recipes (`recipes.vocab`) load their
vocabularies through the same two readers, `wordpiece` and `byte_pair`.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoo import reading

WORDPIECE_FILE = "vocab.txt"
BPE_FILES = ("vocab.json", "merges.txt")
SENTENCEPIECE_FILE = "tokenizer.model"
# End-of-text tokens by the names checkpoints give them: GPT-2's, SmolLM2's and Qwen's; Llama 3's;
# Gemma's; Llama 2's and Mistral's.
END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "<eos>", "</s>")


def read_json(path) -> dict:
    """A JSON file's contents, or {} when it does not exist (most files of a Hugging Face folder are optional)."""
    return reading.read_json(path, missing={})


def wordpiece(path, lowercase=False, special_tokens=True, **kwargs):
    """A keras-hub WordPiece tokenizer from a `vocab.txt`, so that every WordPiece
    vocabulary zoo meets is read the same way.

    Args:
        path: a `vocab.txt` file, or a folder holding one.
        lowercase: lowercase (and strip accents) before splitting, as uncased BERT.
        special_tokens: True returns keras-hub's `BertTokenizer` (which needs [CLS],
            [SEP], [PAD] and [MASK] in the vocabulary); False a plain `WordPieceTokenizer`.
        **kwargs: passed to the tokenizer (`dtype="int32"`).

    Returns:
        A `keras_hub.models.BertTokenizer` or `keras_hub.tokenizers.WordPieceTokenizer`.

    Example:
    >>> wordpiece("all-MiniLM-L6-v2", lowercase=True)("The quick brown fox")
    [1996, 4248, 2829, 4419]
    """
    import keras_hub

    path = Path(path)
    vocab = path / WORDPIECE_FILE if path.is_dir() else path
    if not vocab.is_file():
        raise FileNotFoundError(f"No WordPiece vocabulary at {str(path)!r}: expected a vocab.txt file or a folder "
                                "with one.")
    tokens = [line.rstrip() for line in reading.read_text(vocab).splitlines()]  # as keras-hub reads a vocabulary
    cls = keras_hub.models.BertTokenizer if special_tokens else keras_hub.tokenizers.WordPieceTokenizer
    return cls(vocabulary=tokens, lowercase=lowercase, **kwargs)


def byte_pair(folder, unsplittable_tokens=None, **kwargs):
    """A keras-hub byte-level BPE tokenizer from `vocab.json` + `merges.txt` (GPT-2,
    Llama 3, SmolLM2 and Hugging Face `tokenizers` all write this pair).

    Args:
        folder: a folder holding `vocab.json` and `merges.txt`.
        unsplittable_tokens: special tokens kept whole ("<|endoftext|>").
        **kwargs: passed to the tokenizer (`dtype="int32"`).

    Returns:
        A `keras_hub.tokenizers.BytePairTokenizer`.

    Example:
    >>> byte_pair("runs/news/tokenizer", unsplittable_tokens=["<|endoftext|>"]).vocabulary_size()
    4096
    """
    folder = Path(folder)
    vocab, merges = (folder / name for name in BPE_FILES)
    if not (vocab.is_file() and merges.is_file()):
        raise FileNotFoundError(
            f"No byte-level BPE vocabulary at {str(folder)!r}: expected a folder with {' and '.join(BPE_FILES)}.")
    rules = [m for m in reading.read_text(merges).splitlines() if m and not m.startswith("#version")]
    return _bpe(read_json(vocab), rules, unsplittable_tokens, **kwargs)


def _bpe(vocab, merges, unsplittable_tokens=None, **kwargs):
    import keras_hub

    return keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=vocab, merges=merges, unsplittable_tokens=unsplittable_tokens or None, **kwargs
    )


def _specials(added) -> list[str]:
    return [t["content"] for t in added if t.get("special", True)]


def load_tokenizer(folder):
    """The tokenizer of a Hugging Face model folder as a keras-hub tokenizer, so that a
    loaded model can turn text into ids with no transformers install.

    WordPiece (`vocab.txt`, or a WordPiece `tokenizer.json`) becomes `BertTokenizer`;
    byte-level BPE (`vocab.json` + `merges.txt`, or a BPE `tokenizer.json`) becomes
    `BytePairTokenizer` with the special tokens kept whole; a SentencePiece model
    (`tokenizer.model`, which Gemma's folders ship beside their tokenizer.json) becomes
    `SentencePieceTokenizer`.

    Args:
        folder: a Hugging Face model folder.

    Returns:
        A keras-hub tokenizer, or None when the folder has no tokenizer files.

    Example:
    >>> load_tokenizer("all-MiniLM-L6-v2")("The quick brown fox")
    [1996, 4248, 2829, 4419]
    """
    import keras_hub

    folder = Path(folder)
    settings = read_json(folder / "tokenizer_config.json")
    # Without tokenizer_config.json, tokenizer.json's normalizer says whether BERT is uncased.
    normalizer = (read_json(folder / "tokenizer.json").get("normalizer") or {}) if "do_lower_case" not in settings \
        else {}
    lowercase = bool(settings.get("do_lower_case", normalizer.get("lowercase", False)))
    if (folder / WORDPIECE_FILE).exists():
        return wordpiece(folder, lowercase=lowercase)
    if all((folder / name).exists() for name in BPE_FILES):
        return byte_pair(folder, _specials(settings.get("added_tokens_decoder", {}).values()))
    if (folder / SENTENCEPIECE_FILE).exists():  # the model its tokenizer.json was converted from, if any
        with reading.parsed_by_library(folder / SENTENCEPIECE_FILE, "a SentencePiece model"):
            return keras_hub.tokenizers.SentencePieceTokenizer(proto=str(folder / SENTENCEPIECE_FILE))
    if (folder / "tokenizer.json").exists():
        spec = read_json(folder / "tokenizer.json")
        model = spec["model"]
        if model.get("type") == "WordPiece":
            vocab = [token for token, _ in sorted(model["vocab"].items(), key=_by_id)]
            lower = (spec.get("normalizer") or {}).get("lowercase", lowercase)
            return keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=bool(lower))
        if model.get("type") == "BPE" and model.get("byte_fallback"):
            raise ValueError(f"{folder / 'tokenizer.json'} is a SentencePiece-style BPE (byte_fallback, as Gemma's), "
                             f"not byte-level BPE; zoo reads such a tokenizer from its SentencePiece model: add the "
                             f"checkpoint's {SENTENCEPIECE_FILE} to the folder (or load with tokenizer=False).")
        if model.get("type") == "BPE":
            merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
            return _bpe(model["vocab"], merges, _specials(spec.get("added_tokens", [])))
        raise ValueError(f"Unsupported tokenizer model {model.get('type')!r} in {folder / 'tokenizer.json'}.")
    return None


def _by_id(item):
    return item[1]


def save_tokenizer(tokenizer, folder):
    """Write a keras-hub tokenizer as the files transformers' tokenizers read, so that
    a saved folder is complete: `vocab.txt` (WordPiece) or `vocab.json` + `merges.txt`
    (byte-level BPE), with `tokenizer_config.json`.

    Args:
        tokenizer: a keras-hub `WordPieceTokenizer` (`BertTokenizer`) or `BytePairTokenizer`.
        folder: an existing folder to write into.

    Returns:
        None.

    Example:
    >>> save_tokenizer(model.tokenizer, "out/")
    """
    import keras_hub

    folder = Path(folder)
    if isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        (folder / WORDPIECE_FILE).write_text("\n".join(tokenizer.get_vocabulary()) + "\n", encoding="utf-8")
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(tokenizer.lowercase)}
    elif isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer):
        (folder / "vocab.json").write_text(json.dumps(tokenizer.vocabulary, ensure_ascii=False), encoding="utf-8")
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(tokenizer.merges) + "\n", encoding="utf-8")
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": bool(tokenizer.add_prefix_space)}
        special = tokenizer.unsplittable_tokens or []
        if special:
            config["added_tokens_decoder"] = {
                str(tokenizer.vocabulary[t]): {"content": t, "special": True} for t in special
            }
    elif isinstance(tokenizer, keras_hub.tokenizers.SentencePieceTokenizer):
        (folder / SENTENCEPIECE_FILE).write_bytes(tokenizer.proto)
        config = {}  # transformers picks the SentencePiece class from the model's config (GemmaTokenizer for Gemma)
    else:
        raise TypeError(f"Cannot save a {type(tokenizer).__name__}; zoo saves WordPiece, byte-level BPE and "
                        "SentencePiece tokenizers.")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
