"""The private Keras optimizer API zoo relies on (zoo.training.keras_optimizer) still exists with the
parameters it had. A Keras upgrade that renames or reshapes one fails here, by name, before the fused
update or the recipes' optimizers fail somewhere deep in a step."""

import inspect

import pytest
from keras.optimizers import LossScaleOptimizer
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.losses import loss as keras_loss
from keras.src.optimizers.base_optimizer import BaseOptimizer

from zoo.training.keras_optimizer import PRIVATE_API

OWNERS = {"BaseOptimizer": BaseOptimizer, "TFOptimizer": TFOptimizer, "LossScaleOptimizer": LossScaleOptimizer}


@pytest.mark.parametrize("name", sorted(PRIVATE_API))
def test_private_keras_api_is_unchanged(name):
    owner, _, method = name.rpartition(".")
    target = getattr(OWNERS[owner], method, None) if owner else getattr(keras_loss, method, None)
    assert target is not None, f"Keras no longer has {name}: zoo.training.keras_optimizer needs updating"
    assert tuple(inspect.signature(target).parameters) == PRIVATE_API[name], (
        f"Keras changed the parameters of {name}: zoo.training.keras_optimizer needs updating")


def test_every_private_name_zoo_and_recipes_use_is_listed():
    """The private names of Keras' optimizer classes called or overridden in zoo and recipes (`._name(`,
    `def _name(` of an optimizer or mixin); the optimizers' own helpers are theirs to name."""
    import re

    from tests.common import REPO

    listed = {name.rpartition(".")[2] for name in PRIVATE_API}
    used = set()
    paths = [REPO / "zoo" / "training" / "keras_optimizer.py", REPO / "recipes" / "optim.py",
             *sorted((REPO / "zoo" / "optimizers").glob("*.py"))]
    for path in paths:
        text = path.read_text(encoding="utf-8")
        used |= set(re.findall(r"\.(_[a-z][a-z_]*)\(", text))
        used |= set(re.findall(r"def (_[a-z][a-z_]*)\(self", text))
    keras_names = {name for name in used if any(hasattr(owner, name) for owner in OWNERS.values())}
    assert {"_apply_weight_decay", "_var_key", "_get_variable_index"} <= keras_names
    assert keras_names <= listed, sorted(keras_names - listed)


def test_the_first_fit_traces_the_step_once(monkeypatch):
    """Keras' TensorFlow trainer builds the optimizer inside the first trace, and TensorFlow then traces the step
    again as a function that makes no variables (ZooModel.make_train_function builds it before)."""
    import keras
    import numpy as np

    import zoo
    from tests.common import TINY_DEC
    from zoo.models.base import ZooModel

    traces = []
    train_step = ZooModel.train_step
    monkeypatch.setattr(ZooModel, "train_step", lambda self, data: traces.append(1) or train_step(self, data))
    model = zoo.get("dec-base", **TINY_DEC, max_sequence_length=16)
    model.compile(optimizer="adamw", loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    x = {"token_ids": np.ones((2, 16), "int32"), "padding_mask": np.ones((2, 16), "int32")}
    model.fit(x, {"logits": np.ones((2, 16), "int32")}, batch_size=2, verbose=0)
    assert model.optimizer.built and len(traces) == 1, len(traces)
