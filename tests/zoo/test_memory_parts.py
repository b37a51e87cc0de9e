"""The planner's parts (zoo.memory.parts), one at a time: each pinned to bytes worked out by hand for the
small decoder of test_memory.py, and `estimate` shown to be exactly their fields put together."""

import dataclasses

import pytest

from tests.zoo.test_memory import DEC, B, S
from zoo import memory
from zoo.memory import parts
from zoo.memory.lora import plan

# DEC: 2 layers, h 64, 4 heads of 16, 2 KV heads (k, v: 64 -> 32), SwiGLU 128, vocabulary 100, tied head, no dropout.
PARAMS = 80_448  # test_memory.py: test_small_spec_parameter_counts_by_hand
BLOCK = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # q, o; k, v; gate, up, down; two RMSNorms: 36,992
LARGEST = 64 * 128  # a feed-forward kernel: 8,192 > the embedding's 100 x 64
SBH = S * B * 64  # 2,048
# One layer's activations in float32 (twice Korthikanti's 16-bit bytes): 34·s·b·h, SwiGLU's third ffn-wide
# tensor (s·b·128 x 2 bytes), and the plain core's 5·a·s/h = 5 per s·b·h.
LAYER = 2 * (34 * SBH + S * B * 128 * 2 + 5 * SBH)  # 176,128


def step(**changes):
    return parts.Step(**{"spec": DEC, "task": "causal_lm", "batch": B, "sequence_length": S, "policy": "full",
                         **changes})


def test_each_part_by_hand():
    """Float32 weights, AdamW, "full" recomputation with the plain core, two replicas."""
    full = step(replicas=2)
    assert parts.weights(full) == {"weights": PARAMS * 4}
    assert parts.optimizer_state(full) == {"optimizer": 2 * PARAMS * 4}  # two float32 moments
    assert parts.gradients(full) == {"gradients": PARAMS * 4, "head_gradient": LARGEST * 4}
    saved_extra = 58 * SBH  # TensorFlow's float32 copies beyond the formula, one block's under "full" (SAVED_EXTRA)
    assert parts.activations(full) == {
        "activations": 2 * (2 * SBH * 2) + LAYER,  # each block's input (2 bytes x 2 in float32), one block replayed
        "saved_extra": saved_extra, "replay": LAYER, "recompute": LAYER + saved_extra}
    assert parts.loss(full) == {"logits": 3 * B * S * 100 * 4}  # logits, softmax, gradient; one chunk of 16
    assert parts.workspace(full) == {"update": 2 * LARGEST * 4, "block_update": 0, "transient": 0,
                                     "reduce_buffer": PARAMS * 4, "block_reduce": 0}  # every gradient, packed


def test_a_long_sequence_replays_its_mlp_a_chunk_at_a_time(monkeypatch):
    """Past zoo.ops.position_chunks' cap, the replayed block's MLP (the formula's 16·s·b·h and SwiGLU's third
    tensor) is counted at a chunk's positions: here a cap of 4 positions of the 128-wide MLP per row, so 16
    positions replay in 4 chunks of 4; nothing else changes, and `none` keeps every layer's whole."""
    from zoo.ops import position_chunks

    whole = {policy: parts.activations(step(policy=policy)) for policy in ("full", "none")}
    monkeypatch.setattr(position_chunks, "CHUNK_BYTES", 4 * 4 * 128)
    chunked = {policy: parts.activations(step(policy=policy)) for policy in ("full", "none")}
    mlp = 2 * (16 * 64 + 2 * 128) * B  # float32 bytes a position: 2,560 x B
    assert whole["full"]["replay"] - chunked["full"]["replay"] == (S - 4) * mlp
    assert whole["full"]["activations"] - chunked["full"]["activations"] == (S - 4) * mlp
    assert chunked["none"] == whole["none"]


def test_fused_parts_by_hand():
    """The update inside the backward pass: one block's gradients alive, reduced and updated at a time."""
    fused = step(fused=True, replicas=2)
    outer = PARAMS - 2 * BLOCK  # the embedding and the final norm: 6,464
    assert parts.gradients(fused) == {"gradients": (outer + BLOCK) * 4, "head_gradient": LARGEST * 4}
    assert parts.workspace(fused) == {"update": 2 * LARGEST * 4, "block_update": 2 * LARGEST * 4, "transient": 0,
                                      "reduce_buffer": outer * 4, "block_reduce": BLOCK * 4}


def test_lora_parts_by_hand():
    """r4 on q_proj and v_proj (PEFT's default for Llama) over a float base: only the adapters train."""
    lora = step(lora=plan(DEC, "causal_lm", 4))
    adapters = 2 * (64 * 4 + 4 * 64 + 64 * 4 + 4 * 32)  # A [in, 4] and B [4, out] of q and v in 2 layers: 1,792
    assert parts.weights(lora) == {"weights": (PARAMS + adapters) * 4}
    assert parts.optimizer_state(lora) == {"optimizer": 2 * adapters * 4}
    assert parts.gradients(lora) == {"gradients": adapters * 4, "head_gradient": 64 * 4 * 4}
    assert parts.loss(lora) == {"logits": 2 * B * S * 100 * 4}  # a frozen head: no gradient of the logits waits
    assert parts.workspace(lora) == {"update": 2 * 64 * 4 * 4, "block_update": 0, "reduce_buffer": 0,
                                     "block_reduce": 0, "transient": 64 * 64 * 8}  # q's W + s·A·B and its gradient


@pytest.mark.parametrize("changes, arguments", [
    ({"replicas": 2}, {"checkpointing": "full", "replicas": 2}),
    ({"fused": True, "replicas": 2}, {"checkpointing": "full+fused", "replicas": 2}),
    ({"lora": plan(DEC, "causal_lm", 4)}, {"checkpointing": "full", "lora_rank": 4}),
], ids=["full", "fused", "lora"])
def test_the_estimate_is_its_parts_put_together(changes, arguments):
    """Every `MemoryEstimate` field but `fused` comes from exactly one part, with the value that part gives."""
    by_part = [part(step(**changes)) for part in parts.PARTS]
    fields = [field for found in by_part for field in found]
    assert sorted(fields) == sorted(f.name for f in dataclasses.fields(memory.MemoryEstimate) if f.name != "fused")
    e = memory.estimate(DEC, B, S, "float32", attention="plain", **arguments)
    assert {field: getattr(e, field) for field in fields} == {k: v for found in by_part for k, v in found.items()}
