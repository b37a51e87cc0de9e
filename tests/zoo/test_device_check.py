"""benchmarks/device_check.py, the check prepared for the first accelerator, cannot rot: its --quick mode runs
on this CPU (tiny shapes) and passes, its exactness parts fail when a result is wrong, and its kernel-registry
reading tells an op that has a GPU kernel from one that has none."""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf

import zoo.registry
from tests.common import REPO


@pytest.fixture(scope="module")
def device_check():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import device_check

        yield device_check
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.fixture(autouse=True)
def zoo_names_kept(monkeypatch):
    """The tiny decoder that the check registers (its speed rows and planner) is dropped after each test, so
    that no later test in this process sees it among the zoo's names."""
    monkeypatch.setattr(zoo.registry._MODELS, "_items", dict(zoo.registry._MODELS._items))


def test_quick_check_passes_on_the_cpu(device_check, tmp_path, capsys, monkeypatch):
    """`main` in this process, as the script would run it: its placement part still starts the fresh process
    it needs (`_harness.run_child` starts the running script, so device_check stands as `__main__`)."""
    monkeypatch.setitem(sys.modules, "__main__", device_check)
    out = tmp_path / "device_check.json"
    assert device_check.main(["--quick", "--out", str(out)]) == 0, capsys.readouterr().out[-3000:]
    assert "| part | status | s | detail |" in capsys.readouterr().out  # the table
    report = json.loads(out.read_text())
    results = {r["part"]: r for r in report["results"]}
    assert {r["status"] for r in results.values()} <= {"ok", "skipped"}, results
    assert all(results[p]["status"] == "ok" for p in ("environment", "kernels:held-masks", "exact:gradients-function",
                                                      "exact:held-masks", "placement:full-step",
                                                      "placement:fused-step"))
    # XLA is left to the full check (tests/zoo/test_recompute.py's jit case checks XLA gradients in CI)
    assert results["exact:gradients-xla"]["status"] == results["speed:dec-base-bf16-xla"]["status"] == "skipped"
    for name in ("exact:fused-equals-fit", "exact:lora-int4", "exact:chunked-loss"):  # looked up; CI runs them
        assert results[name]["status"] == "skipped" and "CI runs it in tests/zoo/" in results[name]["detail"]
    masks = results["kernels:held-masks"]["detail"]
    assert "Mul(T=uint64)" in masks["uint64_ops"] and "Bitcast(T=uint8,type=uint64)" in masks["ops"]
    for name in ("placement:full-step", "placement:fused-step"):
        placed = results[name]["detail"]
        assert placed["device"] == "CPU:0" and placed["nodes_by_device"]["CPU"] > 100, placed["nodes_by_device"]
    rows = [row for r in results.values() if r["part"].startswith("speed:") and r["status"] == "ok"
            for row in r["detail"]["rows"]]
    assert rows and all(row["tokens_per_s"] > 0 for row in rows)
    assert {row["jit_compile"] for row in rows} == {False}


def test_a_wrong_gradient_fails_the_gradient_part(device_check, monkeypatch):
    """One variable's gradient off by 1e-3 of its scale under recomputation: the part fails, naming it."""
    from tests.zoo import test_recompute

    real = test_recompute.gradients

    def wrong(name, policy, *args, **kwargs):
        grads = real(name, policy, *args, **kwargs)
        if policy != "none":
            path = next(iter(grads))
            grads[path] = grads[path] + 1e-3 * np.abs(grads[path]).max()
        return grads

    monkeypatch.setattr(test_recompute, "gradients", wrong)
    result = device_check.run_part("exact:gradients-function", quick=True)
    assert result["status"] == "failed" and "against none:plain" in result["detail"], result


def test_a_check_it_cannot_call_fails_its_part_even_under_quick(device_check, monkeypatch):
    """--quick skips the checks CI runs in their own files, but a renamed one, or one whose parameters changed,
    still fails its part: the full check on a GPU would not find it."""
    from tests.zoo import test_lm_loss, test_lora

    monkeypatch.delattr(test_lora, "test_full_recomputation_gives_the_same_adapter_gradients")
    result = device_check.run_part("exact:lora-int4", quick=True)
    assert result["status"] == "failed" and "test_full_recomputation_gives_the_same_adapter_gradients" in result[
        "detail"], result
    monkeypatch.setattr(test_lm_loss, "test_equals_unchunked_fp32", lambda tied, seq: None)
    result = device_check.run_part("exact:chunked-loss", quick=True)
    assert result["status"] == "failed" and "too many positional arguments" in result["detail"], result


def test_a_wrong_held_mask_fails_the_mask_part(device_check, monkeypatch):
    from zoo.ops import dropout

    real = dropout.unpack_bits
    monkeypatch.setattr(dropout, "unpack_bits", lambda bits, shape: tf.logical_not(real(bits, shape)))
    result = device_check.run_part("exact:held-masks", quick=True)
    assert result["status"] == "failed", result


def test_the_registry_tells_ops_without_a_gpu_kernel(device_check):
    def graph(fn, *specs):
        return tf.function(fn).get_concrete_function(*specs).graph.as_graph_def()

    words = device_check.gpu_kernels(graph(lambda x: x * tf.constant(3, tf.uint64), tf.TensorSpec([4], tf.uint64)))
    assert words["Mul(T=uint64)"]["gpu_kernel"]
    text = device_check.gpu_kernels(graph(lambda x: tf.strings.as_string(x), tf.TensorSpec([4], tf.float32)))
    assert not text["AsString(T=float32)"]["gpu_kernel"]


def test_a_failing_row_keeps_the_others_and_a_spent_budget_skips(device_check, monkeypatch, capsys):
    def row(model, batch, seq, precision, variant, steps, jit_compile):
        if variant != "keras-hub":
            raise RuntimeError("no kernel for this")
        return dict(model=model, batch=batch, seq=seq, precision=precision, jit_compile=jit_compile, device="CPU:0",
                    step_s=0.5, first_step_s=1.0, tokens_per_s=batch * seq / 0.5, step_mem_gib=0.1,
                    allocator_peak_gib=0.2, loss=1.0)

    monkeypatch.setattr(device_check, "speed_row", row)
    result = device_check.run_part("speed:dec-base-bf16", quick=True)
    assert result["status"] == "failed" and "no kernel for this" in result["detail"]["error"], result
    assert [r["variant"] for r in result["detail"]["rows"]] == ["keras-hub", "full+fused"]
    device_check.print_tables([result])
    assert "| speed:dec-base-bf16 | device-check-tiny | 2 x 32 | keras-hub |" in capsys.readouterr().out
    spent = device_check.run(["environment", "speed:dec-base-bf16"], quick=True, budget=0)
    assert [r["status"] for r in spent] == ["skipped", "skipped"], spent
