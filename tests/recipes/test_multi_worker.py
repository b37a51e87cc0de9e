"""Two real worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy from TF_CONFIG)
train a tiny decoder on real news text with `zoo train ... --strategy multi-worker`.

The reference is the same command on one process (same recipe, global batch and data
order). Both workers share the out_dir, as hosts share storage; only the chief writes
into it. Killing a worker makes both processes fail with a message that says how to
resume, and the same two commands then finish the run where the last checkpoint left it.
Under the fused update, a worker that stops without dying (SIGSTOP) is caught by the
coordination service or --collective-timeout; the same commands resume, and a worker whose
main thread then hangs is caught by the step watchdog, after the resumed run wrote a
checkpoint equal to one fused process's.

Each pair of processes costs about a minute (imports, the tokenizing pipeline, tracing),
so the stopped and the hung worker share one chain of runs: the hung run is the stopped
run's resumption. The one-process references are made in this test process while that chain's
workers sit idle, waiting for the chief to notice the stopped and the hung worker (`References`).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from recipes import distribute, state
from tests.common import REPO, TINY_RECIPE_DEC, fresh_process_env

STEPS = 6  # checkpoints at 2, 4, 6 (keep 2 after pruning)
# --collective-timeout of the stopped and hung workers' runs, seconds. It bounds every step after the first: the
# longest here is a paused one (pause_after: a 2 s sleep inside the step's bound, plus a tiny step, < 1 s even on
# a loaded machine), so 8 s leaves 5 s; checkpoints are written between steps, outside the bound.
TIMEOUT = 8
# How long past --collective-timeout the chief may take to say that the run stopped: the watchdog's 1 s tick,
# and a loaded machine's scheduling (measured at --collective-timeout 15: the message 6-10 s after a SIGSTOP,
# 15.4 s after a hang).
MARGIN = 10


def args(out_dir, data, vocabulary, fused=False):
    """The non-fused run accumulates 2 micro-batches per update; the fused one cannot (zoo.checks.fused)."""
    shape = {**TINY_RECIPE_DEC, "dropout": 0.1, "num_layers": 1}  # one block: what a worker runs per block
    argv = ["train", "dec-base", "--data", data, "--text-column", "text", "--vocabulary", vocabulary,
            "--out-dir", str(out_dir), "--steps", str(STEPS), "--batch-size", "4", "--sequence-length", "32",
            "--log-every", "2", "--checkpoint-every", "2", "--learning-rate", "1e-3",
            "--precision", "float32"]  # bfloat16 rounds per replica: test_distribute.py bounds it
    argv += ["--checkpointing", "full", "--fused", "--accumulation-steps", "1"] if fused else [
        "--accumulation-steps", "2"]
    return argv + [a for key, value in shape.items() for a in ("--override", f"{key}={value}")]


def start_workers(argv, tmp_path, name, pause_after=None, hang_at=None):
    """Two `zoo train` processes, task 0 (the chief) and task 1 (whose main thread stops for good
    after step `hang_at`, if given); each with its own TMPDIR."""
    command = [sys.executable, "-m", "tests.recipes.distribute_child", "cli", str(pause_after or 0), *argv,
               "--strategy", "multi-worker"]
    workers = []
    for index, tf_config in enumerate(distribute.local_tf_configs(2)):
        scratch = tmp_path / f"{name}-tmp-{index}"
        scratch.mkdir()
        env = fresh_process_env(TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(scratch), TF_CONFIG=tf_config,
                                PYTHONUNBUFFERED="1")  # killed too
        if hang_at and index == 1:
            env.update(HANG_AT_STEP=str(hang_at), HANG_MARKER=str(tmp_path / f"{name}-hanging"))
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


def wait_for_first_checkpoint(out, workers):
    """Past step 2 each batch sleeps (pause_after=2, 2 s): what a test does to a worker lands mid-run,
    before the step-4 checkpoint."""
    first = out / "checkpoints" / "step-000000002"
    deadline = time.monotonic() + 180
    while not first.exists() and time.monotonic() < deadline and all(p.poll() is None for p, _ in workers):
        time.sleep(0.2)
    if not first.exists():  # end the workers, or they outlive the test
        for process, _ in workers:
            process.kill()
        chief_log = workers[0][1]
        chief_log.seek(0)
        raise AssertionError(f"no checkpoint (a worker exited, or 180 s passed): {chief_log.read()[-3000:]}")


def seconds_until_stopped(chief, since, timeout):
    """Seconds from `since` until the chief's log says the run stopped (None: not within `timeout`). The
    message is when training stops; the process may exit seconds later (TensorFlow's teardown waits for
    the stopped peer), which a loaded machine stretches: the bound is on the message."""
    process, log = chief
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log.name) as f:
            if "zoo train: error: Multi-worker training stopped:" in f.read():
                return time.monotonic() - since
        if process.poll() is not None:
            return None
        time.sleep(0.2)
    return None


def while_watching(chief, since, timeout, work):
    """`seconds_until_stopped(chief, since, timeout)`, watched from a thread while `work()` runs here: the
    workers wait idle for the chief to notice (a stopped or hung peer), time a reference run can use."""
    seconds = []
    watcher = threading.Thread(target=lambda: seconds.append(seconds_until_stopped(chief, since, timeout)))
    watcher.start()
    try:
        work()
    finally:
        watcher.join()
    return seconds[0]


def resume_and_finish(argv, tmp_path, out, stopped_at):
    """The same two commands again: both resume from `stopped_at` and end at STEPS."""
    resumed = start_workers(argv, tmp_path, "resumed")
    results = finish(resumed, timeout=240)
    for code, output in results:
        assert code == 0, output[-4000:]
        assert f"Resuming dec-base from step {stopped_at}" in output
    assert json.loads(results[0][1].strip().splitlines()[-1])["steps"] == STEPS
    return resumed


def weights(out_dir, step):
    folder = dict(state.checkpoints(str(out_dir)))[step]
    return load_file(os.path.join(folder, "model.safetensors"))


def assert_equal_to(out_dir, reference, step=STEPS):
    """The checkpoint of `step` in both runs (the reference keeps steps 4 and 6)."""
    got, expected = weights(out_dir, step), weights(reference, step)
    assert sorted(got) == sorted(expected)
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


class References:
    """The same command on one process, in this one, per update (fused or not): made when first asked for and
    kept. The stopped/hung test (first in this file) makes both while its workers wait idle; the killed test
    reads the non-fused one, or makes it when run alone."""

    def __init__(self, tmp_path_factory, recipes_news, recipes_vocab):
        self.tmp_path_factory, self.data, self.vocabulary = tmp_path_factory, recipes_news, recipes_vocab["llama"]
        self.runs = {}

    def __call__(self, fused):
        if fused not in self.runs:
            from zoo.cli import main

            out = self.tmp_path_factory.mktemp("one-process") / "run"
            assert main(args(out, self.data, self.vocabulary, fused)) == 0
            self.runs[fused] = out
        return self.runs[fused]


@pytest.fixture(scope="module")
def references(tmp_path_factory, recipes_news, recipes_vocab):
    return References(tmp_path_factory, recipes_news, recipes_vocab)


@pytest.mark.timeout(480)  # both references are made in it (`References`)
def test_a_stopped_then_a_hung_worker_are_caught_and_fused_workers_resume(
        tmp_path, recipes_news, recipes_vocab, references):
    """Two workers under the fused update (each block's gradients all-reduced as they appear).
    1. Worker 1 is stopped (SIGSTOP: alive, its connections open) after the step-2 checkpoint. The chief
    says the run stopped, with the lost-worker message, within --collective-timeout plus a margin: the
    step watchdog (8 s) or TensorFlow's coordination service (the stopped heartbeats, ~10 s), whichever
    fires first; it exits with the lost-worker code. Woken (SIGCONT), worker 1 stops too.
    2. The same commands resume from step 2 and write the step-4 checkpoint, equal to one fused process's;
    after step 5, worker 1's main thread stops for good while its other threads (TensorFlow's heartbeats)
    go on: no collective fails and the coordination service sees a healthy task. The chief's step watchdog
    ends the chief within --collective-timeout plus its 1 s tick, with the lost-worker message and exit
    code. Step 5, not 4: an epoch here is 2 steps (--log-every), and after an epoch's last step the chief
    waits outside a step, which the watchdog does not bound (a hang after step 4 was caught after 22 s,
    by the coordination service, once worker 1's own watchdog had ended it).
    While the chief has yet to notice the stopped worker, then the hung one, this process makes the
    references (`References`), on a thread's watch."""
    out = tmp_path / "run"
    argv = args(out, recipes_news, recipes_vocab["llama"], fused=True) + ["--collective-timeout", str(TIMEOUT)]
    workers = start_workers(argv, tmp_path, "stopped", pause_after=2)
    wait_for_first_checkpoint(out, workers)
    workers[1][0].send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        caught_after = while_watching(workers[0], stopped, TIMEOUT + 60, lambda: references(fused=False))
    finally:
        workers[1][0].send_signal(signal.SIGCONT)
    stopped_at = state.checkpoints(str(out))[-1][0]
    # Training has stopped and nothing more is written, but the processes take seconds to exit
    # (seconds_until_stopped): the resumed pair starts meanwhile.
    resumed = start_workers(argv, tmp_path, "hung", hang_at=5) if caught_after is not None and stopped_at == 2 else []
    try:
        (chief_code, chief_output), (worker_code, worker_output) = finish(workers, timeout=90)
        print(f"a stopped worker was caught after {caught_after} s; the chief exited after "
              f"{time.monotonic() - stopped:.1f} s (--collective-timeout {TIMEOUT})")
        assert chief_code == 3 and caught_after is not None and caught_after < TIMEOUT + MARGIN, (
            caught_after, chief_output[-3000:])
        assert "Start the same command again on every host to resume" in chief_output
        assert worker_code == 3, worker_output[-3000:]
        assert stopped_at == 2, "the stop landed after step 4, though each batch past step 2 sleeps 2 s"

        marker, deadline = tmp_path / "hung-hanging", time.monotonic() + 180
        while not marker.exists() and time.monotonic() < deadline and resumed[1][0].poll() is None:
            time.sleep(0.2)
        assert marker.exists(), "worker 1 never reached step 5"
        hung = time.monotonic()
        caught_after = while_watching(resumed[0], hung, TIMEOUT + 60, lambda: references(fused=True))
        (chief_code, chief_output), = finish(resumed[:1], timeout=30)  # the watchdog exits at once
    finally:
        for process, _ in resumed:  # the hung worker 1; both, if an assert above failed
            if process.poll() is None:
                process.kill()
    (_, worker_output), = finish(resumed[1:], timeout=30)
    print(f"a hung worker was caught after {caught_after} s (--collective-timeout {TIMEOUT})")
    assert chief_code == 3 and caught_after is not None and caught_after < TIMEOUT + MARGIN, (
        caught_after, chief_output[-3000:])
    assert f"no step finished within --collective-timeout {TIMEOUT:g} s" in chief_output, chief_output[-3000:]
    assert "Start the same command again on every host to resume from the last checkpoint" in chief_output
    for output in (chief_output, worker_output):
        assert "Resuming dec-base from step 2" in output, output[-3000:]
    assert [step for step, _ in state.checkpoints(str(out))] == [2, 4]
    assert_equal_to(out, references(fused=True), step=4)


@pytest.mark.timeout(400)
def test_a_killed_worker_fails_both_and_the_same_commands_resume(tmp_path, recipes_news, recipes_vocab, references):
    """Two workers killed mid-run and started again end equal to one process (an uninterrupted pair of
    workers is the same run without the kill, so it is not run separately), and only the chief wrote."""
    out = tmp_path / "run"
    argv = args(out, recipes_news, recipes_vocab["llama"])
    # Past step 2, each batch sleeps: the kill lands mid-run, after the first checkpoint.
    workers = start_workers(argv, tmp_path, "killed", pause_after=2)
    wait_for_first_checkpoint(out, workers)
    workers[1][0].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    (chief_code, chief_output), (worker_code, _) = finish(workers, timeout=120)
    assert worker_code == -signal.SIGKILL
    assert chief_code == 3 and time.monotonic() - killed_at < 120, chief_output[-3000:]
    assert "another worker died or became unreachable" in chief_output, chief_output[-3000:]
    assert "Start the same command again on every host to resume" in chief_output
    stopped_at = state.checkpoints(str(out))[-1][0]
    assert 2 <= stopped_at < STEPS

    resumed = resume_and_finish(argv, tmp_path, out, stopped_at)
    assert_equal_to(out, references(fused=False))
    assert_only_the_chief_wrote(out, {workers[0][0].pid, resumed[0][0].pid}, tmp_path, "resumed")


def test_collective_timeout_is_checked():
    with pytest.raises(ValueError, match="collective_timeout must be a positive number of seconds, got 0"):
        distribute.make("multi-worker", collective_timeout=0)
    with pytest.raises(ValueError, match="applies to --strategy multi-worker only"):
        distribute.make("mirrored", collective_timeout=30)
