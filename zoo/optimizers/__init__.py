"""Optimizers Keras does not ship in the form the zoo needs (docs/memory.md).

- `Adafactor`: the paper's factored Adafactor, O(rows + cols) state per matrix (Keras'
  `keras.optimizers.Adafactor` also keeps a full-size velocity).
- `AdamW`, `Lion`: Keras' own, able to train bfloat16 weights with stochastic rounding.
- `Rounding`: the mixin that gives an optimizer `rounding="stochastic"` (bfloat16 weights, no
  float32 copy); `stochastic_round` is zoo.ops.rounding's.

They sit above zoo.training (the private Keras optimizer API, through keras_optimizer) and
zoo.memory (the optimizer table's slot rule); nothing in ops, layers, training, models or
memory imports them.
"""

from zoo.ops.rounding import stochastic_round
from zoo.optimizers.adafactor import Adafactor
from zoo.optimizers.rounding import AdamW, Lion, Rounding

__all__ = ["Adafactor", "AdamW", "Lion", "Rounding", "stochastic_round"]
