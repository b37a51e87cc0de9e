import gc
import os
import sys

# Bytecode is written and reused even where PYTHONDONTWRITEBYTECODE=1 is set (as on this project's CI machines):
# otherwise each of the ~40 processes a run starts (the two workers, the CLI, strategy and fresh-TensorFlow children)
# compiles zoo, recipes and the tests from source again, ~0.5 s of CPU each. Set here, before pytest-xdist starts its
# workers, which inherit the environment. (__pycache__ is ignored by git.)
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    sys.dont_write_bytecode = False

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# The CPU allocator's statistics whatever the CPU and oneDNN (zoo.memory.measure): set here because this file imports
# keras before zoo. oneDNN stays as TensorFlow picks it for this CPU (TF_ENABLE_ONEDNN_OPTS); the memory tests also
# run with it flipped (tests/zoo/test_measure.py).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
# One inter-op thread: TensorFlow's executor then runs a graph's ready ops in one order, so an allocator peak is
# the same from call to call (two inter-op threads on 2 busy cores ran ops early and moved a fused step's peak by
# 2 MB, failing a CI run; the strategy and multi-worker tests pass with it).
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
# One intra-op thread too: pytest runs two workers on a 2-core machine (and the subprocess tests more processes),
# so a kernel split across both cores only waits for the other worker's. Whole suite, alone, 2-core AVX-512 EPYC,
# 2026-12-06: 624 s (user 1,102 s) with TensorFlow's default, 576 s (user 1,023 s) with one thread. Subprocesses
# started from the tests inherit it.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import keras
import pytest
import tensorflow as tf

from tests.common import one_stack_for_every_op
from tools.assets import AssetUnavailable, fetch

# The longest files, longest first (worker-seconds, --durations, 2026-12-06 16:16 on an AVX-512 EPYC): pytest-xdist's
# --dist loadfile hands out files in the order it is given, one at a time to the worker that is free, so a long file
# handed out last keeps one worker busy minutes after the other has finished. xdist's own default order (the files
# with the most tests first) put the few-test, subprocess-heavy files last: pyproject.toml turns it off
# (--no-loadscope-reorder) so that this order stands.
LONGEST_FIRST = ["test_measure.py", "test_recompute.py", "test_multi_worker.py", "test_distribute.py",
                 "test_fused_precision.py", "test_recipes.py", "test_resume.py", "test_lora.py", "test_dpo.py",
                 "test_device_check.py", "test_loading_big.py", "test_lora_recipes.py", "test_export.py",
                 "test_hub_real.py", "test_optimizers.py", "test_export_generate.py", "test_generation.py",
                 "test_preference_step.py", "test_export_stand_in.py", "test_pretrained.py", "test_export_litert.py",
                 "test_sft.py", "test_lm_loss.py", "test_cli_generate.py", "test_quantized_head.py",
                 "test_trained_positions.py", "test_packing.py", "test_generation_batch.py", "test_fused.py",
                 "test_fused_recipes.py", "test_every_recipe.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def _switch(name, default, on, off):
    """A 0/1 environment variable of the test run, refused by name when it is neither."""
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise pytest.UsageError(f"{name}={value!r}: use 1 ({on}) or 0 ({off}).")
    return value == "1"


_FREEZE_GC = _switch("ZOO_TEST_GC_FREEZE", "1", "the default: freeze", "do not")
_OP_STACKS = _switch("ZOO_TEST_OP_STACKS", "0", "record each graph op's Python stack", "the default: do not")
_GRAPPLER = _switch("ZOO_TEST_GRAPPLER", "0", "optimize every test's graphs", "the default: the memory tests' only")


if not _OP_STACKS:  # tests.common.one_stack_for_every_op says why
    one_stack_for_every_op()

_module_of_last_test = []


def pytest_runtest_setup(item):
    """Before the test's fixtures are made (this file's hooks run before pytest's own):

    TensorFlow's graph optimizer (Grappler) runs where the memory tests measure: what a graph keeps depends on it
    (constant folding, docs/design-notes.md). Elsewhere it is off: each new function's optimization costs as much as
    its trace does (a tiny decoder's step under 5 policies, traced and run 3 times: 21 -> 14 s of CPU, AVX2-only
    EPYC, 2026-12-07), and its rewrites change float rounding only, which the tests' bounds allow. The processes
    that tests start (the CLI, the strategy and resume children, the quickstart in CI) optimize as users' processes
    do; a child compared bitwise is given this process's setting. ZOO_TEST_GRAPPLER=1 turns it on for every test;
    the option is read as each function is first called.

    Objects that outlive a test file are left out of every later full garbage collection: at each file's first
    test, collect, then freeze what survived (imports, session fixtures, caches). Full collections took 148 of the
    suite's 1,168 CPU seconds (127 of them, 1.2 s each: Keras collects after every variable a layer deletes, zoo
    after quantizing, Python itself as objects grow), each walking every object the worker had made since it
    started (1.5 M after six files). ZOO_TEST_GC_FREEZE=0 turns it off."""
    grappler = _GRAPPLER or item.get_closest_marker("memory") is not None
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": not grappler})
    if _FREEZE_GC and _module_of_last_test != [item.path]:
        _module_of_last_test[:] = [item.path]
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def _float32_policy():
    """Tests that set a global dtype policy must not leak it into the next test."""
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def asset():
    """`asset("minilm")` -> local path of a real offline asset (tools/assets.py); skips,
    naming the fetch command, when it cannot be fetched."""

    def get(name):
        try:
            return fetch(name)[name]
        except AssetUnavailable as error:
            pytest.skip(f"real asset {name!r} unavailable: {error}")

    return get
