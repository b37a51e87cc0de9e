"""The analytical memory model and the `zoo` CLI around it."""

import subprocess
import sys

import pytest

import zoo
from zoo import memory


def test_estimate_orders_policies_and_scales_with_batch():
    e = {p: memory.estimate("enc-base", 4, 512, "float32", p) for p in zoo.POLICIES}
    assert e["full"].activations < e["selective"].activations < e["none"].activations
    assert e["none"].weights == zoo.spec("enc-base").num_params() * 4
    assert e["none"].optimizer == 2 * e["none"].weights  # Adam's two fp32 moments
    small, big = (memory.estimate("dec-base", b, 512, "mixed_bfloat16", "none") for b in (2, 4))
    assert big.activations == 2 * small.activations and big.logits == 2 * small.logits


def test_largest_batch_is_the_last_that_fits():
    budget = 24 * memory.GiB
    b = memory.largest_batch("enc-1b", 512, budget, precision="mixed_bfloat16", checkpointing="full")
    assert b >= 1
    assert memory.estimate("enc-1b", b, 512, "mixed_bfloat16", "full").total <= budget
    assert memory.estimate("enc-1b", b + 1, 512, "mixed_bfloat16", "full").total > budget
    assert memory.largest_batch("enc-1b", 512, 1 * memory.GiB) == 0


def zoo_cli(*args):
    return subprocess.run([sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True)


def test_cli_list_info_plan():
    out = zoo_cli("list")
    assert out.returncode == 0 and all(name in out.stdout for name in zoo.names())
    out = zoo_cli("info", "dec-1b")
    assert out.returncode == 0 and '"num_params": 1100048384' in out.stdout
    out = zoo_cli("plan", "enc-1b", "--batch-size", "2", "--precision", "mixed_bfloat16")
    assert out.returncode == 0 and all(p in out.stdout for p in zoo.POLICIES)


@pytest.mark.parametrize("args", [("info", "enc-xl"), ("plan", "enc-xl")])
def test_cli_unknown_model_lists_known(args):
    out = zoo_cli(*args)
    assert out.returncode == 2 and "enc-base" in out.stderr and "enc-xl" in out.stderr
