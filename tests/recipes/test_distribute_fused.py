"""The fused update (zoo.training.fused) under MirroredStrategy on two logical CPU devices trains what one
device trains, and a float16 overflow on one replica skips the step on both: one child process
(`python -m tests.recipes.distribute_child fused`), apart from test_distribute.py's so that the two
children run on different pytest workers (`--dist loadfile`)."""

import pytest

from tests.recipes.test_distribute import child_report


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    return child_report(tmp_path_factory, "fused")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_fused_update_under_mirrored_equals_one_device(fused, family):
    """The fused update (zoo.training.fused) on two replicas: each block's gradients are summed across
    replicas as they appear, the exact global clip (0.05: it scales every step) takes the norm of the
    summed gradients, dropout 0.1 draws each replica's rows of one device's masks, and the decoder's
    embedding is tied (its two uses are summed, then reduced once). 3 steps; every replica's copy ends
    the same. |difference| / |weight| per variable (test_multi_worker.py says why not the elementwise max)."""
    got = fused[family]
    assert got["steps"] == [3, 3] and got["copies_equal"], got
    assert got["norm_rel"] < 1e-6 and got["max_rel"] < 1e-5, got


@pytest.mark.timeout(420)
def test_fused_float16_overflow_on_one_replica_skips_the_step_on_both(fused):
    """Replica 1's rows weigh 1e6, so only its float16 gradients overflow: the summed norm is not finite on
    either replica, no weight moves on any copy, the step counter stays and the loss scale halves; the next
    steps train (every variable moves, on every copy alike)."""
    skip, following = fused["float16_skip"], fused["float16_next"]
    assert skip["unchanged"] and skip["iterations"] == 0 and skip["scale"] == [32768.0, 16384.0], skip
    assert following["iterations"] == 2 and following["copies_equal"], following
    assert following["moved"] == following["variables"], following
