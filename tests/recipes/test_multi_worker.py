"""Two real worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy from TF_CONFIG)
train a tiny decoder on real news text with `zoo train ... --strategy multi-worker`.

The reference is the same command on one process (same recipe, global batch and data
order). Both workers share the out_dir, as hosts share storage; only the chief writes
into it. Killing a worker makes both processes fail with a message that says how to
resume, and the same two commands then finish the run where the last checkpoint left it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from recipes import distribute, state
from tests.common import REPO, TINY_RECIPE_DEC
from tests.recipes.test_distribute import child_env

STEPS = 6  # checkpoints at 2, 4, 6 (keep 2 after pruning)


def args(out_dir, data, vocabulary):
    shape = {**TINY_RECIPE_DEC, "dropout": 0.1}
    argv = ["train", "dec-base", "--data", data, "--text-column", "text", "--vocabulary", vocabulary,
            "--out-dir", str(out_dir), "--steps", str(STEPS), "--batch-size", "4", "--accumulation-steps", "2",
            "--sequence-length", "32", "--log-every", "2", "--checkpoint-every", "2", "--learning-rate", "1e-3",
            "--precision", "float32"]  # bfloat16 rounds per replica: test_distribute.py bounds it
    return argv + [a for key, value in shape.items() for a in ("--override", f"{key}={value}")]


def start_workers(argv, tmp_path, name, pause_after=None):
    """Two `zoo train` processes, task 0 (the chief) and task 1; each with its own TMPDIR."""
    command = [sys.executable, "-m", "tests.recipes.distribute_child", "cli", str(pause_after or 0), *argv,
               "--strategy", "multi-worker"]
    workers = []
    for index, tf_config in enumerate(distribute.local_tf_configs(2)):
        scratch = tmp_path / f"{name}-tmp-{index}"
        scratch.mkdir()
        env = {**child_env(), "TMPDIR": str(scratch), "TF_CONFIG": tf_config}
        log = open(tmp_path / f"{name}-{index}.log", "w+")
        workers.append((subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log))
    return workers


def finish(workers, timeout):
    """[(return code, output)] of each worker; kills them all if one outlives `timeout`."""
    deadline, results = time.monotonic() + timeout, []
    try:
        for process, log in workers:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
            log.seek(0)
            results.append((process.returncode, log.read()))
    finally:
        for process, _ in workers:
            if process.poll() is None:
                process.kill()
    return results


def final_weights(out_dir):
    step, folder = state.checkpoints(str(out_dir))[-1]
    return step, load_file(os.path.join(folder, "model.safetensors"))


def assert_equal_to(out_dir, reference):
    step, got = final_weights(out_dir)
    ref_step, expected = final_weights(reference)
    assert step == ref_step == STEPS and sorted(got) == sorted(expected)
    # Per variable, |difference| / |weight| in the 2-norm. The elementwise maximum is not a fair measure here:
    # Adam divides each element's step by that element's own gradient scale, so an element whose gradient is
    # float rounding noise (summing two half-batches vs one batch: ~1e-7 relative) moves by up to ±lr either
    # way; over 6 steps a few elements end ~2e-5 of the largest weight apart, while the norm stays ~1e-7.
    worst = max(float(np.linalg.norm(got[k] - v) / max(np.linalg.norm(v), 1e-12)) for k, v in expected.items())
    print(f"two workers vs one process: |difference| / |weight| <= {worst:.1e}")
    assert worst < 1e-5


def assert_only_the_chief_wrote(out_dir, chief_pids, tmp_path, name):
    assert sorted(os.listdir(out_dir)) == ["checkpoints", "logs", "model.keras", "run.json", "tokenizer"]
    assert [step for step, _ in state.checkpoints(str(out_dir))] == [4, 6]
    assert sorted(os.listdir(out_dir / "checkpoints")) == ["step-000000004", "step-000000006"]
    events = os.listdir(out_dir / "logs")
    assert events and all(any(f".{pid}." in event for pid in chief_pids) for event in events), events  # chiefs'
    for index in range(2):  # a worker's scratch out_dir is removed
        assert not [n for n in os.listdir(tmp_path / f"{name}-tmp-{index}") if n.startswith("recipes-")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, recipes_news, recipes_vocab):
    """The same command on one process, in this one."""
    from zoo.cli import main

    out = tmp_path_factory.mktemp("one-process") / "run"
    assert main(args(out, recipes_news, recipes_vocab["llama"])) == 0
    return out


@pytest.mark.timeout(400)
def test_a_killed_worker_fails_both_and_the_same_commands_resume(tmp_path, recipes_news, recipes_vocab, reference):
    """Two workers killed mid-run and started again end equal to one process (an uninterrupted pair of
    workers is the same run without the kill, so it is not run separately), and only the chief wrote."""
    out = tmp_path / "run"
    argv = args(out, recipes_news, recipes_vocab["llama"])
    # Past step 2, each batch sleeps: the kill lands mid-run, after the first checkpoint.
    workers = start_workers(argv, tmp_path, "killed", pause_after=2)
    first = out / "checkpoints" / "step-000000002"
    deadline = time.monotonic() + 180
    while not first.exists() and time.monotonic() < deadline and all(p.poll() is None for p, _ in workers):
        time.sleep(0.2)
    assert first.exists(), "the chief wrote no checkpoint"
    workers[1][0].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    (chief_code, chief_output), (worker_code, _) = finish(workers, timeout=120)
    assert worker_code == -signal.SIGKILL
    assert chief_code == 3 and time.monotonic() - killed_at < 120, chief_output[-3000:]
    assert "another worker died or became unreachable" in chief_output, chief_output[-3000:]
    assert "Start the same command again on every host to resume" in chief_output
    stopped_at = state.checkpoints(str(out))[-1][0]
    assert 2 <= stopped_at < STEPS

    resumed = start_workers(argv, tmp_path, "resumed")
    results = finish(resumed, timeout=240)
    for code, output in results:
        assert code == 0, output[-4000:]
        assert f"Resuming dec-base from step {stopped_at}" in output
    assert json.loads(results[0][1].strip().splitlines()[-1])["steps"] == STEPS
    assert_equal_to(out, reference)
    assert_only_the_chief_wrote(out, {workers[0][0].pid, resumed[0][0].pid}, tmp_path, "resumed")
