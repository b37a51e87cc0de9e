"""zoo.ops.ordering.residual: the residual connection kept an add of two.

Where the summand is itself a sum read by nothing else (a LoRA projection on a quantized base returns base + s·A·B),
Grappler's arithmetic optimizer merges the two adds into an AddN of three, and its memory optimizer then turns a
float32 AddN it finds live at its estimated peak into an accumulator whose zeros constant folding keeps as a graph
constant of the block's output size for as long as the traced step exists (measured at dec-base's shape, 16 x 256,
float32, LoRA on int4: 9.6 MiB a block still allocated after the first step, 4.5 MiB in all with `residual`;
docs/grpo.md). The memory optimizer only acts where its static estimate passes 0.8 x the machine's free RAM, which
tiny shapes never do, so what is tested here is the mechanism: the summand has a second reader, the values and
gradients are exact, and every block adds through it."""

import keras
import numpy as np
import tensorflow as tf

import zoo
from tests.common import TINY_DEC
from zoo.layers import block
from zoo.ops.ordering import residual


def test_the_summand_keeps_a_second_reader_and_the_sum_is_exact():
    x, a, b = (tf.constant(np.random.default_rng(i).normal(size=(2, 8, 4)), tf.float32) for i in range(3))

    @tf.function
    def step(x, a, b):
        with tf.GradientTape() as tape:
            tape.watch([x, a, b])
            out = residual(x, a + 0.5 * b)
            loss = tf.reduce_sum(out * 3.0)
        return out, tape.gradient(loss, [x, a, b])

    out, grads = step(x, a, b)
    np.testing.assert_array_equal(out, x + (a + 0.5 * b))
    for g, scale in zip(grads, (3.0, 3.0, 1.5)):
        np.testing.assert_array_equal(g, np.full((2, 8, 4), scale, "float32"))

    graph = step.get_concrete_function(x, a, b).graph
    summand = next(op for op in graph.get_operations() if op.type == "AddV2" and op.inputs[1].op.type == "Mul")
    readers = [op for op in graph.get_operations() if any(t is summand.outputs[0] for t in op.inputs)]
    assert len(readers) == 2, [op.name for op in readers]  # the residual add, and the zero's read of its first element


def test_a_summand_that_is_not_an_add_is_read_once():
    """Nothing can merge with a matmul's output, so `residual` adds no read there."""
    x, w = tf.ones((2, 4)), tf.ones((4, 4))

    @tf.function
    def step(x, w):
        return residual(x, tf.matmul(x, w))

    np.testing.assert_array_equal(step(x, w), np.full((2, 4), 5.0, "float32"))
    graph = step.get_concrete_function(x, w).graph
    product = next(op for op in graph.get_operations() if op.type == "MatMul")
    readers = [op for op in graph.get_operations() if any(t is product.outputs[0] for t in op.inputs)]
    assert [op.type for op in readers] == ["AddV2"], [op.name for op in readers]


def test_every_block_adds_its_two_branches_through_residual(monkeypatch):
    calls = []

    def counted(x, h):
        calls.append(h.shape)
        return residual(x, h)

    monkeypatch.setattr(block, "residual", counted)
    keras.utils.set_random_seed(0)
    encoder = {k: v for k, v in TINY_DEC.items() if k != "num_kv_heads"}
    for name, spec in (("dec-base", TINY_DEC), ("enc-base", encoder)):
        calls.clear()
        model = zoo.get(name, checkpointing="full", **spec)
        x = {"token_ids": tf.zeros((2, 8), "int32"), "padding_mask": tf.ones((2, 8), "int32")}
        if name == "enc-base":
            x["segment_ids"] = tf.zeros((2, 8), "int32")
        getattr(model, "backbone", model)(x, training=True)
        assert len(calls) == 2 * spec["num_layers"], (name, calls)
