"""Under `full` recomputation a model's like blocks train through one traced block (zoo.layers.shared_replay): the
gradients are those of each block traced into the step, and the step's graph no longer grows with depth."""

import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import TINY_DEC
from zoo.layers.shared_replay import SharedReplays

IDS = np.random.default_rng(0).integers(0, 128, (2, 24)).astype("int32")
MASK = np.ones_like(IDS)
MASK[1, 20:] = 0


def loss_gradients(model):
    """(the gradients of a loss of the logits, the number of ops in the traced step)."""

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model({"token_ids": IDS, "padding_mask": MASK}, training=True)["logits"]
            loss = tf.reduce_mean(tf.square(logits))
        return tape.gradient(loss, model.trainable_variables)

    gradients = [g.numpy() for g in step()]
    return gradients, len(step.get_concrete_function().graph.get_operations())


def each_block_traced_in(model):
    assert model.set_shared_blocks(False) is False and not model.shared_blocks


@pytest.mark.parametrize("name,setting", [("llama3.2-3b", "float32"), ("llama3.2-3b", "qlora"),
                                          ("gemma3-1b", "float32")])  # Gemma 3: a local and a global block
def test_shared_blocks_give_each_traced_blocks_gradients(name, setting):
    qlora = setting == "qlora"
    model = zoo.get(name, checkpointing="full", dtype="mixed_bfloat16" if qlora else "float32",
                    quantize="int4" if qlora else None, **TINY_DEC)
    if qlora:
        zoo.lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
        # LoRA's B starts at zero, and with it the A's gradient: move it, so that every adapter's gradient is tested
        for v in model.trainable_variables:
            v.assign(np.random.default_rng(1).normal(0, 0.05, v.shape).astype(v.dtype))
    assert not model.shared_blocks and model.set_shared_blocks(True) and model.shared_blocks  # off by default
    shared, shared_ops = loss_gradients(model)
    each_block_traced_in(model)
    traced, traced_ops = loss_gradients(model)
    assert len(shared) == len(model.trainable_variables) > 0
    for got, want, v in zip(shared, traced, model.trainable_variables):
        assert np.abs(want).max() > 0, v.path
        # float32: ~3e-7 of the largest entry (the same ops, scheduled apart); bfloat16 compute: within one step
        np.testing.assert_allclose(got, want, rtol=0, atol=(1e-5 if not qlora else 1e-2) * np.abs(want).max(),
                                   err_msg=v.path)
    assert shared_ops < traced_ops / 4  # 2 blocks: ~170 ops shared against ~1,900 traced in (float32)


def test_the_step_graph_does_not_grow_a_block_copy_per_layer():
    ops = {}
    for layers in (2, 4):
        model = zoo.get("llama3.2-3b", checkpointing="full", **dict(TINY_DEC, num_layers=layers))
        model.set_shared_blocks(True)
        ops[layers], ops[layers, "traced in"] = loss_gradients(model)[1], None
        each_block_traced_in(model)
        ops[layers, "traced in"] = loss_gradients(model)[1]
    per_block_traced = (ops[4, "traced in"] - ops[2, "traced in"]) / 2  # ~890 ops: a block's forward and backward
    per_block_shared = (ops[4] - ops[2]) / 2  # ~30: reading its variables and calling the one function
    assert per_block_shared < per_block_traced / 10, ops


def test_blocks_with_dropout_are_traced_in_as_before(monkeypatch):
    calls = []
    monkeypatch.setattr(SharedReplays, "__call__", lambda *args: calls.append(args))
    model = zoo.get("enc-base", checkpointing="full", **dict(TINY_DEC, num_kv_heads=4))
    model.set_shared_blocks(True)
    assert model.spec.dropout > 0  # its masks are drawn per block and call: not one function's inputs (yet)
    tf.function(lambda: model({"token_ids": IDS, "padding_mask": MASK}, training=True))()
    assert calls == []


def test_a_long_sequences_mlp_in_chunks_is_traced_in(monkeypatch):
    """The MLP in chunks (zoo.ops.position_chunks) differentiates the variables it reads; a shared block passes them
    in as values, so a block whose replay would chunk its MLP is traced in as before, and its adapters still train."""
    from zoo.ops import position_chunks

    monkeypatch.setattr(position_chunks, "CHUNK_BYTES", 8 * 4 * 128)  # 8 positions of the intermediate 128 a chunk
    model = zoo.get("llama3.2-3b", checkpointing="full", dtype="mixed_bfloat16", quantize="int4", **TINY_DEC)
    zoo.lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
    for v in model.trainable_variables:
        v.assign(np.random.default_rng(1).normal(0, 0.05, v.shape).astype(v.dtype))
    calls = []
    monkeypatch.setattr(SharedReplays, "__call__", lambda *args: calls.append(args))
    model.set_shared_blocks(True)
    gradients, _ = loss_gradients(model)
    assert calls == [] and all(np.abs(g).max() > 0 for g in gradients)
