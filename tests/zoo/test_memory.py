"""The analytical memory model and the `zoo` CLI around it.

The estimate is pinned to numbers worked out by hand from zoo/memory.py's
docstring for a small spec, so that a formula changed by a factor fails here (an
ordering of policies or a linearity in batch survives any constant factor)."""

import os
import subprocess
import sys

import pytest

import zoo
from tests.common import REPO
from zoo import memory, shapes
from zoo.cli import main
from zoo.memory.estimate import ROUNDED_UPDATE

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
# enc-base has dropout 0.1: under "full" each block holds its masks as bits to its backward, the two
# residual branches' (s·b·h each) and, with the plain core in the replay, the attention's (b·a·s²).
HELD_BITS = 2 * (2 * SBH + B * 4 * S * S) // 8  # 1,536 bytes, whatever the precision
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
    held = HELD_BITS if (spec.family, policy) == ("bert", "full") else 0
    assert e.activations == ACTIVATIONS_16[spec.family, policy] * activation_bytes // 2 + held
    # Logits, their softmax and their gradient, float32 [b, s, vocab]; an encoder backbone has none.
    assert e.logits == (3 * B * S * 100 * 4 if spec.is_decoder else 0)
    # The peak of the backward's start (all activations, logits and the first, largest gradient) and of the
    # update (all gradients and the update's temporaries: two tensors the size of the largest variable).
    largest = max(shapes.count([x]) for x in shapes.variable_shapes(spec)) * 4
    assert e.head_gradient == largest and e.update == 2 * largest
    # Under "full" the logits and that gradient are gone before the first block is replayed (one block's
    # activations, the plain core's included): the larger of the two, not both.
    replay = (LAYER_16 + (SWIGLU_16 if spec.is_decoder else 0)) * activation_bytes // 2 if policy == "full" else 0
    assert e.replay == replay
    assert e.backward_peak == e.activations - replay + e.saved_extra + max(e.logits + largest, replay)
    assert e.total == e.weights + e.optimizer + max(e.backward_peak, e.gradients + e.update + e.recompute)
    assert (e.recompute > 0) == (policy == "full")


# The chunked core keeps no 5·a·s² term: its float32 output (4·s·b·h) and log-sum-exp (4·a·s·b) instead,
# under every policy, plus two float32 tiles of 16 x 16 scores (the whole sequence is one chunk, run as
# straight-line ops) in one layer; past one tile, three (five under dropout: the loop's).
CHUNKED_SAVED = 4 * SBH + 4 * 4 * S * B  # 8,192 + 2,048
TILES = 2 * B * 4 * 16 * 16 * 4  # 16,384


@pytest.mark.parametrize("spec", [ENC, DEC], ids=["enc", "dec"])
@pytest.mark.parametrize("precision, activation_bytes", [("float32", 4), ("mixed_bfloat16", 2)])
def test_chunked_core_estimate_by_hand(spec, precision, activation_bytes):
    layer = (CORELESS_16 + (SWIGLU_16 if spec.family == "llama" else 0)) * activation_bytes // 2 + CHUNKED_SAVED
    expected = {"none": 2 * layer + TILES, "selective": 2 * layer + TILES,
                "full": 2 * (2 * SBH) * activation_bytes // 2 + layer + TILES
                + (2 * (2 * SBH) // 8 if spec.dropout else 0)}  # the chunked core draws its own masks: none held
    for policy, activations in expected.items():
        assert memory.estimate(spec, B, S, precision, policy, attention="chunked").activations == activations, policy
    # The default core ("auto") is the plain one under "none" and "full" (one block's replay keeps its
    # scores) and the chunked one under "selective", as models pick it.
    for policy in expected:
        core = "chunked" if policy == "selective" else "plain"
        assert memory.estimate(spec, B, S, precision, policy) == memory.estimate(spec, B, S, precision, policy,
                                                                                   attention=core), policy
    # ... on one chunk of positions: past it, "none" too runs the chunked core.
    assert memory.estimate(spec, B, S, precision, "none", chunk_size=S // 2) == memory.estimate(
        spec, B, S, precision, "none", attention="chunked", chunk_size=S // 2)
    roomy = spec.replace(max_sequence_length=1024)  # positions for the longer sequences below
    assert memory.estimate(roomy, B, 1024, precision, "none") == memory.estimate(roomy, B, 1024, precision, "none",
                                                                                   attention="chunked")
    # Linear in s beyond one chunk: 8 times the length is 8 times the activations when the tiles are 4 x 4.
    short, long = (memory.estimate(roomy, B, n, precision, "none", attention="chunked", chunk_size=4).activations
                   for n in (16, 128))
    looped = (5 if spec.dropout else 3) * TILES // 32  # 4 x 4 tiles: three, and two more under dropout
    assert long - looped == 8 * (short - looped)
    with pytest.raises(ValueError, match="known cores: auto, chunked, plain"):
        memory.estimate(spec, B, S, attention="flash")


def test_estimate_other_precisions_and_optimizers():
    params = DEC.num_params()
    half = memory.estimate(DEC, B, S, "bfloat16", "none", attention="plain", weights_dtype="bfloat16")
    # bfloat16 weights: the "bfloat16" policy, and AdamW's moments in the variables' dtype (zoo.optimizers).
    assert half.weights == half.gradients == params * 2 and half.optimizer == params * 2 * 2
    assert half.activations == ACTIVATIONS_16["llama", "none"]
    assert half == memory.estimate(DEC, B, S, None, "none", attention="plain", weights_dtype="bfloat16")
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
    base = total[2, 16, 2]  # never less; the update's phase may be the peak, which no activation changes
    assert total[3, 16, 2] >= base and total[2, 32, 2] >= base and total[2, 16, 3] > base, total
    e = {p: memory.estimate(spec, 2, 16, "float32", p, attention="plain") for p in zoo.POLICIES}
    assert e["full"].activations < e["selective"].activations < e["none"].activations
    e = {p: memory.estimate(spec, 2, 16, "float32", p, attention="chunked") for p in zoo.POLICIES}
    assert e["full"].activations < e["selective"].activations == e["none"].activations  # chunked: selective is none


def test_largest_batch_is_the_last_that_fits():
    budget = 24 * memory.GiB
    b = memory.largest_batch("enc-1b", 512, budget, precision="mixed_bfloat16", checkpointing="full")
    assert b >= 1
    assert memory.estimate("enc-1b", b, 512, "mixed_bfloat16", "full").total <= budget
    assert memory.estimate("enc-1b", b + 1, 512, "mixed_bfloat16", "full").total > budget
    assert memory.largest_batch("enc-1b", 512, 1 * memory.GiB) == 0


def test_cli_runs_as_a_module():
    """One real `python -m zoo.cli` process; the other CLI tests call zoo.cli.main in-process."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "ZOO_VERBOSE")}  # a user's
    out = subprocess.run([sys.executable, "-m", "zoo.cli", "list"], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert all(name in out.stdout for name in zoo.names())
    assert out.stderr == "", out.stderr  # quiet by default: none of TensorFlow's loading lines (zoo.verbosity)


def test_cli_info_and_plan(capsys):
    assert main(["info", "dec-1b"]) == 0
    assert '"num_params": 1100048384' in capsys.readouterr().out
    assert main(["plan", "enc-1b", "--batch-size", "2", "--precision", "mixed_bfloat16"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows[2:-2]] == list(memory.CONFIGS)
    # --checkpointing: one row, the estimate's numbers (GiB, two decimals), total, then the largest batch.
    assert main(["plan", "dec-1b", "--batch-size", "4", "--sequence-length", "1024", "--checkpointing", "full",
                 "--budget", "64GiB"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "dec-1b: batch 4 x sequence 1024, float32, adamw; budget 64.00 GiB" and len(rows) == 5
    e = memory.estimate("dec-1b", 4, 1024, "float32", "full")
    most = memory.largest_batch("dec-1b", 1024, 64 * memory.GiB, checkpointing="full")
    assert rows[2].split() == ["full"] + [f"{v / memory.GiB:.2f}G" for v in e.as_dict().values()] + [str(most)]
    assert rows[4].startswith("auto: full (")


@pytest.mark.parametrize("args", [("info", "enc-xl"), ("plan", "enc-xl")])
def test_cli_unknown_model_lists_known(args, capsys):
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "enc-base" in err and "enc-xl" in err


# The planner: variable shapes, optimizers, fused, chunked loss, choose, parse_bytes, `zoo plan` ------------

def test_optimizer_state_by_hand():
    sizes = [(100, 64), (64,), (3, 5, 7)]
    assert memory.optimizer_state_bytes("adamw", sizes) == 2 * (6400 + 64 + 105) * 4
    assert memory.optimizer_state_bytes("lion", sizes) == (6400 + 64 + 105) * 4
    # Keras' Adafactor: a full-size velocity for every variable, r (shape[:-1]) and c (shape[:-2] + last)
    # for >= 2 dims, two scalars for a vector.
    assert memory.optimizer_state_bytes("keras-adafactor", sizes) == (6400 + 100 + 64 + 64 + 2 + 105 + 15 + 21) * 4
    # The factored Adafactor: r and c only for >= 2 dims, a full second moment for a vector; float32 always.
    assert memory.optimizer_state_bytes("adafactor", sizes) == (100 + 64 + 64 + 15 + 21) * 4
    assert memory.optimizer_state_bytes("adafactor", sizes, variable_bytes=2) == (100 + 64 + 64 + 15 + 21) * 4
    assert memory.optimizer_state_bytes("adamw", sizes, variable_bytes=2) == 2 * (6400 + 64 + 105) * 2
    assert memory.optimizer_state_bytes("sgd", sizes) == 0
    with pytest.raises(ValueError, match="known optimizers: adamw"):
        memory.optimizer_state_bytes("adagrad", sizes)


def test_optimizer_state_matches_the_built_optimizers():
    import keras

    model = zoo.get(ENC, task="masked_lm")
    for name, optimizer in [("keras-adafactor", keras.optimizers.Adafactor()), ("lion", keras.optimizers.Lion()),
                            ("adamw", keras.optimizers.AdamW()), ("adafactor", zoo.optimizers.Adafactor())]:
        optimizer.build(model.trainable_variables)
        slots = sum(v.numpy().nbytes for v in optimizer.variables) - optimizer.iterations.numpy().nbytes
        slots -= sum(v.numpy().nbytes for v in optimizer.variables if "learning_rate" in v.path)
        variables = shapes.variable_shapes(ENC, "masked_lm")
        assert memory.optimizer_state_bytes(name, variables) == slots, name


CASES = [(ENC, "masked_lm"), (DEC, "causal_lm"), ("enc-1b", None), ("dec-1b", None)]


@pytest.mark.parametrize("spec, task", CASES, ids=["enc", "dec", "enc-1b", "dec-1b"])
@pytest.mark.parametrize("config", memory.CONFIGS)
@pytest.mark.parametrize("optimizer", ["adamw", "lion", "adafactor"])
@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_more_batch_length_or_layers_never_predicts_less(spec, task, config, optimizer, precision):
    spec = zoo.spec(spec).replace(max_sequence_length=4096)
    total = {}
    backward = {}
    for b, s, layers in [(2, 16, 2), (3, 16, 2), (2, 32, 2), (2, 16, 3), (2, 4096, 2)]:
        e = memory.estimate(spec.replace(num_layers=layers), b, s, precision, config, task=task, optimizer=optimizer)
        total[b, s, layers], backward[b, s, layers] = e.total, e.backward_peak
    for bigger in [(3, 16, 2), (2, 32, 2), (2, 16, 3)]:
        assert total[bigger] >= total[2, 16, 2], total  # never less (the update's peak may be the larger)
        assert backward[bigger] > backward[2, 16, 2], backward  # and the backward's peak always grows
    assert total[2, 16, 3] > total[2, 16, 2] and total[2, 4096, 2] > total[2, 32, 2]


def test_fused_keeps_one_block_of_gradients():
    full = memory.estimate("dec-1b", 1, 512, "mixed_bfloat16", "full")
    fused = memory.estimate("dec-1b", 1, 512, "mixed_bfloat16", "full", fused=True)
    assert fused == memory.estimate("dec-1b", 1, 512, "mixed_bfloat16", "full+fused")
    spec = zoo.spec("dec-1b")
    block = shapes.count(shapes.block_shapes(spec))
    assert fused.gradients == (spec.num_params() - (spec.num_layers - 1) * block) * 4 < full.gradients / 5
    assert fused.total < full.total
    # The update runs inside the backward pass: the walk over the blocks (the saved inputs, one recomputed
    # block, one block's gradients with the embedding's and head's and its update's temporaries), then the
    # embedding's and head's update.
    walk = fused.activations + fused.saved_extra + fused.gradients + fused.block_update
    end = fused.gradients + fused.update
    assert 0 < fused.block_update < fused.update
    assert fused.total == fused.weights + fused.optimizer + max(fused.backward_peak, walk, end)
    for policy in ("none", "selective"):
        with pytest.raises(ValueError, match="checkpointing='full'"):
            memory.estimate("dec-1b", 1, 512, checkpointing=policy, fused=True)


def test_chunked_loss_holds_one_chunk_of_logits():
    chunked = memory.estimate("dec-1b", 2, 2048, "mixed_bfloat16", "full")
    whole = memory.estimate("dec-1b", 2, 2048, "mixed_bfloat16", "full", loss_chunk=0)
    assert whole.logits == 3 * 2 * 2048 * 32000 * 4
    assert chunked.logits == 3 * 2 * zoo.ops.lm_loss.loss_chunk(2, 2048, 32000) * 32000 * 4 < whole.logits
    assert memory.estimate("dec-1b", 2, 2048, loss_chunk=256).logits == whole.logits // 8
    with pytest.raises(ValueError, match="causal_lm"):
        memory.estimate("enc-base", 2, 128, task="masked_lm", loss_chunk=256)


def test_new_families_estimate_by_hand():
    """Issue 23's fields each add what they keep per layer (16-bit bytes, float32 doubles them): Gemma 3's
    sandwich norms two more h-wide inputs, its Q/K norms their (H + KV)·d inputs, its GeGLU the gated
    third ffn-wide tensor; Qwen3's queries (H·d = 2048 > h = 1024) the extra width twice. Gemma's 262,144-entry
    vocabulary is what the chunked loss is for: whole logits at 8 x 512 hold three float32 copies (12 GiB)."""
    gemma = zoo.spec("gemma3-1b").replace(**SMALL, head_dim=16, num_kv_heads=1)
    pre = gemma.replace(norm_placement="pre", qk_norm=False)
    per_layer = {name: memory.estimate(spec, B, S, "mixed_bfloat16", "selective", attention="plain").activations
                 // gemma.num_layers for name, spec in (("gemma", gemma), ("pre", pre))}
    assert per_layer["pre"] == CORELESS_16 + SWIGLU_16
    assert per_layer["gemma"] - per_layer["pre"] == S * B * (4 * 64 + 2 * (4 + 1) * 16)
    qwen3 = zoo.spec("qwen3-0.6b")
    extra = memory.estimate(qwen3, 1, 64, "mixed_bfloat16", "selective", attention="plain").activations
    plain = memory.estimate(qwen3.replace(qk_norm=False, head_dim=64), 1, 64, "mixed_bfloat16", "selective",
                            attention="plain").activations
    assert extra - plain == 28 * 64 * (2 * (16 + 8) * 128 + 4 * (2048 - 1024))
    whole = memory.estimate("gemma3-1b", 8, 512, "mixed_bfloat16", "full", loss_chunk=0)
    assert whole.logits == 3 * 8 * 512 * 262144 * 4 == 12 * memory.GiB
    assert memory.estimate("gemma3-1b", 8, 512, "mixed_bfloat16", "full").logits < whole.logits / 8
    for name in ("qwen2.5-0.5b", "modernbert-base", "modernbert-large"):
        assert memory.estimate(name, 2, 512, "mixed_bfloat16", "full+fused").total > 0


def test_optimizer_states_order():
    e = {o: memory.estimate("enc-base", 2, 128, "float32", "full", optimizer=o, fused=True).optimizer
         for o in ("sgd", "adafactor", "lion", "keras-adafactor", "adamw")}
    # Keras' Adafactor keeps a full-size velocity besides its factored statistics: a little above Lion. The
    # factored one keeps the statistics only: 0.2% of Lion's state on enc-base.
    assert e["sgd"] < e["adafactor"] < e["lion"] < e["keras-adafactor"] < e["adamw"]
    assert e["keras-adafactor"] < 1.01 * e["lion"] and e["adafactor"] < 0.005 * e["lion"]


# DEC's factored statistics (float32): the embedding (100, 64): 100 + 64; per block q and o (64, 64): 2 x 128,
# k and v (64, 32): 2 x 96, gate and up (64, 128): 2 x 192, down (128, 64): 192, two norms 2 x 64; the final norm.
FACTORED_DEC = (100 + 64 + 2 * (2 * 128 + 2 * 96 + 2 * 192 + 192 + 2 * 64) + 64) * 4  # 10,128


@pytest.mark.parametrize("optimizer, state, copies", [("adafactor", FACTORED_DEC, 3), ("adamw", 80_448 * 2 * 2, 6),
                                                      ("lion", 80_448 * 2, 5)])
def test_bfloat16_weights_by_hand(optimizer, state, copies):
    """bfloat16 weights with stochastic rounding: weights and gradients 2 bytes, the optimizer's full-size
    slots 2 (Adafactor's statistics stay float32), the update float32 copies of the largest variable
    (a feed-forward kernel, 64 x 128 = 8,192 > the embedding's 6,400; ROUNDED_UPDATE) and nothing made
    ahead (Lion waits for its gradients)."""
    params = DEC.num_params()
    for fused in (False, True):
        e = memory.estimate(DEC, B, S, checkpointing="full", optimizer=optimizer, attention="plain", fused=fused,
                            weights_dtype="bfloat16")
        assert e.weights == params * 2 and e.head_gradient == 8192 * 2
        assert e.optimizer == state
        assert e.update == 8192 * 4 * copies == 8192 * 4 * ROUNDED_UPDATE[optimizer]
        assert e.activations == ACTIVATIONS_16["llama", "full"]  # bfloat16 compute: the formula's 16-bit
        if fused:  # one block's gradients, and its largest variable's float32 copies (the same kernel)
            block = shapes.count(shapes.block_shapes(DEC))
            assert e.gradients == (params - block) * 2 and e.block_update == 64 * 128 * 4 * copies
        else:
            assert e.gradients == params * 2
    f32 = memory.estimate(DEC, B, S, checkpointing="full", optimizer=optimizer, attention="plain")
    assert f32.weights == 2 * e.weights and f32.activations == 2 * e.activations


def test_bfloat16_weights_are_the_callers_choice():
    """`auto` chooses the recomputation among exact configurations; the weights' dtype and the optimizer
    stay what the caller asked for, and are named in the hint when nothing fits."""
    bf16 = {c: memory.estimate("dec-1b", 8, 512, checkpointing=c, optimizer="adafactor", weights_dtype="bfloat16")
            for c in memory.CONFIGS}
    config, e = memory.choose("dec-1b", 8, 512, bf16["full"].total, optimizer="adafactor", weights_dtype="bfloat16")
    assert config == "full" and e == bf16["full"]
    f32 = memory.estimate("dec-1b", 8, 512, "mixed_bfloat16", "full+fused", optimizer="adafactor")
    assert f32.total > bf16["full+fused"].total  # a float32 run would not fit where the bfloat16 one does
    with pytest.raises(ValueError, match=r"mixed_bfloat16, float32 weights, adamw.*a lighter optimizer \(adafactor.*"
                                         r"bfloat16 weights \(weights_dtype='bfloat16'"):
        memory.choose("dec-1b", 8, 512, 4 * memory.GiB, "mixed_bfloat16")
    with pytest.raises(ValueError, match="Optimizer 'keras-adafactor' cannot train bfloat16 weights.*adamw, "
                                         "adafactor, lion"):
        memory.estimate("dec-1b", 8, 512, optimizer="keras-adafactor", weights_dtype="bfloat16")
    with pytest.raises(ValueError, match="cannot be combined with precision 'mixed_float16'"):
        memory.estimate("dec-1b", 8, 512, "mixed_float16", weights_dtype="bfloat16")
    with pytest.raises(ValueError, match="Unknown weights dtype 'int8'"):
        memory.estimate("dec-1b", 8, 512, weights_dtype="int8")


def test_cli_plan_bfloat16_weights(capsys):
    assert main(["plan", "dec-1b", "--batch-size", "8", "--weights-dtype", "bfloat16", "--optimizer", "adafactor",
                 "--budget", "24GiB"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == ("dec-1b: batch 8 x sequence 512, bfloat16, bfloat16 weights (stochastic rounding), adafactor; "
                       "budget 24.00 GiB")
    for row, config in zip(rows[2:-2], memory.CONFIGS, strict=True):
        e = memory.estimate("dec-1b", 8, 512, checkpointing=config, optimizer="adafactor", weights_dtype="bfloat16")
        assert row.split()[:-1] == [config] + [f"{v / memory.GiB:.2f}G" for v in e.as_dict().values()]
    assert main(["plan", "dec-1b", "--weights-dtype", "bfloat16", "--precision", "mixed_float16"]) == 2
    assert "cannot be combined with precision 'mixed_float16'" in capsys.readouterr().err


def test_lion_outside_the_fused_step_holds_two_momentum_products():
    """Keras' Lion makes m·β1 and m·β2 from the momentum alone: ahead of the gradients in Keras'
    own step, for every variable; the fused update waits for each block's gradients."""
    params = zoo.spec("enc-base").num_params()
    plain, fused = (memory.estimate("enc-base", 2, 128, "float32", "full", optimizer="lion", fused=f)
                    for f in (False, True))
    assert plain.optimizer - fused.optimizer == 2 * 4 * params
    assert fused.update == 2 * plain.update  # four temporaries of a variable at once, not two


def test_choose_takes_the_fastest_config_that_fits():
    spec, b, s = "dec-1b", 1, 2048
    e = {c: memory.estimate(spec, b, s, "mixed_bfloat16", c, attention="plain").total for c in memory.CONFIGS}
    assert e["none"] > e["selective"] > e["full"] > e["full+fused"]

    def pick(budget):
        return memory.choose(spec, b, s, budget, "mixed_bfloat16", attention="plain")[0]

    assert pick(1000 * memory.GiB) == "none"
    assert pick(e["none"]) == "none"
    assert pick((e["none"] + e["selective"]) // 2) == "selective"
    assert pick((e["selective"] + e["full"]) // 2) == "full"
    assert pick((e["full"] + e["full+fused"]) // 2) == "full+fused"
    smallest = f"smallest estimate is {e['full+fused'] / memory.GiB:.2f} GiB \\(full\\+fused\\)"
    with pytest.raises(ValueError, match=smallest):
        pick(e["full+fused"] - 1)


def test_default_budget_is_the_machines_memory():
    with open("/proc/meminfo") as f:
        total = int(f.readline().split()[1]) * 1024
    assert abs(memory.default_budget() - total) < 0.05 * total


@pytest.mark.parametrize("text, expected", [("24GiB", 24 * 2**30), ("24G", 24 * 2**30), ("16000MiB", 16000 * 2**20),
                                            ("1.5 GiB", 3 * 2**29), ("512MB", 512 * 10**6), ("1048576", 2**20),
                                            (4096, 4096)])
def test_parse_bytes(text, expected):
    assert memory.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "24 parsecs", "-3G", ""])
def test_parse_bytes_refuses(text):
    with pytest.raises(ValueError, match="24GiB"):
        memory.parse_bytes(text)


def test_cli_plan_prints_the_choice_and_largest_batches(capsys):
    assert main(["plan", "dec-1b", "--batch-size", "1", "--sequence-length", "2048", "--precision", "mixed_bfloat16",
                 "--budget", "24GiB"]) == 0
    out = capsys.readouterr().out.splitlines()
    choice, e = memory.choose("dec-1b", 1, 2048, 24 * memory.GiB, "mixed_bfloat16")
    rss = memory.step_resident("dec-1b", e, precision="mixed_bfloat16").total  # tests/zoo/test_resident_plan.py
    assert out[-1].startswith(f"auto: {choice} ({e.total / memory.GiB:.2f} GiB of 24.00 GiB); its process's planned "
                              f"peak RSS {rss / memory.GiB:.2f} GiB (runtime 0.70 + allocator ")
    for row, config in zip(out[2:-2], memory.CONFIGS, strict=True):
        most = memory.largest_batch("dec-1b", 2048, 24 * memory.GiB, precision="mixed_bfloat16", checkpointing=config)
        assert row.split()[0] == config and row.split()[-1] == str(most)


def test_cli_plan_takes_the_loss_chunk(capsys):
    """--loss-chunk plans what `zoo train --loss-chunk` runs (a recipe's loss_chunk): 256 positions of a llama3
    vocabulary hold half the float32 logits of the default chunk (512); bad values are refused."""
    flags = ["plan", "llama3.2-3b", "--batch-size", "1", "--sequence-length", "2048", "--precision", "mixed_bfloat16",
             "--lora-rank", "16", "--lora-targets", "all-linear", "--quantize", "int4", "--checkpointing", "full",
             "--budget", "64GiB"]
    options = dict(precision="mixed_bfloat16", checkpointing="full", lora_rank=16, lora_targets="all-linear",
                   quantize="int4")
    rows = {}
    for chunk in (None, 256):
        assert main(flags + ([] if chunk is None else ["--loss-chunk", str(chunk)])) == 0
        row = capsys.readouterr().out.splitlines()[2].split()
        e = memory.estimate("llama3.2-3b", 1, 2048, loss_chunk=chunk, **options)
        assert row[1:-1] == [f"{v / memory.GiB:.2f}G" for v in e.as_dict().values()], (chunk, row)
        rows[chunk] = e
    assert rows[256].logits < 0.6 * rows[None].logits and rows[256].total < rows[None].total
    assert main(flags + ["--loss-chunk", "-3"]) == 2
    assert "Loss chunk_size must be a positive number of positions, got -3" in capsys.readouterr().err
    assert main(["plan", "enc-base", "--loss-chunk", "256"]) == 2
    assert "loss_chunk applies to task 'causal_lm' only, not 'backbone'" in capsys.readouterr().err


def test_cli_plan_unmeetable_budget(capsys):
    assert main(["plan", "dec-1b", "--batch-size", "1", "--sequence-length", "512", "--budget", "1GiB"]) == 2
    err = capsys.readouterr().err
    e = min(memory.estimate("dec-1b", 1, 512, checkpointing=c).total for c in memory.CONFIGS)
    assert "zoo plan: error: No configuration of dec-1b fits a budget of 1.00 GiB" in err
    assert f"smallest estimate is {e / memory.GiB:.2f} GiB (full+fused)" in err


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "batch_size must be a positive whole number, got 0"),
    (["--sequence-length", "-8"], "sequence_length must be a positive whole number, got -8"),
    (["--budget", "0GiB"], "A memory budget must be a positive whole number, got 0"),
])
def test_non_positive_sizes_are_refused_by_the_api_and_the_cli(flags, message, capsys):
    """`zoo plan dec-1b --batch-size 0` printed a table with "auto: none"; the CLI and the API share
    one check (zoo.checks.positive)."""
    assert main(["plan", "dec-1b", *flags]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="must be a positive whole number"):
        memory.estimate("dec-1b", 0, 512)
    with pytest.raises(ValueError, match="budget_bytes must be a positive whole number"):
        memory.largest_batch("dec-1b", 512, 0)


def test_a_grpo_step_is_its_completions_rows_and_its_sampling(capsys):
    """grpo=G: batch counts prompts, each G rows of prompt + completion through the step (the chunked scores over
    the completion's positions only), and the sampling phase before it: the key/value cache of every block plus
    one block's being replaced, and the prefill's float32 logits beside the compute dtype's."""
    grpo = memory.estimate(DEC, 2, S, checkpointing="full", task="causal_lm", grpo=2, completion_length=6)
    sft = memory.estimate(DEC, 4, S, checkpointing="full", task="causal_lm")
    assert {k: v for k, v in grpo.as_dict().items() if k not in ("logits", "generation", "total")} == {
        k: v for k, v in sft.as_dict().items() if k not in ("logits", "total")}
    assert grpo.logits == memory.loss_live_bytes(4, 6, 100)
    cache = 4 * 2 * S * 2 * 16 * 4  # rows x (keys, values) x positions x KV heads x head_dim x float32
    assert grpo.generation == 3 * cache + 4 * 10 * 100 * (4 + 4)  # 2 blocks + 1; prompt positions 16 - 6
    steps = max(grpo.backward_peak, grpo.update_peak)
    assert grpo.total == grpo.weights + grpo.optimizer + steps > grpo.weights + grpo.optimizer + grpo.generation
    with pytest.raises(ValueError, match="must be an integer >= 2"):
        memory.estimate(DEC, 2, S, task="causal_lm", grpo=1, completion_length=6)
    with pytest.raises(ValueError, match="needs completion_length"):
        memory.estimate(DEC, 2, S, task="causal_lm", grpo=2, completion_length=S)
    with pytest.raises(ValueError, match="pass grpo=G"):
        memory.estimate(DEC, 2, S, task="causal_lm", completion_length=6)
    with pytest.raises(ValueError, match="without packed rows or preference pairs"):
        memory.estimate(DEC, 2, S, task="causal_lm", grpo=2, completion_length=6, packed=True)
    assert main(["plan", "dec-base", "--batch-size", "2", "--sequence-length", "96", "--lora-rank", "16",
                 "--grpo", "8", "--completion-length", "32", "--checkpointing", "full"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "GRPO: 8 completions of 32 tokens per prompt" in rows[0] and rows[1].split()[-4:] == [
        "generation", "total", "max", "batch"]
