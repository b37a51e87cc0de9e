"""The optimizers zoo knows, and the state each keeps: the one optimizer table.

Each row gives the slots an optimizer keeps for one variable (by Keras 3.15's own rule,
keras/src/optimizers/{adamw,adafactor,lion}.py, or zoo.optimizers'), which of them are float32
whatever the variable's dtype, whether recipes train with it, and whether it can train bfloat16
weights (zoo.optimizers' stochastic rounding). Pure arithmetic, so the planner can use it without
TensorFlow; zoo.optimizers.Adafactor builds its slots from `factored`. Keras' Adafactor keeps a
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


def factored(shape):
    """The factored second moment (Shazeer & Stern 2018): for rank >= 2 a row (s[:-1]) and a
    column (s[:-2] + s[-1:]) statistic, factored over the last two axes; a vector keeps a full one."""
    if len(shape) < 2:
        return [shape]
    return [shape[:-1], shape[:-2] + shape[-1:]]


def _keras_adafactor(shape):
    """Keras' factors for rank >= 2, and a full-size velocity for every variable."""
    return (factored(shape) if len(shape) >= 2 else []) + [shape]


@dataclass(frozen=True)
class Optimizer:
    slots: object  # shape -> the shapes of the state kept for a variable of that shape, in its dtype
    recipes: bool  # recipes (recipes.optim) train with it; the others are for planning plain Keras models
    placeholders: int = 0  # int32 scalars kept for each variable of rank < 2
    float32_slots: object = _no_state  # shape -> the shapes of the state kept in float32 whatever the variable's dtype
    rounds: bool = False  # zoo.optimizers trains bfloat16 weights with it (float32 update, stochastic rounding)


OPTIMIZERS = {
    "adamw": Optimizer(_two_moments, recipes=True, rounds=True),
    # zoo.optimizers.Adafactor without momentum (beta_1 None, the paper's and the recipes'); beta_1 adds one
    # slot of the variable's size and dtype.
    "adafactor": Optimizer(_no_state, recipes=True, float32_slots=factored, rounds=True),
    "keras-adafactor": Optimizer(_keras_adafactor, recipes=True, placeholders=2),
    "lion": Optimizer(_one_moment, recipes=True, rounds=True),
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


def check_weights(optimizer: str, weights_dtype: str) -> str:
    """`optimizer`, refused for bfloat16 weights unless zoo.optimizers can round into them."""
    name = check(optimizer)
    if weights_dtype == "bfloat16" and not OPTIMIZERS[name].rounds:
        able = ", ".join(n for n, row in OPTIMIZERS.items() if row.rounds)
        raise ValueError(
            f"Optimizer {name!r} cannot train bfloat16 weights: Keras' optimizers round each update to nearest and "
            f"lose every update below half a bfloat16 step. Use one of {able} (zoo.optimizers, stochastic "
            "rounding), or float32 weights (weights_dtype='float32').")
    return name


def slot_shapes(optimizer: str, shape) -> list:
    """The shapes of the state `optimizer` keeps for one variable of `shape`: those in its dtype,
    then those in float32."""
    row = OPTIMIZERS[check(optimizer)]
    shape = tuple(int(d) for d in shape)
    return row.slots(shape) + row.float32_slots(shape)


def state_bytes(optimizer: str, shapes, variable_bytes: int = 4, accumulation_steps: int = 1) -> int:
    """Bytes of `optimizer`'s state for trainable variables of these `shapes` (elements of
    `variable_bytes`; float32 slots 4 bytes); `accumulation_steps > 1` adds Keras' one
    accumulator per variable."""
    row = OPTIMIZERS[check(optimizer)]
    total = 0
    for shape in shapes:
        shape = tuple(int(d) for d in shape)
        total += sum(math.prod(s) for s in row.slots(shape)) * variable_bytes
        total += sum(math.prod(s) for s in row.float32_slots(shape)) * 4
        if len(shape) < 2:
            total += row.placeholders * _PLACEHOLDER_BYTES
        if accumulation_steps > 1:
            total += math.prod(shape) * variable_bytes
    return total
