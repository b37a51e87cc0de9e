"""Peak memory is measured on every CPU and in every import order (zoo.memory.measure).

The default process of the suite keeps TensorFlow's allocator statistics (tests/conftest.py); the other cases need a
fresh process each, since TensorFlow picks its CPU allocator once, when it first makes its devices: oneDNN off (as
on every CPU without AVX-512 VNNI / AMX) with TensorFlow imported before zoo, and a process whose devices were made
before zoo was imported with no BFC allocator, where the measure falls back to peak RSS and says so.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.common import REPO, fresh_process_env
from zoo.memory import PeakMemory
from zoo.memory.measure import ALLOCATOR, RSS

MiB = 2**20

# A child's script: 64 MiB allocated and touched inside the measured block.
CHILD = """
import json, os, sys
{prelude}
import zoo
with zoo.memory.PeakMemory("CPU:0") as peak:
    x = tf.random.uniform([16 * 1024 * 1024]) + 1.0   # 64 MiB, every page written
    float(tf.reduce_sum(x))
print(json.dumps({{"measure": peak.measure, "used": peak.used_bytes, "peak": peak.peak_bytes}}))
"""


def run_child(prelude, **env):
    environ = fresh_process_env(without=("TF_CPU_ALLOCATOR_USE_BFC", "TF_ENABLE_ONEDNN_OPTS"), **env)
    done = subprocess.run([sys.executable, "-c", CHILD.format(prelude=prelude)], capture_output=True, text=True,
                          env=environ, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_allocator_peak_in_this_process():
    with PeakMemory() as peak:
        x = tf.random.uniform([4 * MiB]) + 1.0  # 16 MiB
        float(tf.reduce_sum(x))
    assert peak.measure == ALLOCATOR
    assert 16 * MiB <= peak.used_bytes < 64 * MiB, peak.used_bytes
    assert "GiB (TensorFlow allocator peak)" in peak.describe()


def test_onednn_off_and_tensorflow_imported_first_still_measure_the_allocator():
    """A CPU without AVX-512 VNNI (or TF_ENABLE_ONEDNN_OPTS=0), and a user who imported TensorFlow before zoo:
    the allocator statistics come from zoo's TF_CPU_ALLOCATOR_USE_BFC default, read when the devices are made."""
    out = run_child("import tensorflow as tf, keras", TF_ENABLE_ONEDNN_OPTS="0")
    assert out["measure"] == ALLOCATOR, out
    assert 64 * MiB <= out["used"] < 256 * MiB, out


def test_no_allocator_statistics_falls_back_to_peak_rss_and_says_so():
    """TensorFlow's devices made before zoo was imported, oneDNN off: no statistics can be had in this process.
    The measure is peak RSS (reset at the block's start), named as such, and it saw the 64 MiB."""
    out = run_child("import tensorflow as tf; tf.constant(1.0) + 1.0", TF_ENABLE_ONEDNN_OPTS="0")
    assert out["measure"] == RSS, out
    assert 64 * MiB <= out["used"] < 512 * MiB, out


def test_zoo_train_reports_which_measure_it_used(tmp_path, monkeypatch, capsys):
    """`zoo train` where TensorFlow keeps no allocator statistics (the case above, stood in for in this process):
    the run goes on, and its summary says which measure the peak is."""
    import zoo.cli
    from zoo.memory import measure

    monkeypatch.setattr(measure, "allocator_available", lambda device: False)
    rng = np.random.default_rng(0)
    words = ["the", "markets", "opened", "higher", "today", "as", "investors", "weighed", "news", "of", "rates"]
    (tmp_path / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words, 40)) for _ in range(64)))
    code = zoo.cli.main(
        ["train", "dec-base", "--data", str(tmp_path / "corpus.txt"), "--out-dir", str(tmp_path / "run"),
         "--steps", "2", "--batch-size", "2", "--sequence-length", "16", "--log-every", "1",
         "--checkpoint-every", "2", "--warmup-steps", "0", "--precision", "float32",
         "--override", "num_layers=1", "--override", "hidden_dim=32", "--override", "num_heads=2",
         "--override", "num_kv_heads=1", "--override", "intermediate_dim=64", "--override", "vocab_size=300"])
    out = capsys.readouterr().out
    assert code == 0
    line = json.loads(out.strip().splitlines()[-1])
    assert line["peak_measure"] in (measure.RSS, measure.RSS_SINCE_START) and line["peak_bytes"] > 100 * MiB, line
    assert "TensorFlow keeps no allocator statistics" in out


def onednn_on() -> bool:
    """Whether this process runs TensorFlow's oneDNN kernels (its default on CPUs with AVX-512 VNNI / AMX)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def test_memory_tests_hold_with_onednn_flipped(request):
    """Every memory test (marked `memory`) again, in a process with oneDNN the other way round from this one's: the
    suite itself runs as this CPU's TensorFlow picks (on with AVX-512 VNNI / AMX, off elsewhere), so on every machine
    the allocator bounds are checked under both kernels libraries, whose workspaces differ."""
    flipped = "0" if onednn_on() else "1"
    env = fresh_process_env(TF_ENABLE_ONEDNN_OPTS=flipped)
    # The memory tests this session collected (a run of a few files flips theirs); where it collected none
    # (`pytest tests/zoo/test_measure.py` alone), every one, from the files that hold them (collecting only these
    # files: the rest's imports cost seconds).
    marked = [item.nodeid for item in request.session.items if item.get_closest_marker("memory")]
    targets = marked or sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py")
                               if "mark.memory" in path.read_text())
    done = subprocess.run([sys.executable, "-m", "pytest", *targets, "-m", "memory", "-o", "addopts=", "-q",
                           "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"],  # one process
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    tail = done.stdout[-4000:]
    assert done.returncode == 0, f"with TF_ENABLE_ONEDNN_OPTS={flipped}:\n{tail}\n{done.stderr[-2000:]}"
    # Every one of them ran there and passed, none skipped.
    passed = rf"\b{len(marked)} passed\b" if marked else r"\b[1-9]\d* passed\b"
    assert re.search(passed, tail) and " failed" not in tail and " skipped" not in tail, (marked, tail)


@pytest.mark.memory
def test_memory_tests_measure_with_grappler_on():
    """What a graph keeps depends on TensorFlow's graph optimizer (constant folding: docs/design-notes.md), so a
    memory test measures with it on, as a user's process runs; tests/conftest.py turns it off elsewhere."""
    assert tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False) is False


def test_other_tests_run_without_grappler_unless_asked():
    expected = os.environ.get("ZOO_TEST_GRAPPLER", "0") != "1"
    assert tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False) is expected
