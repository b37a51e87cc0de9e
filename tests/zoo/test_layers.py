"""Layer-level numerics that the checkpointing parity tests cannot see (they
compare a layer with itself)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from zoo.ops.activations import gelu
from zoo.ops.attention_core import attention_keep, chunked_attention, plain_attention
from zoo.ops.dropout import Masks, dropout_keep, pack_bits, stateless_dropout, unpack_bits


def test_gelu_matches_tensorflow_exact_gelu_and_its_gradient():
    x = tf.constant(np.linspace(-8, 8, 2001, dtype="float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours, reference = gelu(x), keras.activations.gelu(x, approximate=False)
    np.testing.assert_allclose(ours, reference, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(ours, x), tape.gradient(reference, x), atol=1e-6)


@pytest.mark.parametrize("core", [plain_attention, chunked_attention])
def test_attention_core_matches_naive_grouped_query_attention(core):
    rng = np.random.default_rng(0)
    b, s, h, kv, d = 2, 5, 4, 2, 8
    q, k, v = (rng.normal(size=(b, s, n, d)).astype("float32") for n in (h, kv, kv))
    padding = np.array([[1] * 5, [1, 1, 1, 0, 0]], "int32")
    out = core(q, k, v, key_mask=padding, causal=True, chunk_size=2).numpy()
    for bi in range(b):
        for hi in range(h):
            kh, vh = k[bi, :, hi // (h // kv)], v[bi, :, hi // (h // kv)]
            scores = q[bi, :, hi] @ kh.T / np.sqrt(d)
            allowed = np.tril(np.ones((s, s), bool)) & padding[bi].astype(bool)[None, :]
            scores = np.where(allowed, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            np.testing.assert_allclose(out[bi, :, hi], probs @ vh, atol=1e-5)


@pytest.mark.parametrize("causal,rate", [(True, 0.0), (False, 0.3), (True, 0.3)])
def test_one_tile_runs_without_loops_and_equals_plain(causal, rate):
    """A sequence no longer than the chunk is one tile: the chunked core runs it as straight-line ops
    (no While in the graph, forward or backward) and still equals the plain core, dropout included."""
    rng = np.random.default_rng(1)
    q, k, v = (tf.constant(rng.normal(size=(2, 12, n, 8)).astype("float32")) for n in (4, 2, 2))
    options = dict(key_mask=tf.constant([[1] * 12, [1] * 9 + [0] * 3]), causal=causal, rate=rate,
                   seed=tf.constant([5, 6], "int64") if rate else None)
    cotangent = tf.constant(rng.normal(size=(2, 12, 4, 8)).astype("float32"))

    def with_gradients(core, chunk_size):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(core(q, k, v, chunk_size=chunk_size, **options) * cotangent)
        return [loss] + tape.gradient(loss, [q, k, v])

    chunked = tf.function(lambda: with_gradients(chunked_attention, None))
    ops = {op.type for op in chunked.get_concrete_function().graph.get_operations()}
    assert not ops & {"While", "StatelessWhile"}, "one tile should not loop"
    looped = tf.function(lambda: with_gradients(chunked_attention, 5)).get_concrete_function().graph
    assert {op.type for op in looped.get_operations()} & {"While", "StatelessWhile"}  # three tiles do
    for a, b in zip(with_gradients(plain_attention, None), chunked()):
        np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-5)


def test_stateless_dropout_is_repeatable_and_unbiased():
    x = tf.ones((256, 256))
    seed = tf.constant([3, 4], "int64")
    a, b = stateless_dropout(x, 0.1, seed), stateless_dropout(x, 0.1, seed)
    np.testing.assert_array_equal(a, b)  # the recomputed pass draws the same mask
    assert not np.array_equal(a, stateless_dropout(x, 0.1, seed, site=1))  # sites differ
    kept = float(tf.reduce_mean(tf.cast(a > 0, "float32")))
    assert abs(kept - 0.9) < 0.01 and abs(float(tf.reduce_mean(a)) - 1.0) < 0.02


def test_bits_hold_every_pattern_and_odd_sizes():
    patterns = np.array([[(n >> k) & 1 for k in range(8)] for n in range(256)], bool)  # every byte
    bits = pack_bits(tf.constant(patterns))
    assert bits.dtype == tf.uint8 and bits.shape == (256,)
    np.testing.assert_array_equal(bits, np.arange(256))  # element k is bit k
    np.testing.assert_array_equal(unpack_bits(bits, [256, 8]), patterns)
    rng = np.random.default_rng(0)
    for shape in [(1,), (7,), (3, 5, 13), (2, 3, 16, 16)]:  # padded to a multiple of 8, and not
        keep = rng.random(shape) < 0.5
        bits = pack_bits(tf.constant(keep))
        assert bits.shape == (-(-keep.size // 8),)
        np.testing.assert_array_equal(unpack_bits(bits, tf.shape(keep)), keep)


def test_masks_held_as_bits_equal_the_redrawn_ones():
    """What "full"'s replay reads back is what drawing again from the seed gives: the residual
    branches' masks and the attention's (the tile layout the cores draw, 6-position tiles here)."""
    seed, rate = tf.constant([5, 6], "int64"), 0.1
    masks = Masks(seed)
    masks.hold(1, dropout_keep([2, 16, 64], rate, seed, site=1))
    masks.hold(0, attention_keep(seed, 2, 4, 16, 16, rate, chunk_size=6))
    x = tf.ones((2, 16, 64))
    np.testing.assert_array_equal(stateless_dropout(x, rate, None, site=1, keep=masks.held(1, when=x)),
                                  stateless_dropout(x, rate, seed, site=1))
    assert masks.held(2, when=x) is None  # not held: drawn from masks.seed
    q = tf.constant(np.random.default_rng(1).normal(size=(2, 16, 4, 8)), tf.float32)
    options = dict(causal=True, rate=rate, chunk_size=6)
    held = plain_attention(q, q, q, keep=masks.held(0, when=q), **options)
    np.testing.assert_array_equal(held, plain_attention(q, q, q, seed=seed, **options))
    np.testing.assert_allclose(held, chunked_attention(q, q, q, seed=seed, **options), atol=2e-6)
    assert not np.array_equal(held, plain_attention(q, q, q, seed=seed + 1, **options))  # the mask matters


def test_bad_attention_choices_name_the_problem():
    import zoo
    from tests.common import TINY_DEC

    model = zoo.get("dec-base", **TINY_DEC)
    with pytest.raises(ValueError, match="known cores: auto, chunked, plain"):
        model.set_attention("flash")
    with pytest.raises(ValueError, match="positive number of positions"):
        model.set_attention("chunked", 0)
    model.set_attention("chunked", 64)
    x = {"token_ids": np.ones((1, 16), "int32"), "padding_mask": np.ones((1, 16), "int32")}
    with pytest.raises(ValueError, match="chunk_size 64 is larger than the key sequence length 16"):
        model(x)
    model.set_attention("chunked", 16)
    assert model.attention == ("chunked", 16)
    assert model(x)["logits"].shape == (1, 16, TINY_DEC["vocab_size"])
