"""Generation on a tiny random decoder: the key/value cache changes nothing but
the cost, samplers behave as named, seeds reproduce, bad calls are refused."""

import keras_hub
import numpy as np
import pytest

import zoo
from zoo.generation import generate
from zoo.generation.sampling import SAMPLER_OPTIONS

TINY = dict(num_layers=2, hidden_dim=32, num_heads=4, num_kv_heads=2, intermediate_dim=64, vocab_size=97,
            max_sequence_length=48)


@pytest.fixture(scope="module")
def model():
    model = zoo.get("dec-base", **TINY)
    rng = np.random.default_rng(0)
    for v in model.weights:  # larger weights than the init: peaked, prompt-dependent logits
        v.assign(rng.normal(0, 0.3, v.shape).astype("float32") + (1.0 if "scale" in v.path else 0.0))
    return model


PROMPT = np.array([[5, 17, 3, 42, 8], [9, 9, 60, 1, 33]], "int32")


def full_recompute_greedy(model, prompt, steps):
    """The reference: rerun the whole model on the prefix, take the argmax."""
    tokens = prompt
    for _ in range(steps):
        logits = np.asarray(model({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})["logits"])
        tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None].astype("int32")], axis=1)
    return tokens


def test_cached_greedy_equals_full_recompute(model):
    expected = full_recompute_greedy(model, PROMPT, 12)
    np.testing.assert_array_equal(generate(model, PROMPT, 12), expected)
    np.testing.assert_array_equal(generate(model, PROMPT, 12, use_cache=False), expected)
    np.testing.assert_array_equal(generate(model, PROMPT, 12, compile=False), expected)
    assert len(set(expected[0, 5:].tolist())) > 1  # not a degenerate repeat of one token


def test_cached_logits_match_the_full_forward_pass(model):
    """Each cached step sees exactly what the full causal pass sees at that position."""
    from zoo.generation import _cached_decode

    seen = []

    class Record(keras_hub.samplers.GreedySampler):
        def get_next_token(self, probabilities):
            seen.append(probabilities)
            return super().get_next_token(probabilities)

    tokens = full_recompute_greedy(model, PROMPT, 6)
    mask = np.zeros_like(tokens, bool)
    mask[:, :5] = True
    run = _cached_decode(model, Record())
    run.python_function(tokens, mask, 5)  # eager: one recorded step per new token
    full = np.asarray(model({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})["logits"])
    for step, probs in enumerate(seen):
        expected = np.exp(full[:, 4 + step]) / np.exp(full[:, 4 + step]).sum(-1, keepdims=True)
        np.testing.assert_allclose(np.asarray(probs), expected, atol=1e-5)
    assert len(seen) == 6


def test_stop_tokens_end_each_row(model):
    """Every row ends at its own first stop token: row 0 at one stop id, row 1 at
    another, several positions apart; everything after a row's stop is padding (0)."""
    full = generate(model, PROMPT, 10)
    new = full[:, 5:]
    stops = [int(new[0, 2]), int(new[1, 6])]
    cut = generate(model, PROMPT, 10, stop_token_ids=stops)
    expected, ends = full.copy(), []
    for row in range(len(full)):
        end = 5 + int(np.flatnonzero(np.isin(new[row], stops))[0])  # the row's first generated stop
        expected[row, end + 1:] = 0
        ends.append(end)
        assert full[row, end + 1:].any(), "the cut must remove real tokens"
    assert len(set(ends)) == len(ends), f"rows must stop at different positions, got {ends}"
    np.testing.assert_array_equal(cut, expected)


def test_top_k_one_and_tiny_top_p_are_greedy(model):
    greedy = generate(model, PROMPT, 8)
    np.testing.assert_array_equal(generate(model, PROMPT, 8, sampler="top_k", top_k=1, seed=3), greedy)
    np.testing.assert_array_equal(generate(model, PROMPT, 8, sampler="top-p", top_p=1e-6, seed=3), greedy)


@pytest.mark.parametrize("sampler", ["top_k", "top_p", "temperature"])
def test_seeds_reproduce_and_differ(model, sampler):
    settings = dict(top_k=40, top_p=0.99, temperature=3.0)
    args = dict(sampler=sampler, **{k: settings[k] for k in SAMPLER_OPTIONS[sampler]})
    first = generate(model, PROMPT, 16, seed=1, **args)
    np.testing.assert_array_equal(generate(model, PROMPT, 16, seed=1, **args), first)
    np.testing.assert_array_equal(first[:, :5], PROMPT)
    assert not np.array_equal(generate(model, PROMPT, 16, seed=2, **args), first)
    assert not np.array_equal(first, generate(model, PROMPT, 16))


def test_temperature_sampler_draws_from_the_tempered_softmax(model):
    """`sampler="temperature"` (keras-hub's RandomSampler; also "random") samples
    softmax(logits / T) over the whole vocabulary: 2,000 draws of one token match
    those probabilities, not the untempered ones; T -> 0 is greedy."""
    prompt = np.repeat(PROMPT[:1], 2000, axis=0)
    logits = np.asarray(model({"token_ids": PROMPT[:1], "padding_mask": np.ones_like(PROMPT[:1])})["logits"])[0, -1]

    def softmax(z):
        e = np.exp(z - z.max())
        return e / e.sum()

    draws = generate(model, prompt, 1, sampler="temperature", temperature=2.0, seed=7, compile=False)[:, -1]
    freq = np.bincount(draws, minlength=len(logits)) / len(draws)
    tempered, plain = softmax(logits / 2.0), softmax(logits)
    # 2,000 draws: a frequency's standard error is <= 0.011; the two distributions differ by far more.
    off = np.abs(freq - tempered).max()
    assert off < 0.04, f"draw frequencies are {off:.3f} from softmax(logits / 2) (most likely p {tempered.max():.3f})"
    assert np.abs(freq - plain).max() > 0.1, "the draws ignore the temperature"
    assert len(np.unique(draws)) > 5  # a real draw, not an argmax
    random = generate(model, prompt[:4], 1, sampler="random", temperature=2.0, seed=7, compile=False)
    np.testing.assert_array_equal(random[:, -1], draws[:4])  # the same sampler under its keras-hub name
    greedy = generate(model, PROMPT, 8)
    tiny = generate(model, PROMPT, 8, sampler="temperature", temperature=1e-4, seed=3, compile=False)
    np.testing.assert_array_equal(tiny, greedy)


def test_text_prompts_use_the_tokenizer(model):
    vocab = {chr(ord("a") + i): i for i in range(26)} | {"Ġ": 26, "ab": 27, "Ġd": 28}
    tokenizer = keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocab, merges=["a b", "Ġ d"])
    text = generate(model, "abc de", 4, tokenizer=tokenizer)
    ids = generate(model, np.asarray(tokenizer("abc de"))[None], 4)
    assert text == tokenizer.detokenize(ids[0]) and text.startswith("abc de")


def test_bad_calls_are_refused(model):
    with pytest.raises(ValueError, match="decoder language model"):
        generate(zoo.get("enc-mini", num_layers=1, hidden_dim=32, num_heads=4, intermediate_dim=32), PROMPT, 2)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        generate(model, "hello", 2)
    with pytest.raises(ValueError, match="more than the model's 48"):
        generate(model, PROMPT, 44)
    with pytest.raises(ValueError, match="Unknown sampler"):
        generate(model, PROMPT, 2, sampler="beam")


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_chunked_core_generates_the_plain_cores_tokens(model, chunk_size):
    """With 4-position chunks the 5-token prefill spans two query chunks and the
    cache several key chunks, so every decode step's causal skip is exercised."""
    model.set_attention("plain")
    expected = generate(model, PROMPT, 12)
    model.set_attention("chunked", chunk_size)
    assert "_zoo_generate" not in model.__dict__  # the plain core's traced loop is dropped, not reused
    try:
        np.testing.assert_array_equal(generate(model, PROMPT, 12), expected)
        np.testing.assert_array_equal(generate(model, PROMPT, 12, compile=False), expected)
    finally:
        model.set_attention("chunked")
