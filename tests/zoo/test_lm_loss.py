"""The chunked causal-LM loss equals SparseCategoricalCrossentropy(from_logits=True) on the
whole logits, in value and in its gradients w.r.t. the hidden states and the LM head's
variables of a real tiny decoder (tied and untied), eagerly and in tf.function, with sample
weights and with uneven chunks; and its gradient computation holds far less than the
unchunked one (TF's allocator peak)."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY_DEC, allocator_peak
from zoo.ops.lm_loss import DEFAULT_LOSS_CHUNK, chunked_lm_loss, live_bytes, loss_chunk

VOCAB = 97
BATCH = 2
CASES = [(16, 4), (13, 5)]  # an even split, and 13 positions in chunks of 5, 5 and 3


def decoder(tied):
    keras.utils.set_random_seed(0)
    return zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, vocab_size=VOCAB, tie_embeddings=tied))


@functools.cache
def shared_decoder(tied):
    """One float32 decoder per head for the tests that only read its head (`lm_logits`, its variables)."""
    return decoder(tied)


def data(seq, hidden_dim=64, dtype="float32"):
    rng = np.random.default_rng(seq)
    h = tf.cast(rng.standard_normal((BATCH, seq, hidden_dim)).astype("float32"), dtype)
    y = tf.constant(rng.integers(0, VOCAB, (BATCH, seq)), tf.int32)
    w = tf.constant(rng.uniform(0, 2, (BATCH, seq)).astype("float32"))
    return h, y, w


def loss_and_grads(model, loss_fn, h, compile_):
    variables = model.backbone.token_embedding.trainable_variables

    def run(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            loss = loss_fn(h)
        grads = tape.gradient(loss, [h, *variables])
        return loss, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in
                      zip(grads, [h, *variables])]

    loss, grads = (tf.function(run) if compile_ else run)(h)
    return float(loss), [g.numpy().astype("float32") for g in grads]


def reference(model, h, y, w=None):
    return lambda x: keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model.lm_logits(x), w)


def assert_close(ref, got, rtol):
    assert got[0] == pytest.approx(ref[0], rel=rtol)
    for r, g in zip(ref[1], got[1]):
        # relative to the tensor's largest entry (entries near 0 have no meaningful relative error)
        scale = max(np.abs(r).max(), 1e-30)
        assert np.abs(r - g).max() / scale < rtol, np.abs(r - g).max() / scale


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("seq,chunk", CASES)
def test_equals_unchunked_fp32(tied, seq, chunk):
    model = shared_decoder(tied)
    h, y, w = data(seq)
    for weights in (None, w):
        ref = loss_and_grads(model, reference(model, h, y, weights), h, compile_=False)
        assert any(np.abs(g).max() > 0 for g in ref[1][1:])  # the head's variable gets a gradient
        for compile_ in (False, True):
            got = loss_and_grads(model, lambda x: chunked_lm_loss(x, model.lm_logits, y, chunk, weights), h, compile_)
            assert_close(ref, got, 1e-6)


def test_sample_weight_per_row_and_default_chunk():
    model = shared_decoder(True)
    h, y, _ = data(13)
    w = tf.constant([[1.0], [0.0]])  # [B, 1] broadcasts over positions; the divisor stays B * S
    ref = loss_and_grads(model, reference(model, h, y, w), h, compile_=True)
    got = loss_and_grads(model, lambda x: chunked_lm_loss(x, model.lm_logits, y, sample_weight=w), h, True)
    assert_close(ref, got, 1e-6)
    per_row = tf.constant([1.0, 0.0])  # [B], as Keras' losses take a weight per row
    got = loss_and_grads(model, lambda x: chunked_lm_loss(x, model.lm_logits, y, sample_weight=per_row), h, True)
    assert_close(ref, got, 1e-6)


def test_mixed_bfloat16():
    """bfloat16 hidden states and head compute, float32 variables and logits. The head's gradient is a
    bfloat16 matmul over the positions: unchunked rounds the sum over all B*S positions to bfloat16 once,
    chunked rounds each chunk's sum and adds them in float32, so they differ at bfloat16's precision (2^-8);
    the loss and d hidden are per-position and agree far closer."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = decoder(False)
    h, y, _ = data(13, dtype="bfloat16")
    ref = loss_and_grads(model, reference(model, h, y), h, compile_=True)
    got = loss_and_grads(model, lambda x: chunked_lm_loss(x, model.lm_logits, y, 5), h, compile_=True)
    assert got[0] == pytest.approx(ref[0], rel=1e-6)
    assert_close(ref, got, 2e-2)
    np.testing.assert_allclose(got[1][0], ref[1][0], rtol=0, atol=1e-2 * np.abs(ref[1][0]).max())


def test_bad_chunk_size():
    h, y, _ = data(4)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="chunk_size must be a positive"):
            chunked_lm_loss(h, lambda x: x, y, chunk_size=bad)


def test_chunk_and_live_bytes():
    assert loss_chunk(2, 13, VOCAB, 5) == 5
    assert loss_chunk(2, 3, VOCAB) == 3  # never more than the sequence
    assert loss_chunk(1, 4096, 1000) == DEFAULT_LOSS_CHUNK
    assert loss_chunk(8, 4096, 256000) < DEFAULT_LOSS_CHUNK  # capped by the chunk's logits bytes
    assert live_bytes(2, 512, 8000, 64) == 3 * 2 * 64 * 8000 * 4


def step_peak(loss_fn, h, head):
    """Allocator peak of a tf.function gradient computation (tests.common.allocator_peak)."""
    @tf.function
    def step(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            loss = loss_fn(h)
        d_h, d_w = tape.gradient(loss, [h, head.kernel])
        return loss, tf.reduce_sum(d_h), tf.reduce_sum(d_w)

    # measured alone: after the unmeasured first call every call peaked the same to 0.01 MiB (6 calls of each of this
    # file's four steps, oneDNN on and off); the least of two covers the rarer higher call of a busy process
    return allocator_peak(lambda: float(step(h)[0]), repeats=2)


@pytest.mark.memory
def test_gradient_memory_is_chunk_sized():
    """Allocator peak of a tf.function gradient computation: 32 MB of float32 logits unchunked."""
    batch, seq, vocab, hidden, chunk = 2, 512, 8000, 64, 64
    keras.utils.set_random_seed(0)
    emb = keras.layers.Dense(vocab, use_bias=False)
    emb.build((None, None, hidden))
    h = tf.random.normal([batch, seq, hidden])
    y = tf.random.uniform([batch, seq], 0, vocab, tf.int32)

    def peak(loss_fn):
        return step_peak(loss_fn, h, emb)

    full = peak(lambda x: keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, emb(x)))
    logits = batch * seq * vocab * 4
    assert full > logits  # the allocator sees the whole logits: the measurement is real
    grads = batch * seq * hidden * 4 + vocab * hidden * 4
    chunked = peak(lambda x: chunked_lm_loss(x, emb, y, chunk))
    assert chunked < 0.5 * full, (chunked, full)
    # live_bytes is honest: the chunk's tensors plus the gradients the step returns (and their accumulators)
    bound = live_bytes(batch, seq, vocab, chunk) + 3 * grads
    assert chunked <= bound, (chunked, bound)


@pytest.mark.memory
def test_each_chunk_casts_the_head_in_its_turn():
    """Under mixed_bfloat16 each chunk casts the float32 head to bfloat16. Sixteen chunks must not hold
    sixteen casts at once (TF's executor makes a variable's reads as early as it can: the 8 MiB
    head of this test cost ~0.9 GiB more at dec-1b's shape before each chunk's reads waited)."""
    seq, vocab, hidden = 64, 4096, 512
    keras.utils.set_random_seed(0)
    head = keras.layers.Dense(vocab, use_bias=False, dtype="mixed_bfloat16")
    head.build((None, None, hidden))
    h = tf.cast(tf.random.normal([1, seq, hidden]), tf.bfloat16)
    y = tf.random.uniform([1, seq], 0, vocab, tf.int32)
    two = step_peak(lambda x: chunked_lm_loss(x, head, y, seq // 2), h, head)
    sixteen = step_peak(lambda x: chunked_lm_loss(x, head, y, seq // 16), h, head)
    cast = vocab * hidden * 2
    # measured: equal, or the executor's concurrency above (1.25 casts, once exactly 2 in a full suite run);
    # 14 casts more before the fix, which this bound still catches
    assert sixteen <= two + 4 * cast, (sixteen, two, cast)


def compiled(loss_chunk, metrics=None, loss=None, vocab=4096, seq=256):
    """One block: the loss and the metrics are the head's, and each block's trace costs more than the steps."""
    keras.utils.set_random_seed(0)
    model = zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, num_layers=1, vocab_size=vocab,
                                                         max_sequence_length=seq))
    model.set_loss_chunk(loss_chunk)
    model.compile(optimizer=keras.optimizers.SGD(0.0), metrics=metrics,
                  loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, vocab, (2, seq)).astype("int32"), "padding_mask": np.ones((2, seq), "int32")}
    y = rng.integers(0, vocab, (2, seq)).astype("int32")
    return model, x, y


@pytest.mark.memory
def test_metrics_are_computed_chunk_by_chunk_in_the_chunked_memory():
    """`metrics=["accuracy"]` used to switch the chunked loss off silently (the whole float32 logits,
    gigabytes at dec-1b). Now the metrics are updated chunk by chunk: the same figures as on the
    whole logits, and the step's memory stays at the chunked one."""
    whole, x, y = compiled(0, metrics=["accuracy"])
    chunked, _, _ = compiled(32, metrics=["accuracy"])
    plain, _, _ = compiled(32)
    assert chunked.loss_from_backbone() and not whole.loss_from_backbone()
    # labels the model gets right at every other position, so that accuracy is about one half
    y[:, ::2] = np.argmax(whole(x)["logits"].numpy(), axis=-1)[:, ::2]
    expected = whole.train_on_batch(x, y, return_dict=True)
    got = chunked.train_on_batch(x, y, return_dict=True)
    assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6) and got["accuracy"] > 0
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    peaks = {name: allocator_peak(lambda m=m: m.train_on_batch(x, y)) for name, m in
             [("whole", whole), ("chunked", chunked), ("no metrics", plain)]}
    logits, chunk = 2 * 256 * 4096 * 4, 2 * 32 * 4096 * 4  # 8 MiB of float32 logits, 1 MiB a chunk
    assert peaks["whole"] > peaks["chunked"] + logits, peaks
    # The metrics read a chunk's logits: measured equal, or one chunk more with oneDNN on (the next chunk's logits
    # are made while the metrics finish with the last's), 2.25 chunks more with it off (AVX-512 EPYC, 2026-12-06);
    # the whole logits are 8 chunks and more: bound 4, half of them.
    assert peaks["chunked"] <= peaks["no metrics"] + 4 * chunk, peaks


def test_a_loss_the_chunked_loss_does_not_compute():
    """A chunk size asked for explicitly is refused with another loss; by default that loss trains on the
    whole logits, with a warning that says so."""
    focal = keras.losses.CategoricalFocalCrossentropy(from_logits=True)
    model, x, y = compiled(32, loss=focal)
    with pytest.raises(ValueError, match=r"set_loss_chunk\(32\) needs .*Crossentropy.*set_loss_chunk\(0\)"):
        model.loss_from_backbone()
    model.set_loss_chunk(None)
    with pytest.warns(UserWarning, match="whole float32 \\[batch, sequence, vocab\\] logits"):
        assert not model.loss_from_backbone()


def test_evaluate_makes_the_loss_chunk_by_chunk_and_equals_whole_logits():
    """Validation (`evaluate`, fit's val_loss) takes the chunked loss too, with no gradient, and
    gives Keras' whole-logits figures: the loss with per-token weights, and the metrics."""
    model = decoder(tied=True)
    rng = np.random.default_rng(3)
    x = {"token_ids": rng.integers(0, VOCAB, (BATCH, 16)).astype("int32"),
         "padding_mask": np.ones((BATCH, 16), "int32")}
    y, w = rng.integers(0, VOCAB, (BATCH, 16)).astype("int32"), rng.uniform(0, 2, (BATCH, 16)).astype("float32")
    results = {}
    for chunk in (4, 0):
        model.compile(loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                      metrics=["accuracy"])
        model.set_loss_chunk(chunk)
        assert model.loss_from_backbone() == bool(chunk)
        results[chunk] = model.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    np.testing.assert_allclose(results[4]["loss"], results[0]["loss"], rtol=1e-6)
    assert results[4]["accuracy"] == results[0]["accuracy"]
