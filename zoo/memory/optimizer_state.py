"""The optimizers zoo knows, and the state each keeps: the one optimizer table.

Each row gives the slots an optimizer keeps for one variable, by Keras 3.15's own rule
(keras/src/optimizers/{adamw,adafactor,lion}.py), and whether recipes train with it.
Pure arithmetic, so the planner can use it without TensorFlow. Keras' Adafactor keeps a
full-size velocity beside its row and column factors (docs/design-notes.md: Optimizer state).
"""

import math
from dataclasses import dataclass

_PLACEHOLDER_BYTES = 4  # Keras' Adafactor gives an unfactored variable two `backend.Variable(0)`: int32 scalars


def _two_moments(shape):
    return [shape, shape]


def _one_moment(shape):
    return [shape]


def _no_state(shape):
    return []


def _keras_adafactor(shape):
    """Row (s[:-1]) and column (s[:-2] + s[-1:]) factors, and a full velocity, for rank >= 2."""
    if len(shape) < 2:
        return [shape]
    return [shape[:-1], shape[:-2] + shape[-1:], shape]


@dataclass(frozen=True)
class Optimizer:
    slots: object  # shape -> the shapes of the state kept for a variable of that shape
    recipes: bool  # recipes (recipes.optim) train with it; the others are for planning plain Keras models
    placeholders: int = 0  # int32 scalars kept for each variable of rank < 2


OPTIMIZERS = {
    "adamw": Optimizer(_two_moments, recipes=True),
    "adafactor": Optimizer(_keras_adafactor, recipes=True, placeholders=2),
    "lion": Optimizer(_one_moment, recipes=True),
    "adam": Optimizer(_two_moments, recipes=False),
    "sgd": Optimizer(_no_state, recipes=False),
}
RECIPE_OPTIMIZERS = tuple(name for name, row in OPTIMIZERS.items() if row.recipes)


def check(optimizer: str, known=tuple(OPTIMIZERS)) -> str:
    """`optimizer` lower-cased, or a ValueError naming the known optimizers."""
    name = str(optimizer).lower()
    if name not in known:
        raise ValueError(f"Unknown optimizer {optimizer!r}; known optimizers: {', '.join(known)}.")
    return name


def slot_shapes(optimizer: str, shape) -> list:
    """The shapes of the state `optimizer` keeps for one variable of `shape` (in its dtype)."""
    return OPTIMIZERS[check(optimizer)].slots(tuple(int(d) for d in shape))


def state_bytes(optimizer: str, shapes, variable_bytes: int = 4, accumulation_steps: int = 1) -> int:
    """Bytes of `optimizer`'s state for trainable variables of these `shapes` (elements of
    `variable_bytes`); `accumulation_steps > 1` adds Keras' one accumulator per variable."""
    row = OPTIMIZERS[check(optimizer)]
    total = 0
    for shape in shapes:
        total += sum(math.prod(s) for s in slot_shapes(optimizer, shape)) * variable_bytes
        if len(shape) < 2:
            total += row.placeholders * _PLACEHOLDER_BYTES
        if accumulation_steps > 1:
            total += math.prod(int(d) for d in shape) * variable_bytes
    return total
