"""The chat SFT loss runs the LM head only on trained positions (zoo.ops.lm_loss, `trained_only`): on a batch
whose prompts and padding are most positions it equals Keras' SparseCategoricalCrossentropy on the whole
logits (the full-head path) in loss, metrics and every variable's gradient, eagerly, in tf.function, under XLA
and under MirroredStrategy on two logical CPU devices; and the head really runs on fewer positions."""


import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY_DEC
from zoo.ops import lm_loss
from zoo.ops.lm_loss import chunked_lm_loss, trained_chunk, trained_first

VOCAB, BATCH, SEQ = 97, 3, 24


def chat_batch(seed=0):
    """Token ids, labels and SFT weights (recipes.sft_data: the assistant mask scaled to a mean over the
    batch's trained tokens): one answer late in row 0, two turns in row 1, row 2 nothing trained (a long
    prompt cut by the length), padding after each; 12 of 72 positions trained."""
    rng = np.random.default_rng(seed)
    x = {"token_ids": rng.integers(0, VOCAB, (BATCH, SEQ)).astype("int32"),
         "padding_mask": np.ones((BATCH, SEQ), "int32")}
    x["padding_mask"][0, 20:] = x["padding_mask"][1, 16:] = 0
    mask = np.zeros((BATCH, SEQ), "float32")
    mask[0, 14:20] = 1
    mask[1, 3:6] = mask[1, 12:15] = 1
    y = rng.integers(0, VOCAB, (BATCH, SEQ)).astype("int32")
    return x, y, mask * mask.size / mask.sum()


def decoder(tied):
    keras.utils.set_random_seed(0)
    return zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, vocab_size=VOCAB, tie_embeddings=tied))


def every_gradient(model, x, loss_fn):
    """The loss of `loss_fn(hidden)` and its gradient w.r.t. every trainable variable of the model (eagerly)."""
    with tf.GradientTape() as tape:
        loss = loss_fn(model.backbone(x)["sequence_output"])
    grads = tape.gradient(loss, model.trainable_variables)
    return float(loss), [np.zeros(v.shape) if g is None else tf.convert_to_tensor(g).numpy() for g, v in
                         zip(grads, model.trainable_variables)]


def full_head_loss(model, y, w):
    return lambda h: keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model.lm_logits(h), w)


@pytest.mark.parametrize("tied", [True, False])
def test_loss_and_every_gradient_equal_the_full_head(tied):
    model = decoder(tied)
    x, y, w = chat_batch()
    full = every_gradient(model, x, full_head_loss(model, y, w))
    got = every_gradient(model, x, lambda h: chunked_lm_loss(h, model.lm_logits, y, 8, w))
    assert got[0] == pytest.approx(full[0], rel=1e-6)
    scale = max(np.abs(g).max() for g in full[1])  # key biases' gradients are ~0 noise (docs/design-notes.md)
    assert np.abs(full[1][-1]).max() > 0  # the last block's and (untied) the head's variables get a gradient
    for v, ref, grad in zip(model.trainable_variables, full[1], got[1]):
        np.testing.assert_allclose(grad, ref, rtol=0, atol=1e-6 * scale, err_msg=v.path)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_tf_function_and_xla(jit_compile):
    """The loss's own gradients (d hidden, d head: the rest of the model's follow from d hidden) in a
    tf.function, with and without XLA, on the decoder's untied head."""
    model = decoder(False)
    x, y, w = chat_batch()
    hidden = model.backbone(x)["sequence_output"]
    head = model.backbone.token_embedding.reverse_embeddings

    def gradients(loss_fn):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = loss_fn(hidden)
        return loss, tape.gradient(loss, [hidden, head])

    full = gradients(full_head_loss(model, y, w))
    loss, grads = tf.function(lambda: gradients(lambda h: chunked_lm_loss(h, model.lm_logits, y, 8, w)),
                              jit_compile=jit_compile)()
    assert float(loss) == pytest.approx(float(full[0]), rel=1e-6)
    for ref, got in zip(full[1], grads):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=0, atol=1e-6 * np.abs(ref.numpy()).max())


def counting_head(model):
    """The model's head, and variables that count the positions it computes and its calls when the step runs."""
    computed, calls = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)

    def head(h):
        calls.assign_add(tf.cast(tf.reduce_prod(tf.shape(h)[:-1]) > 0, tf.int64))  # not the variables' probe
        computed.assign_add(tf.cast(tf.reduce_prod(tf.shape(h)[:-1]), tf.int64))
        return model.lm_logits(h)

    return head, computed, calls


def test_the_head_runs_only_on_the_chunks_that_hold_trained_positions(monkeypatch):
    """12 trained of 72: trained-first in chunks of 3 positions a row (SEQ / 8), the head runs on 2 chunks
    (18 positions), not 72; every chunk again with trained_only=False."""
    monkeypatch.setattr(lm_loss, "HEAD_CALL_POSITIONS", 0)  # the fine chunks whatever a head call costs
    model = decoder(True)
    x, y, w = chat_batch()
    hidden = model.backbone(x)["sequence_output"]
    head, computed, _ = counting_head(model)
    for trained_only, expected in ((True, 2 * BATCH * trained_chunk(SEQ, 8)), (False, BATCH * SEQ)):
        computed.assign(0)
        tf.function(lambda h, t=trained_only: chunked_lm_loss(h, head, y, 8, w, trained_only=t))(hidden)
        assert int(computed.numpy()) == expected, (trained_only, int(computed.numpy()))
    order, rank, count = (t.numpy() for t in trained_first(w))
    assert count == 12 and np.array_equal(order[rank], np.arange(BATCH * SEQ))
    assert np.all(w.reshape(-1)[order[:count]] > 0) and not np.any(w.reshape(-1)[order[count:]])


@pytest.mark.parametrize("trained, call_positions, expected", [
    ("all", 128, (BATCH * SEQ, 3)), ("most", 128, (BATCH * 16, 2)), ("few", 128, (BATCH * 8, 1)),
    ("few", 2, (BATCH * 6, 2))])
def test_trained_only_never_calls_the_head_more_than_every_position(monkeypatch, trained, call_positions, expected):
    """Where most positions are trained, the fine chunks (3 a row) would call the head more often than the
    every-position loss (chunks of 8): the coarse chunks are taken then, and the fine ones where a batch trains
    few positions (each call weighed as HEAD_CALL_POSITIONS positions). Same loss either way."""
    monkeypatch.setattr(lm_loss, "HEAD_CALL_POSITIONS", call_positions)
    model = decoder(True)
    x, y, w = chat_batch()
    w = {"all": np.ones_like(w), "most": np.where(np.arange(SEQ) < 16, 1.0, 0.0) * np.ones_like(w), "few": w}[trained]
    hidden = model.backbone(x)["sequence_output"]
    head, positions, calls = counting_head(model)
    figures = {}
    for trained_only in (False, True):
        positions.assign(0), calls.assign(0)
        loss = tf.function(lambda h, t=trained_only: chunked_lm_loss(h, head, y, 8, w, trained_only=t))(hidden)
        figures[trained_only] = float(loss), int(positions.numpy()), int(calls.numpy())
    (every_loss, every_positions, every_calls), (loss, got_positions, got_calls) = figures[False], figures[True]
    assert loss == pytest.approx(every_loss, rel=1e-6)
    assert (every_positions, every_calls) == (BATCH * SEQ, 3)
    assert (got_positions, got_calls) == expected


def test_the_models_steps_give_the_full_heads_loss_metrics_and_update():
    """`evaluate` and `train_on_batch` with the SFT weights (DecoderCausalLM's chunked loss, trained positions
    only, metrics updated inside the chunks' conds) give Keras' figures on the whole logits, and the SGD update
    of the full head's gradients."""
    model = decoder(False)
    x, y, w = chat_batch(1)
    logits = model(x)["logits"]
    y[:, ::2] = np.argmax(logits.numpy(), axis=-1)[:, ::2]  # accuracy about one half
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(y, logits, w)
    loss, grads = every_gradient(model, x, full_head_loss(model, y, w))
    expected = [v.numpy() - 0.5 * g for v, g in zip(model.trainable_variables, grads)]
    model.set_loss_chunk(8)
    model.compile(optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert model.loss_from_backbone() and model.loss_trained_only
    for figures in (model.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True),
                    model.train_on_batch(x, y, sample_weight=w, return_dict=True)):
        assert figures["loss"] == pytest.approx(loss, rel=1e-6)
        assert figures["accuracy"] == pytest.approx(float(accuracy.result()), abs=1e-7) and figures["accuracy"] > 0
    for v, ref in zip(model.trainable_variables, expected):
        np.testing.assert_allclose(v.numpy(), ref, rtol=0, atol=1e-6, err_msg=v.path)


def test_bad_input():
    model = decoder(True)
    x, y, w = chat_batch()
    hidden = model.backbone(x)["sequence_output"]
    with pytest.raises(ValueError, match=r"sample_weight must be \[B, S\] like the labels.*got \(3, 23\)"):
        chunked_lm_loss(hidden, model.lm_logits, y, sample_weight=w[:, 1:])
    with pytest.raises(ValueError, match="trained_only must be True or False"):
        model.set_loss_chunk(None, trained_only="yes")


def mirrored_report(strategy) -> dict:
    """Two replicas whose halves of the batch hold different numbers of trained positions (each replica skips
    its own chunks) against the full head on the whole batch: run by tests/recipes/distribute_child.py under its
    MirroredStrategy on two logical CPUs (a second strategy in that process would clash with its collectives);
    tests/recipes/test_distribute.py asserts the summed loss and gradients are equal."""
    keras.utils.set_random_seed(0)
    head = keras.layers.Dense(VOCAB, use_bias=False)
    head.build((None, None, 16))
    rng = np.random.default_rng(0)
    hidden = tf.constant(rng.standard_normal((4, SEQ, 16)).astype("float32"))
    _, y, _ = chat_batch()
    y = np.concatenate([y, y[:1]])
    w = np.zeros((4, SEQ), "float32")
    w[0, 5:9] = w[1, 20:] = w[2, 1:2] = 1  # replica 0: 8 trained, replica 1: 1
    w *= w.size / w.sum()

    def grads(loss_fn, h, y, w):
        with tf.GradientTape() as tape:
            tape.watch(h)
            loss = loss_fn(h, y, w)
        return loss, tape.gradient(loss, [h, head.kernel])

    full = grads(lambda h, y, w: keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, head(h), w),
                 hidden, y, w)
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((hidden, y, w)).unbatch().batch(4))

    @tf.function
    def step(batch):
        def replica(h, y, w):
            return grads(lambda h, y, w: chunked_lm_loss(h, head, y, None, w), h, y, w)

        per = strategy.run(replica, args=batch)
        loss, (d_h, d_kernel) = per
        return (strategy.reduce("SUM", loss, None), tf.concat(strategy.experimental_local_results(d_h), 0),
                strategy.reduce("SUM", d_kernel, None))

    loss, d_h, d_kernel = step(next(iter(data)))
    difference = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in ((d_h, full[1][0]), (d_kernel, full[1][1])))
    scale = max(float(tf.reduce_max(tf.abs(g))) for g in full[1])
    return {"loss": float(loss), "full_loss": float(full[0]), "gradient_difference": difference,
            "gradient_scale": scale}
