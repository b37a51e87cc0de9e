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
    """The names called or overridden in zoo and recipes (`._name(`, `def _name(` of an optimizer mixin)."""
    import re

    from tests.common import REPO

    listed = {name.rpartition(".")[2] for name in PRIVATE_API}
    used = set()
    for path in [REPO / "zoo" / "training" / "keras_optimizer.py", REPO / "recipes" / "optim.py"]:
        text = path.read_text(encoding="utf-8")
        used |= set(re.findall(r"(?:optimizer|scaler|super\(\))\.(_[a-z][a-z_]*)\(", text))
        used |= set(re.findall(r"def (_[a-z][a-z_]*)\(self", text))
    assert used and used <= listed, sorted(used - listed)
