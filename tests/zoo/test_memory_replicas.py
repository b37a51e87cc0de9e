"""`zoo.memory.replicas` and `zoo plan --replicas`: per-replica memory and the bytes all-reduced per step,
pinned to numbers worked out by hand (arithmetic only: nothing is built)."""

import pytest

from tests.zoo.test_memory import DEC, S
from zoo import memory
from zoo.cli import main
from zoo.memory import GiB, replicas

PARAMS = 80_448  # DEC's parameters (tests/zoo/test_memory.py counts them by hand)
BLOCK = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # 36,992: one Llama block of DEC
OUTER = 100 * 64 + 64  # the tied embedding and the final norm
DEC_1B = 1_100_048_384  # dec-1b's parameters (`zoo info dec-1b`)


@pytest.mark.parametrize("policy", ["none", "full"])
def test_a_replica_holds_one_device_at_its_slice_and_the_packed_gradients(policy):
    p = replicas.plan(DEC, 8, S, 4, checkpointing=policy)
    one = memory.estimate(DEC, 2, S, checkpointing=policy)  # the global batch 8 over 4 replicas: 2 each
    assert (p.batch, p.global_batch) == (2, 8)
    assert p.estimate.as_dict() | {"total": 0} == one.as_dict() | {"total": 0}  # every component is one device's
    # The all-reduce concatenates every gradient into one flat float32 buffer before reducing it.
    assert (p.estimate.reduce_buffer, p.estimate.block_reduce) == (PARAMS * 4, 0)
    assert p.per_replica == one.weights + one.optimizer + max(one.total - one.weights - one.optimizer,
                                                              2 * PARAMS * 4)
    assert p.reduced == PARAMS * 4  # every float32 gradient once
    assert p.sent == 2 * 3 * PARAMS * 4 // 4 and p.network == 0  # ring: 2 (N-1)/N; one host: no network


def test_fused_reduces_one_block_at_a_time_and_twice_under_the_exact_global_clip():
    """The norm of the summed gradient is not the sum of the replicas' norms (g2 = -g1 sums to 0), so the
    exact global clip's norm pass reduces every block's gradients before the update pass reduces them again."""
    global_clip = replicas.plan(DEC, 8, S, 2, checkpointing="full+fused")
    e = global_clip.estimate
    assert (e.block_reduce, e.reduce_buffer) == (BLOCK * 4, OUTER * 4)
    assert global_clip.reduced == 2 * PARAMS * 4
    for clip in ("per-block", None):
        assert replicas.plan(DEC, 8, S, 2, fused_clip=clip, checkpointing="full+fused").reduced == PARAMS * 4
    walk = e.activations + e.saved_extra + e.gradients + max(e.block_update, BLOCK * 4)
    end = e.gradients + max(e.update, OUTER * 4)
    assert e.total == e.weights + e.optimizer + max(e.backward_peak, walk, end)
    assert e.total >= memory.estimate(DEC, 4, S, checkpointing="full+fused").total


def test_dec_1b_bytes_by_hand():
    full = replicas.plan("dec-1b", 8, 512, 2, 2, precision="mixed_bfloat16", checkpointing="full")
    assert full.reduced == DEC_1B * 4 == 4_400_193_536  # mixed_bfloat16 keeps float32 variables and gradients
    fused = replicas.plan("dec-1b", 8, 512, 2, 2, precision="mixed_bfloat16", checkpointing="full+fused")
    assert fused.reduced == 2 * full.reduced
    assert full.network == full.sent == full.reduced  # two replicas on two hosts: 2 (2-1)/2 = 1


def test_lora_reduces_the_adapters_only():
    """PEFT's default targets on the decoder, q_proj and v_proj, rank 4: A [64, 4] and B [4, 64] or [4, 32]."""
    p = replicas.plan(DEC, 4, S, 2, lora_rank=4)
    assert p.reduced == 2 * ((64 * 4 + 4 * 64) + (64 * 4 + 4 * 32)) * 4 == 7_168


def test_one_replica_is_one_device():
    p = replicas.plan(DEC, 4, S, 1, checkpointing="full")
    assert p.estimate == memory.estimate(DEC, 4, S, checkpointing="full") and p.reduced == p.sent == 0


@pytest.mark.parametrize("args, message", [
    ((8, 0, 1), "replicas must be a positive whole number, got 0"),
    ((8, 4, 0), "hosts must be a positive whole number, got 0"),
    ((8, 4, 3), "--replicas 4 does not spread evenly over --hosts 3.*Use --hosts 1, 2, 4, or --replicas 6"),
    ((6, 4, 1), "--batch-size 6 is the global batch and does not split over 4 replicas.*Use --batch-size 8 or 4"),
    ((3, 4, 1), "multiple of 4. Use --batch-size 4.$"),
])
def test_uneven_splits_are_refused_with_the_fix(args, message):
    with pytest.raises(ValueError, match=message):
        replicas.plan(DEC, args[0], S, args[1], args[2])


def test_an_unknown_fused_clip_is_refused():
    with pytest.raises(ValueError, match="Unknown fused clip 'exact'"):
        replicas.plan(DEC, 4, S, 2, fused_clip="exact", checkpointing="full+fused")


def test_cli_plan_replicas(capsys):
    budget = 22 * GiB
    assert main(["plan", "dec-1b", "--batch-size", "8", "--replicas", "2", "--precision", "mixed_bfloat16",
                 "--budget", "22GiB", "--checkpointing", "full+fused"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("dec-1b: global batch 8 = 2 replicas x 4 on 1 host, sequence 512, mixed_bfloat16, adamw; "
                      "budget 22.00 GiB per replica")
    p = replicas.plan("dec-1b", 8, 512, 2, precision="mixed_bfloat16", checkpointing="full+fused")
    most = memory.largest_batch("dec-1b", 512, budget, precision="mixed_bfloat16", checkpointing="full+fused",
                                replicas=2)
    assert out[2].split() == (["full+fused"] + [f"{v / GiB:.2f}G" for v in p.estimate.as_dict().values()]
                              + [str(most)])
    row = out[out.index(next(r for r in out if r.startswith("config      per replica"))) + 1].split()
    assert row[:11] == ["full+fused", f"{p.per_replica / GiB:.2f}G", "8", "=", "2x4", f"{8 * DEC_1B / GiB:.2f}G",
                        f"{8 * DEC_1B / GiB:.2f}G", "0.00G", str(2 * most), "=", f"2x{most}"]
    assert "twice" in out[-2] and out[-1].startswith(f"auto: full+fused ({p.per_replica / GiB:.2f} GiB of 22.00 GiB); "
                                                     "its process's planned peak RSS ")
    # The largest per-replica batch is the one-device search's, under the per-replica peak.
    fits = memory.estimate("dec-1b", most, 512, "mixed_bfloat16", "full+fused", replicas=2).total
    assert fits <= budget < memory.estimate("dec-1b", most + 1, 512, "mixed_bfloat16", "full+fused", replicas=2).total


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "replicas must be a positive whole number, got 0"),
    (["--replicas", "4", "--hosts", "3"], "Use --hosts 1, 2, 4"),
    (["--replicas", "3"], "--batch-size 8 is the global batch and does not split over 3 replicas"),
])
def test_cli_plan_refuses_uneven_replicas(flags, message, capsys):
    assert main(["plan", "dec-1b", "--batch-size", "8", "--checkpointing", "full", *flags]) == 2
    assert message in capsys.readouterr().err
