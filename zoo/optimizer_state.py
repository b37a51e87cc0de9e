"""Bytes of optimizer state, from the variables' shapes, by each Keras optimizer's own
slot rule (Keras 3.15 `keras/src/optimizers/{adamw,adafactor,lion}.py`). Pure
arithmetic: no TensorFlow or Keras import, so the memory planner can use it.

Per trainable variable of shape `s` with n = prod(s) elements, in the variables' own
dtype (`variable_bytes`: 4 for float32 variables, which `mixed_bfloat16` keeps too):

* `adamw`: momentum and velocity, n each: 2n.
* `lion`: one momentum: n.
* `adafactor`: a velocity of n elements for *every* variable, factored or not (Keras
  stores the rank-1 product of the factors back into a full-size velocity), plus, for
  rank >= 2, the row factor (s[:-1]) and the column factor (s[:-2] + s[-1:]); for
  rank < 2, two placeholder scalars that are int32 (4 bytes each) whatever the
  variable's dtype. So Keras' Adafactor takes about as much as Lion, not the few
  bytes per parameter of a factored-only second moment.

`accumulation_steps > 1` (Keras' `gradient_accumulation_steps`) adds one accumulator
of n elements per variable, for any optimizer. The step counter (int64) and a
constant learning rate's variable are not counted: a few bytes per optimizer.
"""

import math

OPTIMIZERS = ("adamw", "adafactor", "lion")
_PLACEHOLDER_BYTES = 4  # Adafactor's unfactored variables get two `backend.Variable(0)`: int32 scalars


def check(optimizer: str) -> str:
    """`optimizer` lower-cased, or a ValueError naming the known optimizers."""
    name = str(optimizer).lower()
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {optimizer!r}; known optimizers: {', '.join(OPTIMIZERS)}.")
    return name


def slot_shapes(optimizer: str, shape) -> list:
    """The shapes of the state `optimizer` keeps for one variable of `shape` (in its dtype),
    Adafactor's int32 placeholders excluded."""
    shape = tuple(int(d) for d in shape)
    name = check(optimizer)
    if name == "adamw":
        return [shape, shape]
    if name == "lion":
        return [shape]
    if len(shape) < 2:
        return [shape]
    return [shape[:-1], shape[:-2] + shape[-1:], shape]


def state_bytes(optimizer: str, shapes, variable_bytes: int = 4, accumulation_steps: int = 1) -> int:
    """Bytes of `optimizer`'s state for trainable variables of these `shapes`.

    Args:
        optimizer: one of `OPTIMIZERS`.
        shapes: the trainable variables' shapes (tuples of ints).
        variable_bytes: bytes per element of the variables (4: float32).
        accumulation_steps: micro-batches per update; above 1 adds one gradient
            accumulator per variable.
    """
    name = check(optimizer)
    total = 0
    for shape in shapes:
        total += sum(math.prod(s) for s in slot_shapes(name, shape)) * variable_bytes
        if name == "adafactor" and len(shape) < 2:
            total += 2 * _PLACEHOLDER_BYTES
        if accumulation_steps > 1:
            total += math.prod(int(d) for d in shape) * variable_bytes
    return total
