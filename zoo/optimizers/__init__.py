"""Optimizers Keras does not ship in the form the zoo needs.

- `Adafactor`: the paper's factored Adafactor, O(rows + cols) state per matrix (Keras'
  `keras.optimizers.Adafactor` also keeps a full-size velocity).
- `AdamW`, `Lion`: Keras' own, able to train bfloat16 weights with stochastic rounding.
- `stochastic_round`, `Rounding`, `weights_policy`: bfloat16 weights without a float32
  copy (`zoo.optimizers.rounding`).
"""

from zoo.optimizers.adafactor import Adafactor, state_bytes, state_shapes
from zoo.optimizers.rounding import (
    ROUNDINGS,
    WEIGHTS_DTYPES,
    AdamW,
    Lion,
    Rounding,
    check_rounding,
    stochastic_round,
    weights_policy,
)

__all__ = [
    "ROUNDINGS", "WEIGHTS_DTYPES", "Adafactor", "AdamW", "Lion", "Rounding", "check_rounding", "state_bytes",
    "state_shapes", "stochastic_round", "weights_policy",
]
