"""Gemma's tokenizer: a SentencePiece model (`tokenizer.model`) read by zoo.hub into keras-hub's
SentencePieceTokenizer gives the ids transformers' GemmaTokenizer gives (fixture made once by
tools/make_sentencepiece_fixture.py: byte fallback, doubled spaces), and is written back as is."""

import json

import numpy as np

import zoo
from tests.common import REPO
from zoo.hub.tokenizers import load_tokenizer, save_tokenizer

FIXTURE = REPO / "tests" / "fixtures" / "sentencepiece"


def test_ids_are_transformers_gemma_tokenizer():
    expected = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(FIXTURE)
    for text, ids in expected["ids"].items():
        assert np.asarray(tokenizer(text)).tolist() == ids, text
        assert zoo.generation.detokenize(tokenizer, ids) == text
    assert tokenizer.token_to_id("<eos>") == expected["eos_id"]


def test_a_saved_folder_keeps_the_model_and_prefers_it_to_tokenizer_json(tmp_path):
    save_tokenizer(load_tokenizer(FIXTURE), tmp_path)
    assert (tmp_path / "tokenizer.model").read_bytes() == (FIXTURE / "tokenizer.model").read_bytes()
    # Gemma's folders also hold a byte-fallback tokenizer.json, which alone is refused: the model is read instead
    model = {"type": "BPE", "byte_fallback": True, "vocab": {"▁a": 0}, "merges": []}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": model, "added_tokens": []}))
    assert np.asarray(load_tokenizer(tmp_path)("the quick fox")).tolist() == \
        json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))["ids"]["the quick fox"]
