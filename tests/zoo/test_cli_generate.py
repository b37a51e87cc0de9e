"""`zoo generate` end to end on a tiny Hugging Face folder with a byte-level BPE tokenizer."""

import json
import subprocess
import sys

import keras
import keras_hub
import pytest

import zoo
from tests.common import REPO
from zoo.generation import generate

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    vocabulary = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(LETTERS + "Ġ")}, "th": 28, "Ġt": 29}
    tokenizer = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=vocabulary, merges=["t h", "Ġ t"], unsplittable_tokens=["<|endoftext|>"])
    keras.utils.set_random_seed(3)
    model = zoo.get("dec-base", num_layers=2, hidden_dim=32, num_heads=4, num_kv_heads=2, intermediate_dim=64,
                    vocab_size=32, max_sequence_length=64)
    path = zoo.hub.save(model, tmp_path_factory.mktemp("hf") / "tiny", tokenizer=tokenizer)
    return path


def zoo_cli(*args):
    done = subprocess.run([sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_generate_streams_what_generate_returns(folder):
    model = zoo.loading.load(str(folder))
    prompts = ["the cat", "a dog sat"]
    expected = [generate(model, p, max_new_tokens=6, stop_token_ids=[0]) for p in prompts]
    streamed = zoo_cli("generate", str(folder), *prompts, "--max-new-tokens", "6").splitlines()
    assert streamed == expected
    batched = json.loads(zoo_cli("generate", str(folder), *prompts, "--max-new-tokens", "6", "--batch"))
    assert batched["outputs"] == expected


def test_generate_refuses_an_encoder(tmp_path):
    path = zoo.hub.save(zoo.get("enc-mini", num_layers=1, hidden_dim=32, num_heads=4, intermediate_dim=32),
                        tmp_path / "bert")
    done = subprocess.run([sys.executable, "-m", "zoo.cli", "generate", str(path), "hi"], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert done.returncode == 2 and "causal_lm" in done.stderr, done.stderr[-500:]
