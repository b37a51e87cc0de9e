"""Sliding-window attention in both cores (zoo.ops.attention_core, `window=`).

The rule is transformers 5.24's (masking_utils): a causal query at position i sees the keys
j with i - w < j <= i (`sliding_window_overlay`: kv_idx > q_idx - sliding_window), and
ModernBERT's bidirectional one those with |i - j| <= local_attention // 2
(`sliding_window_bidirectional_overlay`), which is window = local_attention // 2 + 1 here.
The numpy reference below is written in transformers' own terms; the chunked core must equal
the plain one in the forward pass and in every gradient, with dropout, and must compute only
the tiles that hold a pair inside the window.
"""

import numpy as np
import pytest
import tensorflow as tf

from zoo.ops import attention_core
from zoo.ops.attention_core import chunked_attention, key_chunk_range, plain_attention, tile_count

B, S, H, KV, D = 2, 14, 4, 2, 8  # grouped-query heads; 14 positions in chunks of 4 leave a partial last chunk
CHUNK = 4


def qkv(seed=0, length=S):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(B, length, n, D)).astype("float32")) for n in (H, KV, KV)]


def padding(length=S):
    mask = np.ones((B, length), "int32")
    mask[1, -3:] = 0
    return tf.constant(mask)


def transformers_rule(query_positions, key_positions, causal, window):
    """[S, T] bool as transformers 5.24 builds it (window as the zoo's `window`)."""
    q, k = np.asarray(query_positions)[:, None], np.asarray(key_positions)[None, :]
    if causal:  # causal_mask_function and sliding_window_overlay(sliding_window=window)
        return (k <= q) & (k > q - window) if window else k <= q
    half = window - 1  # ModernBERT: local_attention // 2
    return np.abs(q - k) <= half if window else np.ones_like(q - k, bool)


def numpy_attention(q, k, v, key_mask, causal, window, query_offset=0):
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    rule = transformers_rule(query_offset + np.arange(q.shape[1]), np.arange(k.shape[1]), causal, window)
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        allowed = rule & np.asarray(key_mask[b], bool)[None, :]
        for h in range(q.shape[2]):
            scores = q[b, :, h] @ k[b, :, h // (H // KV)].T / np.sqrt(D)
            scores = np.where(allowed, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[b, :, h] = (probs / probs.sum(-1, keepdims=True)) @ v[b, :, h // (H // KV)]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("core", [plain_attention, chunked_attention])
def test_window_is_transformers_rule(core, causal):
    q, k, v = qkv()
    out = core(q, k, v, key_mask=padding(), causal=causal, chunk_size=CHUNK, window=5)
    np.testing.assert_allclose(out, numpy_attention(q, k, v, padding().numpy(), causal, 5), atol=1e-5)


def with_gradients(core, q, k, v, cotangent, **options):
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = core(q, k, v, **options)
        loss = tf.reduce_sum(out * cotangent)
    return [out] + tape.gradient(loss, [q, k, v])


# windows inside one chunk, straddling a chunk edge, and two whole chunks; with and without dropout
@pytest.mark.parametrize("window", [3, 5, 8])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_chunked_equals_plain_forward_and_every_gradient(window, causal, rate):
    q, k, v = qkv(1)
    cotangent = tf.constant(np.random.default_rng(2).normal(size=(B, S, H, D)).astype("float32"))
    options = dict(key_mask=padding(), causal=causal, chunk_size=CHUNK, window=window, rate=rate,
                   seed=tf.constant([7, 8], "int64") if rate else None)
    plain = with_gradients(plain_attention, q, k, v, cotangent, **options)
    chunked = with_gradients(chunked_attention, q, k, v, cotangent, **options)
    for name, a, b in zip(("output", "d_query", "d_key", "d_value"), plain, chunked):
        np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-5, err_msg=name)
    if rate:  # dropout really acted: the windowed output differs from the one without it
        undropped = plain_attention(q, k, v, **{**options, "rate": 0.0, "seed": None})
        assert np.abs(np.asarray(plain[0]) - np.asarray(undropped)).max() > 0.1


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("core", [plain_attention, chunked_attention])
def test_window_at_least_the_sequence_is_global_attention_exactly(core, causal):
    q, k, v = qkv(3)
    cotangent = tf.ones((B, S, H, D))
    options = dict(key_mask=padding(), causal=causal, chunk_size=CHUNK, rate=0.2, seed=tf.constant([1, 2], "int64"))
    everything = with_gradients(core, q, k, v, cotangent, **options)
    for window in (S, S + 5):
        for a, b in zip(everything, with_gradients(core, q, k, v, cotangent, window=window, **options)):
            np.testing.assert_array_equal(a, b)


def tiles_with_a_pair(query_length, key_length, chunk, causal, window, query_offset=0):
    """The expected count, by brute force: tiles (i, j) holding at least one allowed (query, key) pair."""
    rule = transformers_rule(query_offset + np.arange(query_length), np.arange(key_length), causal, window)
    rows = range(0, query_length, chunk)
    return sum(rule[a:a + chunk, c:c + chunk].any() for a in rows for c in range(0, key_length, chunk))


class TileCounter:
    """Counts the tiles whose scores the chunked core computes (eager: the loops run in Python)."""

    def __init__(self, monkeypatch):
        self.count, scores = 0, attention_core._Tiles.scores

        def counted(tiles, i, j, q):
            self.count += 1
            return scores(tiles, i, j, q)

        monkeypatch.setattr(attention_core._Tiles, "scores", counted)


@pytest.mark.parametrize("causal,window,offset,length", [
    (True, 5, 0, S), (False, 5, 0, S), (True, 3, 0, S), (False, 8, 0, S), (True, None, 0, S),
    (True, 6, 17, 3),  # decoding: 3 queries at positions 17-19 against a 20-key cache
])
def test_tiles_outside_the_window_are_skipped_forward_and_backward(monkeypatch, causal, window, offset, length):
    keys = offset + length
    q, _, _ = qkv(4, length)
    _, k, v = qkv(5, keys)
    expected = tiles_with_a_pair(length, keys, CHUNK, causal, window, offset)
    assert tile_count(length, keys, CHUNK, causal, window, offset) == expected
    counter = TileCounter(monkeypatch)
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = chunked_attention(q, k, v, causal=causal, query_offset=offset, chunk_size=CHUNK, window=window)
        assert counter.count == expected  # forward
        loss = tf.reduce_sum(out)
    tape.gradient(loss, [q, k, v])
    assert counter.count == 2 * expected  # backward: the same tiles again


@pytest.mark.parametrize("core", [plain_attention, chunked_attention])
def test_decoding_queries_are_masked_to_their_window(core):
    """A KV cache: queries at positions 17-19 (query_offset) against 24 cached keys, the last 4 not yet
    written (key_mask), see the same keys as in the full sequence."""
    q, _, _ = qkv(6, 3)
    _, k, v = qkv(7, 24)
    written = np.ones((B, 24), "int32")
    written[:, 20:] = 0
    out = core(q, k, v, key_mask=written, causal=True, query_offset=17, chunk_size=CHUNK, window=6)
    np.testing.assert_allclose(out, numpy_attention(q, k, v, written, True, 6, query_offset=17), atol=1e-5)


def test_tile_count_grows_as_s_times_w():
    """At full size (chunk 512): Gemma 3's causal window of 512 computes 2n - 1 tiles for n query
    chunks, ModernBERT's bidirectional one (local_attention 128: window 65) 3n - 2, against
    n(n + 1)/2 and n² for global attention."""
    for n in (4, 8, 16):
        s = 512 * n
        assert tile_count(s, s, 512, causal=True, window=512) == 2 * n - 1
        assert tile_count(s, s, 512, causal=False, window=65) == 3 * n - 2
        if n <= 4:  # the brute force holds an s x s mask (n = 8 takes the same path at 4x the cost)
            assert tile_count(s, s, 512, causal=True, window=512) == tiles_with_a_pair(s, s, 512, True, 512)
            assert tile_count(s, s, 512, causal=False, window=65) == tiles_with_a_pair(s, s, 512, False, 65)
        assert tile_count(s, s, 512, causal=True) == n * (n + 1) // 2
        assert tile_count(s, s, 512) == n * n
    assert key_chunk_range(0, 1, 512, 16, 1, causal=True, window=512, query_offset=8000) == (14, 16)  # one decode step


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "512"])
def test_bad_window_is_refused_by_name(bad):
    q, k, v = qkv()
    for core in (plain_attention, chunked_attention):
        with pytest.raises(ValueError, match="window must be a positive number of positions"):
            core(q, k, v, window=bad)


@pytest.mark.parametrize("jit", [False, True])
def test_windowed_core_compiles_with_dynamic_shapes_and_offset(jit):
    """Graph mode with unknown lengths and a tensor query_offset (as generation traces it), and XLA."""
    q, _, _ = qkv(8, 3)
    _, k, v = qkv(9, 20)
    spec = [tf.TensorSpec([B, None, n, D]) for n in (H, KV, KV)] if not jit else None

    @tf.function(input_signature=spec and spec + [tf.TensorSpec([], tf.int32)], jit_compile=jit)
    def run(q, k, v, offset):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = chunked_attention(q, k, v, causal=True, query_offset=offset, chunk_size=CHUNK, window=6)
            loss = tf.reduce_sum(out)
        return [out] + tape.gradient(loss, [q, k, v])

    compiled = run(q, k, v, tf.constant(17))
    eager = with_gradients(plain_attention, q, k, v, tf.ones((B, 3, H, D)), causal=True, query_offset=17,
                           chunk_size=CHUNK, window=6)
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(b, a, atol=2e-5)
