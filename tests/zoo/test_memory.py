"""The analytical memory model and the `zoo` CLI around it.

The estimate is pinned to numbers worked out by hand from zoo/memory.py's
docstring for a small spec, so that a formula changed by a factor fails here (an
ordering of policies or a linearity in batch survives any constant factor)."""

import subprocess
import sys

import pytest

import zoo
from tests.common import REPO
from zoo import memory
from zoo.cli import main

# b=2 sequences of s=16 tokens; L=2 layers, h=64, a=4 heads, ffn 128, vocabulary 100.
B, S = 2, 16
SMALL = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=100, max_sequence_length=64)
ENC = zoo.spec("enc-base").replace(**SMALL)
DEC = zoo.spec("dec-base").replace(num_kv_heads=2, **SMALL)
SBH = S * B * 64  # 2,048

# Korthikanti et al.: s·b·h·(34 + 5·a·s/h) bytes per layer in 16-bit; 5·a·s/h = 5·4·16/64 = 5.
LAYER_16 = SBH * (34 + 5)  # 79,872
CORELESS_16 = SBH * 34  # 69,632: what selective keeps (no attention core)
SWIGLU_16 = S * B * 128 * 2  # 8,192: the decoders' third ffn-wide tensor
# Activation bytes by (family, policy), in 16-bit; float32 doubles them.
ACTIVATIONS_16 = {
    ("bert", "none"): 2 * LAYER_16,  # 159,744
    ("bert", "selective"): 2 * CORELESS_16,  # 139,264
    ("bert", "full"): 2 * (2 * SBH) + LAYER_16,  # each block's input, plus one block recomputed: 88,064
    ("llama", "none"): 2 * (LAYER_16 + SWIGLU_16),  # 176,128
    ("llama", "selective"): 2 * (CORELESS_16 + SWIGLU_16),  # 155,648
    ("llama", "full"): 2 * (2 * SBH) + LAYER_16 + SWIGLU_16,  # 96,256
}


def test_small_spec_parameter_counts_by_hand():
    # BERT block: q,k,v,o 4·(64·64+64) + ffn (64·128+128) + (128·64+64) + two LayerNorms 2·128
    bert_block = 4 * (64 * 64 + 64) + (64 * 128 + 128) + (128 * 64 + 64) + 2 * 128
    # embeddings (100 + 64 positions + 2 segments)·64 + LayerNorm 128, 2 blocks, pooler 64·64+64
    assert ENC.num_params() == (100 + 64 + 2) * 64 + 128 + 2 * bert_block + 64 * 64 + 64 == 81_856
    assert zoo.get(ENC).count_params() == 81_856
    # Llama block: q,o 64·64 each, k,v 64·32 each (2 KV heads of 16), SwiGLU 3·64·128, two RMSNorms
    llama_block = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert DEC.num_params() == 100 * 64 + 2 * llama_block + 64 == 80_448  # tied head, final norm
    assert zoo.get(DEC).count_params() == 80_448


@pytest.mark.parametrize("spec", [ENC, DEC], ids=["enc", "dec"])
@pytest.mark.parametrize("policy", zoo.POLICIES)
@pytest.mark.parametrize("precision, activation_bytes", [("float32", 4), ("mixed_bfloat16", 2)])
def test_estimate_matches_the_hand_computed_formula(spec, policy, precision, activation_bytes):
    e = memory.estimate(spec, B, S, precision, policy, attention="plain")
    params = spec.num_params()
    assert e.weights == e.gradients == params * 4  # fp32 (master) weights and gradients
    assert e.optimizer == params * 4 * 2  # Adam's two fp32 moments
    assert e.activations == ACTIVATIONS_16[spec.family, policy] * activation_bytes // 2
    # Logits, their softmax and their gradient, float32 [b, s, vocab]; an encoder backbone has none.
    assert e.logits == (3 * B * S * 100 * 4 if spec.is_decoder else 0)
    assert e.total == e.weights + e.gradients + e.optimizer + e.activations + e.logits


# The chunked core keeps no 5·a·s² term: its float32 output (4·s·b·h) and log-sum-exp (4·a·s·b) instead,
# under every policy, plus six float32 tiles of 16 x 16 scores (the whole sequence is one chunk) in one layer.
CHUNKED_SAVED = 4 * SBH + 4 * 4 * S * B  # 8,192 + 2,048
TILES = 6 * B * 4 * 16 * 16 * 4  # 49,152


@pytest.mark.parametrize("spec", [ENC, DEC], ids=["enc", "dec"])
@pytest.mark.parametrize("precision, activation_bytes", [("float32", 4), ("mixed_bfloat16", 2)])
def test_chunked_core_estimate_by_hand(spec, precision, activation_bytes):
    layer = (CORELESS_16 + (SWIGLU_16 if spec.family == "llama" else 0)) * activation_bytes // 2 + CHUNKED_SAVED
    expected = {"none": 2 * layer + TILES, "selective": 2 * layer + TILES,
                "full": 2 * (2 * SBH) * activation_bytes // 2 + layer + TILES}
    for policy, activations in expected.items():
        assert memory.estimate(spec, B, S, precision, policy).activations == activations, policy
    # Linear in s beyond one chunk: 8 times the length is 8 times the activations when the tiles are 4 x 4.
    short, long = (memory.estimate(spec, B, n, precision, "none", chunk_size=4).activations for n in (16, 128))
    assert long - TILES // 16 == 8 * (short - TILES // 16)
    with pytest.raises(ValueError, match="known cores: chunked, plain"):
        memory.estimate(spec, B, S, attention="flash")


def test_estimate_other_precisions_and_optimizers():
    params = DEC.num_params()
    half = memory.estimate(DEC, B, S, "bfloat16", "none", attention="plain")
    assert half.weights == half.gradients == params * 2 and half.optimizer == params * 8
    assert half.activations == ACTIVATIONS_16["llama", "none"]
    assert memory.estimate(DEC, B, S, "float32", "none", optimizer="sgd").optimizer == 0
    assert memory.estimate(DEC, B, S, "float32", "none", optimizer="AdamW").optimizer == params * 8
    # A real shape: enc-base, batch 4 x 512, float32, no recomputation.
    e = memory.estimate("enc-base", 4, 512, "float32", "none", attention="plain")
    assert e.weights == zoo.spec("enc-base").num_params() * 4 == 109_482_240 * 4
    assert e.activations == 12 * 512 * 4 * 768 * (34 + 5 * 12 * 512 / 768) * 2 == 2_793_406_464


@pytest.mark.parametrize("spec", [ENC, DEC, "enc-1b", "dec-1b"], ids=["enc", "dec", "enc-1b", "dec-1b"])
@pytest.mark.parametrize("policy", zoo.POLICIES)
def test_estimate_grows_with_batch_length_and_layers(spec, policy):
    spec = zoo.spec(spec)
    total = {}
    for b, s, layers in [(2, 16, 2), (3, 16, 2), (2, 32, 2), (2, 16, 3)]:
        total[b, s, layers] = memory.estimate(spec.replace(num_layers=layers), b, s, "mixed_bfloat16", policy).total
    base = total[2, 16, 2]
    assert total[3, 16, 2] > base and total[2, 32, 2] > base and total[2, 16, 3] > base, total
    e = {p: memory.estimate(spec, 2, 16, "float32", p, attention="plain") for p in zoo.POLICIES}
    assert e["full"].activations < e["selective"].activations < e["none"].activations
    e = {p: memory.estimate(spec, 2, 16, "float32", p) for p in zoo.POLICIES}  # chunked: selective is none
    assert e["full"].activations < e["selective"].activations == e["none"].activations


def test_largest_batch_is_the_last_that_fits():
    budget = 24 * memory.GiB
    b = memory.largest_batch("enc-1b", 512, budget, precision="mixed_bfloat16", checkpointing="full")
    assert b >= 1
    assert memory.estimate("enc-1b", b, 512, "mixed_bfloat16", "full").total <= budget
    assert memory.estimate("enc-1b", b + 1, 512, "mixed_bfloat16", "full").total > budget
    assert memory.largest_batch("enc-1b", 512, 1 * memory.GiB) == 0


def test_cli_runs_as_a_module():
    """One real `python -m zoo.cli` process; the other CLI tests call zoo.cli.main in-process."""
    out = subprocess.run([sys.executable, "-m", "zoo.cli", "list"], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert all(name in out.stdout for name in zoo.names())


def test_cli_info_and_plan(capsys):
    assert main(["info", "dec-1b"]) == 0
    assert '"num_params": 1100048384' in capsys.readouterr().out
    assert main(["plan", "enc-1b", "--batch-size", "2", "--precision", "mixed_bfloat16"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows[2:]] == list(zoo.POLICIES)
    # --checkpointing: one row, the estimate's numbers (GiB, two decimals), total last.
    assert main(["plan", "dec-1b", "--batch-size", "4", "--sequence-length", "1024", "--checkpointing", "full"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "dec-1b: batch 4 x sequence 1024, float32" and len(rows) == 3
    e = memory.estimate("dec-1b", 4, 1024, "float32", "full")
    assert rows[2].split() == ["full"] + [f"{v / memory.GiB:.2f}G" for v in e.as_dict().values()]


@pytest.mark.parametrize("args", [("info", "enc-xl"), ("plan", "enc-xl")])
def test_cli_unknown_model_lists_known(args, capsys):
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "enc-base" in err and "enc-xl" in err
