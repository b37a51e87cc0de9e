import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the CPU allocator's statistics (zoo/__init__.py)

import keras
import pytest

from tools.assets import AssetUnavailable, fetch


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
