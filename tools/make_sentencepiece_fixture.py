"""A tiny Gemma-style SentencePiece tokenizer and what transformers makes of it, for
`tests/zoo/test_sentencepiece.py` (which has neither transformers nor torch).

Gemma's folders ship `tokenizer.model` (a SentencePiece BPE with byte fallback) beside
a tokenizer.json converted from it. Here the `sentencepiece` trainer makes such a
model on a few sentences (Gemma's special pieces: <pad> 0, <eos> 1, <bos> 2, <unk> 3),
and transformers' `GemmaTokenizer` - the independent reader - records the ids of a few
texts, byte-fallback characters included, in `expected.json`:

    /tmp/hfvenv/bin/python tools/make_sentencepiece_fixture.py   # sentencepiece, protobuf, transformers 5
"""

import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sentencepiece"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a tokenizer turns text into pieces and pieces into ids",
    "memory is the product: weights, gradients and optimizer state",
    "the fox and the dog trained a small model on a small card",
] * 20
TEXTS = ["the quick fox", "pieces into ids", "Ünïcode 🙂 falls back to bytes", "  two  spaces"]


def main():
    import sentencepiece as spm
    from transformers import AutoTokenizer

    ROOT.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=330, hard_vocab_limit=False,
        byte_fallback=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, eos_piece="<eos>", bos_piece="<bos>", character_coverage=1.0,
        split_digits=True,
        add_dummy_prefix=False, remove_extra_whitespaces=False, normalization_rule_name="identity",
    )
    (ROOT / "tokenizer.model").write_bytes(model.getvalue())
    (ROOT / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GemmaTokenizer"}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(str(ROOT))  # converts tokenizer.model, as for a Gemma folder
    expected = {"transformers_class": type(tokenizer).__name__,
                "ids": {text: tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS},
                "eos_id": tokenizer.convert_tokens_to_ids("<eos>")}
    (ROOT / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(expected, ensure_ascii=False))


if __name__ == "__main__":
    main()
