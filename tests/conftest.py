import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import pytest  # noqa: E402

# The shape every unit test shrinks a registered model to.
TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=128)
TINY_DEC = dict(TINY, num_kv_heads=2)  # grouped-query attention: 2 query heads per KV head


@pytest.fixture(autouse=True)
def _float32_policy():
    """Tests that set a global dtype policy must not leak it into the next test."""
    yield
    keras.config.set_dtype_policy("float32")
