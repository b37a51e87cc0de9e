"""MirroredStrategy on two logical CPU devices trains what one device trains (`fit`, the fused
update, each recipe optimizer), and bad strategy input is refused by name.

Logical devices must be configured before TensorFlow starts, and this test worker's
TensorFlow may already run, so the training runs in one child process
(`python -m tests.recipes.distribute_child mirrored`), whose report every test here reads
(one process: TensorFlow and zoo are imported once). Per `fit` scenario it compares one device
with two replicas: 3 optimizer steps with the recipe's AdamW (global-norm clipping 1.0),
dropout 0.1, from the same seed on the same global batches of 4.

Why exact: replica r takes rows [2r, 2r+2) of each batch, draws the dropout masks of
exactly those rows (zoo/ops/dropout.py), and the optimizer sums the replicas'
gradients before clipping and accumulating (recipes/optim.py). What remains is float
rounding: in float32 the sum of two half-batch gradients differs from the whole
batch's by ~1e-7. In mixed_bfloat16 each replica's weight gradient comes out of a
bfloat16 matmul, rounded to bfloat16 (8 bits: 2^-8 = 3.9e-3) before the two are
summed; one device rounds the whole batch's sum once. On one device without any
strategy, batch 4 vs 2+2 summed already differs by 2.6e-3 (docs/design-notes.md), so
bfloat16 cannot meet 1e-5 by construction; its bound is bfloat16's precision.
"""

import json
import subprocess
import sys

import pytest

from recipes import distribute
from tests.common import REPO, fresh_process_env
from tests.recipes.distribute_child import SCENARIOS
from zoo.memory.optimizer_state import RECIPE_OPTIMIZERS

FLOAT32_REL = 1e-5  # max |difference| / max |weight|, per variable
BF16_REL, BF16_NORM_REL = 3e-2, 2e-3  # bfloat16 gradients are rounded per replica (module notes)
CHILD_TIMEOUT = 1200  # seconds, for a test that reads the child's report (made in the first one's setup)


def child_report(tmp_path_factory, mode):
    """The JSON report of `python -m tests.recipes.distribute_child MODE`: ~90 s alone on 2 cores, 14 minutes
    seen on a machine loaded 7-fold (CHILD_TIMEOUT: a bound for a hung child, not for a slow one)."""
    out = tmp_path_factory.mktemp(mode) / "report.json"
    done = subprocess.run([sys.executable, "-m", "tests.recipes.distribute_child", mode, str(out)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT - 60, cwd=REPO,
                          env=fresh_process_env(TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """{"fit": ..., "fused": ..., "optimizers": ..., "seconds": ...} (tests/recipes/distribute_child.py)."""
    report = child_report(tmp_path_factory, "mirrored")
    print(f"the mirrored child's seconds per part: {report['seconds']}")
    return report


@pytest.mark.timeout(CHILD_TIMEOUT)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_mirrored_equals_one_device(mirrored, scenario):
    """`none` under mixed_bfloat16 (compared with one device under the same policy), `full` with 2
    micro-batches accumulated per update (keras #20582), and LoRA adapters under `full` (only A and B
    train: 2 x 7 projections x 1 layer; no frozen replica copy is left trainable to TensorFlow)."""
    assert mirrored["fit"]["replicas"] == 2
    got = mirrored["fit"][scenario]
    assert got["watched_frozen"] == 0, got
    if SCENARIOS[scenario][3]:
        assert got["trained"] == 2 * 7 * 1, got  # one block (distribute_child.SCENARIOS)
    if SCENARIOS[scenario][1] == "mixed_bfloat16":
        assert got["max_rel"] < BF16_REL and got["norm_rel"] < BF16_NORM_REL, got
    elif SCENARIOS[scenario][3]:  # B starts at 0: after 3 Adam steps its entries are ~3 x lr, so the replicas'
        # summation order shows more against them (measured max 2.9e-5, norm 2.9e-6)
        assert got["max_rel"] < 1e-4 and got["norm_rel"] < FLOAT32_REL, got
    else:
        assert got["max_rel"] < FLOAT32_REL, got


@pytest.mark.timeout(CHILD_TIMEOUT)
def test_the_head_on_trained_positions_under_mirrored_equals_one_device(mirrored):
    """Each replica skips its own untrained chunks (8 trained positions on one, 1 on the other): the summed loss
    and gradients equal the full head's on the whole batch (tests/zoo/test_trained_positions.mirrored_report)."""
    report = mirrored["trained_positions"]
    assert report["loss"] == pytest.approx(report["full_loss"], rel=1e-6)
    assert report["gradient_difference"] <= 1e-6 * report["gradient_scale"], report


def test_a_global_batch_that_does_not_split_is_refused(mirrored):
    message = mirrored["fit"]["odd_batch_error"]
    assert "--batch-size 3 is the global batch" in message and "2 replicas of this mirrored run" in message
    assert "--batch-size 4 or 2" in message


@pytest.mark.timeout(CHILD_TIMEOUT)
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_fused_update_under_mirrored_equals_one_device(mirrored, family):
    """The fused update (zoo.training.fused) on two replicas: each block's gradients are summed across
    replicas as they appear, the exact global clip (0.05: it scales every step) takes the norm of the
    summed gradients, dropout 0.1 draws each replica's rows of one device's masks, and the decoder's
    embedding is tied (its two uses are summed, then reduced once). 3 steps; every replica's copy ends
    the same. |difference| / |weight| per variable (test_multi_worker.py says why not the elementwise max)."""
    got = mirrored["fused"][family]
    assert got["steps"] == [3, 3] and got["copies_equal"], got
    assert got["norm_rel"] < 1e-6 and got["max_rel"] < 1e-5, got


@pytest.mark.timeout(CHILD_TIMEOUT)
def test_fused_float16_overflow_on_one_replica_skips_the_step_on_both(mirrored):
    """Replica 1's rows weigh 1e6, so only its float16 gradients overflow: the summed norm is not finite on
    either replica, no weight moves on any copy, the step counter stays and the loss scale halves; the next
    steps train (every variable moves, on every copy alike)."""
    skip, following = mirrored["fused"]["float16_skip"], mirrored["fused"]["float16_next"]
    assert skip["unchanged"] and skip["iterations"] == 0 and skip["scale"] == [32768.0, 16384.0], skip
    assert following["iterations"] == 2 and following["copies_equal"], following
    assert following["moved"] == following["variables"], following


@pytest.mark.timeout(CHILD_TIMEOUT)
def test_each_optimizer_under_mirrored_strategy_equals_one_device(mirrored):
    """Two replicas with different gradients (global norm ~4, clipped at 1.0) update as one
    device applying their sum, with and without accumulation (keras #20582: plain Keras
    fails there): `SumReplicaGradients` sums before the clip. Plain Keras' Lion clips each
    replica's gradient first and ends elsewhere."""
    report = mirrored["optimizers"]
    assert report["replicas"] == 2
    for name in RECIPE_OPTIMIZERS:
        for k in (1, 2):
            got = report[f"{name}-k{k}"]
            assert got["moved"] > 1e-3 and got["rel"] < 1e-6, (name, k, got)
    assert report["plain-keras-lion"] > 1e-3


@pytest.mark.parametrize("text, named", [
    (None, "TF_CONFIG environment variable, which is not set"),
    ("{'cluster': ", "not valid JSON"),
    ('{"task": {"type": "worker", "index": 0}}', 'needs a "cluster"'),
    ('{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "ps", "index": 0}}', "task type 'ps'"),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}', "use 0 to 1"),
])
def test_missing_or_malformed_tf_config_is_refused(monkeypatch, text, named):
    """Checked before MultiWorkerMirroredStrategy exists; the message shows a TF_CONFIG that works."""
    if text is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", text)
    with pytest.raises(ValueError, match="TF_CONFIG") as error:
        distribute.make("multi-worker")
    assert named in str(error.value) and '"index": 1 on the second host' in str(error.value)


def test_devices_that_do_not_exist_are_named(capsys):
    from zoo.cli import main

    code = main(["train", "dec-base", "--data", "unused.txt", "--strategy", "mirrored", "--devices", "CPU:0,GPU:7"])
    err = capsys.readouterr().err
    assert code == 2 and "--devices names GPU:7, which this machine does not have" in err and "CPU:0" in err
    with pytest.raises(ValueError, match="--devices picks the devices of a --strategy mirrored run"):
        distribute.make("multi-worker", ["GPU:0"])


def test_a_second_mirrored_cluster_reuses_the_first_strategy():
    """A second MirroredStrategy on the same devices in one process reuses the first's collective instance keys and
    fails ("Shape mismatch in the collective instance", seen in distribute_child.py): a notebook's second mirrored
    run gets the first's strategy; other devices get their own."""
    first, second = distribute.make("mirrored"), distribute.make("mirrored")
    assert first.strategy is second.strategy and first.replicas == 1
    assert distribute.make("mirrored", ["CPU:0"]).strategy is distribute.make("mirrored", ["cpu:0"]).strategy
