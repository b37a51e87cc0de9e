"""Adafactor with a factored second moment and nothing full-size (Shazeer & Stern 2018): per
variable a row and a column statistic (float32; zoo.memory.optimizer_state.factored) for rank >= 2,
a full second moment for vectors, and a momentum only with `beta_1` (off, as in the paper). Keras'
own `Adafactor` also keeps a full-size velocity (4 bytes per parameter, as much as Lion).
The step as implemented, and where it follows the paper, transformers, optax, T5X and Keras:
docs/design-notes.md (The factored Adafactor). bfloat16 weights: `rounding="stochastic"`.
"""

import keras
import tensorflow as tf

from zoo.memory.optimizer_state import factored
from zoo.optimizers.rounding import Rounding, float32_value
from zoo.training import keras_optimizer


def _rms(x):
    return tf.sqrt(tf.reduce_mean(tf.square(x)))


class _Adafactor(keras.optimizers.Optimizer):
    """The algorithm; `Adafactor` wraps it in `Rounding`, whose update_step must come first."""

    def __init__(self, learning_rate=1e-2, beta_1=None, decay_rate=0.8, epsilon_1=1e-30, epsilon_2=1e-3,
                 clip_threshold=1.0, relative_step=True, scale_parameter=True, name="adafactor", **kwargs):
        if beta_1 is not None and not 0.0 <= beta_1 < 1.0:
            raise ValueError(f"beta_1 must be in [0, 1) or None (no momentum); got {beta_1}.")
        if not decay_rate > 0.0:
            raise ValueError(f"decay_rate is c in beta2_t = 1 - t^-c and must be > 0 (the paper's 0.8); got "
                             f"{decay_rate}. transformers writes it negative (-0.8): drop the sign.")
        if clip_threshold is not None and not clip_threshold > 0:
            raise ValueError(f"clip_threshold must be > 0, or None for no update clipping; got {clip_threshold}.")
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1, self.decay_rate = beta_1, float(decay_rate)
        self.epsilon_1, self.epsilon_2, self.clip_threshold = float(epsilon_1), float(epsilon_2), clip_threshold
        self.relative_step, self.scale_parameter = bool(relative_step), bool(scale_parameter)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._rows, self._cols, self._second, self._momentums = [], [], [], []
        for var in var_list:
            slots = [None, None, None, None]
            if not keras_optimizer.overwritten(self, var):
                name = str(getattr(var, "path", var.name)).replace("/", "_").replace(":", "_")  # tf.Variable: no path
                shape = tuple(int(d) for d in var.shape)
                if len(shape) >= 2:
                    row, col = factored(shape)
                    slots[0] = self.add_variable(row, dtype="float32", name=f"{name}_row")
                    slots[1] = self.add_variable(col, dtype="float32", name=f"{name}_col")
                else:
                    slots[2] = self.add_variable(shape, dtype="float32", name=f"{name}_second_moment")
                if self.beta_1:
                    slots[3] = self.add_variable_from_reference(var, name="momentum")
            for lst, slot in zip((self._rows, self._cols, self._second, self._momentums), slots):
                lst.append(slot)

    def apply(self, grads, trainable_variables=None):
        # Dense before Keras clips: its global norm miscounts repeated rows of IndexedSlices.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        i = keras_optimizer.variable_index(self, variable)
        g = tf.cast(tf.convert_to_tensor(gradient), tf.float32)  # IndexedSlices: dense (design notes)
        t = tf.cast(self.iterations + 1, tf.float32)
        beta2 = 1.0 - tf.pow(t, -self.decay_rate)
        g2 = tf.square(g) + self.epsilon_1
        if self._rows[i] is not None:
            row, col = self._rows[i], self._cols[i]
            new_row = beta2 * row.value + (1.0 - beta2) * tf.reduce_mean(g2, axis=-1)
            new_col = beta2 * col.value + (1.0 - beta2) * tf.reduce_mean(g2, axis=-2)
            self.assign(row, new_row)
            self.assign(col, new_col)
            row_factor = tf.math.rsqrt(new_row / tf.reduce_mean(new_row, axis=-1, keepdims=True))
            u = g * row_factor[..., None] * tf.math.rsqrt(new_col)[..., None, :]
        else:
            second = self._second[i]
            new_second = beta2 * second.value + (1.0 - beta2) * g2
            self.assign(second, new_second)
            u = g * tf.math.rsqrt(new_second)
        if self.clip_threshold is not None:
            u = u / tf.maximum(1.0, _rms(u) / self.clip_threshold)
        rho = tf.cast(learning_rate, tf.float32)
        if self.relative_step:
            rho = tf.minimum(rho, tf.math.rsqrt(t))
        if self.scale_parameter:
            rho = rho * tf.maximum(self.epsilon_2, _rms(float32_value(variable)))
        step = rho * u
        if self.beta_1:
            momentum = self._momentums[i]
            step = self.beta_1 * float32_value(momentum) + (1.0 - self.beta_1) * step
            self.assign(momentum, step)
        self.assign_sub(variable, step)

    def get_config(self):
        return {
            **super().get_config(), "beta_1": self.beta_1, "decay_rate": self.decay_rate,
            "epsilon_1": self.epsilon_1, "epsilon_2": self.epsilon_2, "clip_threshold": self.clip_threshold,
            "relative_step": self.relative_step, "scale_parameter": self.scale_parameter,
        }


@keras.saving.register_keras_serializable(package="zoo")
class Adafactor(Rounding, _Adafactor):
    """The factored Adafactor (docs/design-notes.md: the step and its sources).

    Args:
        learning_rate: with `relative_step` the cap on the relative step size (1e-2: the
            paper's); without it the relative step size itself (float or schedule).
        beta_1: momentum over the scaled steps; None (default, the paper's) keeps none.
        decay_rate: c in beta2_t = 1 - t^-c (0.8; transformers spells it -0.8).
        epsilon_1: added to the squared gradient (1e-30).
        epsilon_2: the least parameter scale (1e-3).
        clip_threshold: d, the largest RMS of an update before the step size (1.0; None: no
            update clipping).
        relative_step: rho_t = min(learning_rate, 1/sqrt(t)) (True) or learning_rate (False).
        scale_parameter: multiply the step by max(epsilon_2, RMS(weights)).
        rounding: bfloat16 weights ("stochastic"); see `zoo.optimizers.rounding.Rounding`.
        **kwargs: Keras' optimizer arguments (weight_decay, global_clipnorm, ...).
    """
