"""Packed rows (`ZooModel.set_packed`): several whole examples one after another in a row, the
padding mask holding document numbers (0 = padding). A packed example trains exactly as it does
alone in its own row, leaves the other examples of its row untouched, and the chunked core skips
the tiles wholly across documents; packing off leaves every graph as it was."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY_DEC
from tests.zoo.test_recompute import assert_same
from tests.zoo.test_sliding_window import TileCounter
from zoo.memory.estimate import estimate
from zoo.ops.attention_core import chunked_attention, document_spans, plain_attention, tile_count

LENGTHS = ((5, 3, 6), (9, 7))  # each packed row's examples; row 0 ends in 2 positions of padding
SEQ = 16
CHUNK = 4  # 16 positions: 4 x 4 tiles, of which documents leave some wholly across two of them


def documents():
    rows = [np.concatenate([np.full(n, d + 1) for d, n in enumerate(row)]) for row in LENGTHS]
    return np.stack([np.pad(r, (0, SEQ - len(r))) for r in rows]).astype("int32")


def examples(seed=0):
    """Every example's tokens, in packing order."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, TINY_DEC["vocab_size"], n).astype("int32") for row in LENGTHS for n in row]


def packed(tokens):
    """(inputs, labels, weights) of the packed rows: each token predicts the next one of its own example."""
    ids, labels, weights, it = np.zeros((2, SEQ), "int32"), np.zeros((2, SEQ), "int32"), np.zeros((2, SEQ)), 0
    for r, row in enumerate(LENGTHS):
        start = 0
        for n in row:
            ids[r, start:start + n], labels[r, start:start + n - 1] = tokens[it], tokens[it][1:]
            weights[r, start:start + n - 1] = 1
            start, it = start + n, it + 1
    return {"token_ids": ids, "padding_mask": documents()}, labels, weights


def one_per_row(tokens):
    """The same examples unpacked: one per row, padded to the longest, with a 0/1 padding mask."""
    longest = max(len(t) for t in tokens)
    ids, labels, weights = (np.zeros((len(tokens), longest), dtype) for dtype in ("int32", "int32", "float64"))
    for r, t in enumerate(tokens):
        ids[r, :len(t)], labels[r, :len(t) - 1], weights[r, :len(t) - 1] = t, t[1:], 1
    return {"token_ids": ids, "padding_mask": (np.arange(longest) < np.array([len(t) for t in tokens])[:, None])
            .astype("int32")}, labels, weights


def build(policy="none", dropout=0.0, core="plain", pack=True, name="dec-base", **changes):
    keras.utils.set_random_seed(0)  # the same weights and dropout seeds for every variant
    model = zoo.get(name, task="causal_lm", checkpointing=policy, **dict(TINY_DEC, dropout=dropout, **changes))
    model.set_attention(core, chunk_size=CHUNK)  # the plain core draws its dropout by the same tiles
    model.set_packed(pack)
    return model


def gradients(model, data, traced=False):
    """{variable path: gradient} of the summed per-token causal-LM loss over the real tokens (`traced`:
    in a tf.function, where graph ordering decides when held dropout masks are read)."""

    def step(x, labels, weights):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)["logits"]
            per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            loss = tf.reduce_sum(per * tf.cast(weights, tf.float32))
        return tape.gradient(loss, model.trainable_variables)

    grads = (tf.function(step) if traced else step)(*data)
    return {v.path: tf.convert_to_tensor(g).numpy() for v, g in zip(model.trainable_variables, grads)}


@pytest.fixture(scope="module")
def unpacked_gradients():
    """The reference both policies are held to: the examples one per row, unpacked (computed once)."""
    return gradients(build("none", pack=False), one_per_row(examples()))


@pytest.mark.parametrize("policy", ["none", "full"])
def test_packed_gradients_equal_one_example_per_row(policy, unpacked_gradients):
    """Exact formulations only: dropout draws its masks by layout (two 16-wide rows and five 9-wide ones
    draw different bits), so a packed row cannot equal the unpacked batch with dropout on. Without
    dropout it must, to float32 rounding, for every trainable variable. With dropout 0.1 the packed
    row's `full` gradients (the block replayed from its input, the document numbers captured in the
    replay's closure, the masks held) must equal its `none` ones: the same draws, the same layout."""
    tokens = examples()
    assert_same(unpacked_gradients, gradients(build(policy), packed(tokens)), rtol=1e-5)
    if policy == "full":  # dropout on: packed "full" against packed "none" (the chunked core: below, alone)
        kept = gradients(build("none", dropout=0.1), packed(tokens), traced=True)
        assert_same(kept, gradients(build("full", dropout=0.1), packed(tokens), traced=True), rtol=1e-5)


def test_fused_update_trains_packed_rows_as_full_does():
    """The fused update replays each block with the step's padding mask (zoo.training.fused): one SGD step
    on packed rows, dropout on, leaves the weights where Keras' own step under `full` does."""
    x, labels, weights = packed(examples())
    trained = []
    for fused in (False, True):
        model = build("full", dropout=0.1)
        model.set_fused_update(fused)
        model.compile(optimizer=keras.optimizers.SGD(0.5), run_eagerly=True,
                      loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
        start = [v.numpy() for v in model.trainable_variables]
        data = tf.data.Dataset.from_tensor_slices((x, {"logits": labels}, weights.astype("float32"))).batch(2)
        model.fit(data, epochs=1, verbose=0, shuffle=False)
        trained.append([v.numpy() for v in model.trainable_variables])
    assert any(not np.array_equal(a, b) for a, b in zip(start, trained[0]))
    for a, b in zip(*trained):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_changing_one_example_leaves_the_others_bitwise():
    """In either core (one model, its core switched: the weights stay the same)."""
    model = build()
    tokens = examples()
    x, _, _ = packed(tokens)
    changed = list(tokens)
    changed[1] = (tokens[1] + 7) % TINY_DEC["vocab_size"]  # row 0's second example, positions 5-7
    docs = x["padding_mask"]
    others = (docs != 0) & ~((np.arange(2)[:, None] == 0) & (docs == 2))
    for core in ("plain", "chunked"):
        model.set_attention(core, chunk_size=CHUNK)
        before, after = (model(packed(t)[0])["logits"].numpy() for t in (tokens, changed))
        np.testing.assert_array_equal(before[others], after[others], err_msg=core)
        assert not np.array_equal(before[0, 5:8], after[0, 5:8]), core  # the changed example's logits changed


def qkv(seed, batch=2, length=SEQ, heads=4, kv_heads=2, dim=8):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(batch, length, h, dim)), tf.float32) for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_core_with_documents_equals_plain_and_skips_tiles(monkeypatch, causal):
    """Values and gradients, dropout on (both cores draw per tile), and the tiles computed: fewer than
    without documents, each one the chunked core computes counted (eager: the loops run in Python)."""
    q, k, v = qkv(0)
    docs = tf.constant(documents())
    options = dict(documents=docs, causal=causal, chunk_size=CHUNK, rate=0.2, seed=tf.constant([3, 4]))
    counter = TileCounter(monkeypatch)
    results = []
    for core in (plain_attention, chunked_attention):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = core(q, k, v, **options)
            loss = tf.reduce_sum(out * tf.sin(out))
        results.append([out, *tape.gradient(loss, [q, k, v])])
    for a, b in zip(*results):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=3e-6)
    assert np.abs(results[0][0].numpy()[0, 14:]).max() == 0  # padding outputs zeros
    expected = tile_count(SEQ, SEQ, CHUNK, causal, documents=docs)
    assert counter.count == 2 * expected  # forward and backward: the same tiles
    assert expected < tile_count(SEQ, SEQ, CHUNK, causal)
    # by hand, the key chunks each query chunk needs: causal [0,1) [0,2) [0,3) [2,4) (row 0's third document
    # starts at 8, row 1's second at 9); bidirectional [0,3) [0,3) [0,4) [2,4) (row 1's first ends at 8)
    assert expected == (8 if causal else 12)


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_core_with_documents_traced(jit):
    """Tile bounds from the documents are tensors: in tf.function and XLA the key loops run as while
    loops with bounds read from them, and give what the eager core gives."""
    q, k, v = qkv(1)

    def core(q, k, v, docs):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = chunked_attention(q, k, v, documents=docs, causal=True, chunk_size=CHUNK)
            loss = tf.reduce_sum(out * out)
        return [out, *tape.gradient(loss, [q, k, v])]

    docs = tf.constant(documents())
    for a, b in zip(core(q, k, v, docs), tf.function(core, jit_compile=jit)(q, k, v, docs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)  # XLA fuses differently


def test_document_spans_and_positions():
    rows = [[1, 1, 1, 2, 2, 3, 3, 3, 0, 0], [1, 1, 2, 2, 1, 0, 0, 0, 0, 0]]
    run, first, stop = (t.numpy() for t in document_spans(rows))
    np.testing.assert_array_equal(run[1], [0, 0, 1, 1, 2, 3, 3, 3, 3, 3])  # a number that comes back: a new one
    np.testing.assert_array_equal(np.arange(10) - first[0], [0, 1, 2, 0, 1, 0, 1, 2, 0, 1])
    np.testing.assert_array_equal(stop[0], [3, 3, 3, 5, 5, 8, 8, 8, 10, 10])


@pytest.mark.parametrize("name", ["dec-base", "llama3.2-3b"])  # keras-hub's RotaryEmbedding, its Llama 3 scaling
def test_rotary_positions_restart_at_each_document(monkeypatch, name):
    """Watched where they are made: rotary scores depend on i - j only, so a document's outputs show its
    positions only through rounding (at positions of thousands); restarting keeps them as short as the
    example trained alone, and within a Llama 3 rope-scaled model's pretraining range."""
    from keras_hub.layers import RotaryEmbedding

    seen, call = [], RotaryEmbedding.call

    def watched(self, inputs, start_index=0, positions=None):
        seen.append(None if positions is None else np.asarray(positions))
        return call(self, inputs, start_index=start_index, positions=positions)

    model = build(name=name)
    monkeypatch.setattr(RotaryEmbedding, "call", watched)
    x, _, _ = packed(examples())
    model(x)
    expected = [np.concatenate([np.arange(n) for n in row]) for row in LENGTHS]
    assert len(seen) == 4 and all(p is not None for p in seen)  # queries and keys of both layers, by position
    for positions in seen:
        for row, want in zip(positions, expected):
            np.testing.assert_array_equal(row[:len(want)], want)


def op_types(model, x):
    graph = tf.function(lambda x: model(x)["logits"]).get_concrete_function(
        {k: tf.TensorSpec(v.shape, tf.int32) for k, v in x.items()}).graph
    return sorted(op.type for op in graph.get_operations())


def test_packing_off_leaves_the_graph_as_it_was():
    """A model whose packing was turned on and off again computes, op for op and bit for bit, what one
    that never had it does (0/1 mask with padding); the same model with packing on is another graph."""
    x, _, _ = one_per_row(examples())
    never = build(pack=False, core="auto")
    toggled = build(pack=True, core="auto")
    assert toggled.packed
    on_types = op_types(toggled, x)
    assert toggled.set_packed(False) is False and not toggled.packed
    np.testing.assert_array_equal(never(x)["logits"].numpy(), toggled(x)["logits"].numpy())
    assert op_types(toggled, x) == op_types(never, x) != on_types
    assert "packed" not in str(toggled.get_config())


def test_set_packed_refuses_an_encoder():
    model = zoo.get("enc-base", **dict(TINY_DEC, num_kv_heads=4))
    with pytest.raises(ValueError, match="decoders only"):
        model.set_packed(True)
    assert model.set_packed(False) is False


def test_documents_need_self_attention():
    q, k, v = qkv(0)
    with pytest.raises(ValueError, match="query_offset 0"):
        plain_attention(q[:, :3], k, v, documents=documents(), query_offset=13)


@pytest.mark.parametrize("name, policy, core", [("dec-base", "none", "plain"), ("dec-base", "selective", "chunked"),
                                                ("dec-base", "full", "chunked"), ("gemma3-1b", "full", "plain")])
def test_planner_counts_what_packing_keeps(name, policy, core):
    """The extra terms, exactly (zoo.memory.estimate._packed_bytes): the rotary cos and sin per row,
    [B, S, 1, head_dim] in the compute dtype, one pair per distinct rotary setting (Grappler merges the
    layers' identical ones: dec-base has one, Gemma 3 two, local and global thetas), and three int32
    [B, S] document spans; the same under every policy and core. Encoders are refused."""
    b, s, spec = 4, 256, zoo.spec(name)
    args = dict(precision="mixed_bfloat16", checkpointing=policy, attention=core)
    off, on = estimate(name, b, s, **args), estimate(name, b, s, packed=True, **args)
    assert estimate(name, b, s, packed=False, **args) == off  # the default, unchanged
    settings = 2 if name == "gemma3-1b" else 1
    extra = settings * 2 * b * s * spec.head_dim * 2 + 3 * 4 * b * s
    assert on.activations - off.activations == extra
    assert on.backward_peak - off.backward_peak == extra  # the total rises by it where that phase is the peak
    assert off.total <= on.total <= off.total + extra
    with pytest.raises(ValueError, match="decoders only"):
        estimate("enc-base", b, s, packed=True)


def test_zoo_plan_prints_a_packed_run(capsys):
    """`zoo plan --packing` plans the packed step (estimate(packed=True)) and says so."""
    from zoo.cli import main

    # Gemma 3's two rotary settings of head_dim 256 at 8 x 4096: 64 MiB more, visible in the table
    args = ["plan", "gemma3-1b", "--batch-size", "8", "--sequence-length", "4096", "--checkpointing", "full",
            "--precision", "mixed_bfloat16"]
    rows = {}
    for packing in (False, True):
        assert main(args + ["--packing"] * packing) == 0
        out = capsys.readouterr().out
        assert ("packed rows" in out) == packing
        rows[packing] = next(line for line in out.splitlines() if line.startswith("full "))
    expected = estimate("gemma3-1b", 8, 4096, "mixed_bfloat16", "full", packed=True).total
    assert f"{expected / 2**30:8.2f}G" in rows[True] and rows[True] != rows[False]
