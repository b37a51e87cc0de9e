"""The planner with LoRA and a quantized frozen base (zoo.memory.lora), pinned to bytes worked out
by hand for the small decoder of test_memory.py, and the frozen base's stored size checked
against the variables Keras' Model.quantize actually creates."""

import numpy as np
import pytest

import zoo
from tests.zoo.test_memory import DEC, B, S
from zoo import memory, quantization
from zoo.cli import main
from zoo.memory.lora import plan

# DEC: 2 layers, h 64, 4 heads of 16, 2 KV heads (k, v: 64 -> 32), SwiGLU 128, vocabulary 100, tied head.
PARAMS = 80_448
# r4 on q_proj (A 64x4, B 4x64) and v_proj (A 64x4, B 4x32), in 2 layers, float32
ADAPTERS = 2 * (64 * 4 + 4 * 64 + 64 * 4 + 4 * 32) * 4  # 7,168
# int8: int8 values + a float32 scale per output (per row for the embedding)
INT8 = (100 * 64 + 100 * 4  # embedding
        + 2 * (2 * (64 * 64 + 64 * 4) + 2 * (64 * 32 + 32 * 4) + 2 * (64 * 128 + 128 * 4) + 128 * 64 + 64 * 4
               + 2 * 64 * 4)  # q, o; k, v; up, gate; down; two float norms
        + 64 * 4)  # final norm: 85,904
# int4: two values a byte, per block of 128 inputs a float32 scale and an int8 zero point, float32 g_idx per input;
# the embedding (the tied head's table) stays int8 (zoo.checks.TABLE_MODE)
INT4 = (100 * 64 + 100 * 4  # embedding
        + 2 * (2 * (64 * 32 + 64 * 5 + 64 * 4) + 2 * (64 * 16 + 32 * 5 + 64 * 4) + 2 * (64 * 64 + 128 * 5 + 64 * 4)
               + 128 * 32 + 64 * 5 + 128 * 4 + 2 * 64 * 4)
        + 64 * 4)  # 54,160


@pytest.mark.parametrize("quantize, frozen, transient", [
    (None, PARAMS * 4, 64 * 64 * 8),  # float: W + s.A.B merged and x^T.dy, float32, of the largest target (q)
    ("int8", INT8, 128 * 64 * 5),  # every quantized Dense casts its kernel; the largest is the SwiGLU's
    ("int4", INT4, 128 * 64 * 9),
])
def test_lora_estimate_by_hand(quantize, frozen, transient):
    assert (INT8, INT4) == (85_904, 54_160)
    e = memory.estimate(DEC, B, S, "float32", "full", lora_rank=4, lora_targets=["q_proj", "v_proj"],
                        quantize=quantize)
    full = memory.estimate(DEC, B, S, "float32", "full")
    assert e.weights == frozen + ADAPTERS
    assert e.gradients == ADAPTERS  # none for the frozen base
    assert e.optimizer == 2 * ADAPTERS  # Adam's two moments of the adapters only
    assert e.head_gradient == 64 * 4 * 4 and e.update == 2 * 64 * 4 * 4  # the largest adapter
    assert e.transient == transient
    # activations and recomputation do not change; the frozen head's loss holds two [B, c, vocab] copies, not three
    assert (e.activations, e.recompute) == (full.activations, full.recompute)
    # ... beside the slice of the tied head's int8 table its logits matmul casts (zoo.ops.quantized_head: here all 100
    # rows fit one slice) in float32
    head = 100 * 64 * 4 if quantize else 0
    assert (e.logits, full.logits) == (2 * B * S * 100 * 4 + head, 3 * B * S * 100 * 4)
    assert e.total == e.weights + e.optimizer + max(e.backward_peak, e.update_peak)
    loss, replay = e.logits + e.head_gradient, full.replay  # gone before the first block is replayed
    assert e.backward_peak == full.activations - replay + max(loss, replay) + full.saved_extra + transient


def test_default_targets_and_a_new_classifier():
    default = plan(DEC, "causal_lm", 4)
    assert default == plan(DEC, "causal_lm", 4, ["q_proj", "v_proj"])  # PEFT's default for Llama
    assert len(plan(DEC, "causal_lm", 4, "all-linear").adapter_shapes) == 2 * 7 * 2
    enc = zoo.spec("enc-base").replace(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128,
                                       vocab_size=100, max_sequence_length=64)
    clf = plan(enc, "classifier", 4, quantize="int8")
    assert clf.head_shapes == [(64, 2), (2,)]  # trained in full, float, never quantized
    e = memory.estimate(enc, B, S, "float32", "none", task="classifier", lora_rank=4, quantize="int8")
    assert e.gradients == 2 * (64 * 4 + 4 * 64) * 2 * 4 + (64 * 2 + 2) * 4  # query, value adapters + the head


def stored_bytes(model):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.variables
               if "seed_generator" not in v.path)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_frozen_bytes_are_what_keras_stores(quantize):
    model = zoo.get(DEC, task="causal_lm")
    quantization.quantize_base(model, quantize)
    assert stored_bytes(model) == plan(DEC, "causal_lm", 4, quantize=quantize).frozen


def test_cli_plan_with_lora_and_refusals(capsys):
    assert main(["plan", "dec-1b", "--batch-size", "8", "--sequence-length", "512", "--precision", "mixed_bfloat16",
                 "--lora-rank", "16", "--lora-targets", "all-linear", "--quantize", "int4", "--budget", "24GiB"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "LoRA r16 on all-linear, int4 base" in out[0]
    e = memory.estimate("dec-1b", 8, 512, "mixed_bfloat16", "full", lora_rank=16, lora_targets="all-linear",
                        quantize="int4")
    rows = {line.split()[0]: line.split() for line in out[2:-2]}
    assert list(rows) == ["none", "selective", "full"]  # no fused configuration with LoRA
    assert rows["full"][-2] == f"{e.total / memory.GiB:.2f}G"
    with pytest.raises(ValueError, match="trains nothing without LoRA"):
        memory.estimate(DEC, B, S, quantize="int8")
    with pytest.raises(ValueError, match="lora_rank must be a positive whole number, got 0"):
        memory.estimate(DEC, B, S, lora_rank=0)
    with pytest.raises(ValueError, match="fused update is not combined with LoRA"):
        memory.estimate(DEC, B, S, checkpointing="full+fused", lora_rank=4)


def test_a_bfloat16_frozen_base_is_planned_and_only_with_lora():
    """Pure bfloat16 stores a frozen LoRA base at 2 bytes and rounds nothing into it (the adapters are
    float32); without LoRA the same precision would train bfloat16 weights to nearest, and is refused."""
    import recipes

    frozen = memory.estimate(DEC, B, S, "bfloat16", "full", task="causal_lm", lora_rank=4)
    floats = memory.estimate(DEC, B, S, "mixed_bfloat16", "full", task="causal_lm", lora_rank=4)
    assert frozen.weights < floats.weights
    with pytest.raises(ValueError, match="weights_dtype='bfloat16'"):
        memory.estimate(DEC, B, S, "bfloat16", "full", task="causal_lm")
    assert zoo.checks.weights("float32", "bfloat16", frozen=True) == ("bfloat16", None)  # what a LoRA recipe asks
    with pytest.raises(ValueError, match="weights_dtype='bfloat16'"):
        recipes.get("dec-base", precision="bfloat16", accumulation_steps=1)
