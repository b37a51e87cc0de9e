"""Batched prompts of different lengths, streaming, and generation's refusals."""

import keras
import numpy as np
import pytest

import zoo
from zoo.generation import generate, stream

TINY = dict(num_layers=2, hidden_dim=32, num_heads=4, num_kv_heads=2, intermediate_dim=64, vocab_size=97,
            max_sequence_length=64)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return zoo.get("dec-base", **TINY)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(1, TINY["vocab_size"], n).astype("int32") for n in (3, 7, 5)]


@pytest.mark.parametrize("use_cache", [True, False])
def test_prompts_of_different_lengths_equal_each_alone(model, prompts, use_cache):
    batch = generate(model, prompts, max_new_tokens=6, use_cache=use_cache)
    assert batch.shape == (3, 7 + 6)
    for prompt, row in zip(prompts, batch):
        alone = generate(model, prompt, max_new_tokens=6, use_cache=use_cache)[0]
        assert alone.shape == (len(prompt) + 6,)
        np.testing.assert_array_equal(row[:len(prompt) + 6], alone)
        assert not row[len(prompt) + 6:].any(), "past its own new tokens a row is padding"


def test_eager_loop_equals_compiled(model, prompts):
    np.testing.assert_array_equal(generate(model, prompts, 4, compile=False), generate(model, prompts, 4))


def test_stream_yields_the_greedy_tokens(model, prompts):
    for prompt in prompts:
        alone = generate(model, prompt, max_new_tokens=6)[0]
        assert list(stream(model, prompt, 6)) == alone[len(prompt):].tolist()


def test_stream_stops_after_a_stop_token(model, prompts):
    tokens = generate(model, prompts[0], max_new_tokens=6)[0][3:].tolist()
    stop = tokens[2]
    expected = tokens[:tokens.index(stop) + 1]
    assert list(stream(model, prompts[0], 6, stop_token_ids=[stop])) == expected


def test_prompt_longer_than_the_positions_names_both_numbers(model):
    with pytest.raises(ValueError, match=r"prompt \(60 tokens\).*max_new_tokens \(10\).*70 positions.*64"):
        generate(model, np.ones(60, "int32"), max_new_tokens=10)
    with pytest.raises(ValueError, match="at most 4 new tokens"):
        list(stream(model, np.ones(60, "int32"), 10))


def test_xla_loop_is_refused_with_a_reason(model, prompts):
    with pytest.raises(ValueError, match=r"jit_compile=True\) is not supported: XLA needs static shapes"):
        generate(model, prompts, 4, jit_compile=True)


def test_empty_prompt_is_refused(model):
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, [np.ones(3, "int32"), np.zeros(0, "int32")], 4)
