"""Adafactor with a factored second moment and nothing full-size (Shazeer & Stern 2018).

Keras' own `Adafactor` keeps the row and column statistics and then writes their product
into a full-size `velocity` for every variable (4 bytes per parameter, as much as Lion).
This one keeps, per variable:
  - rank >= 2, factored over its last two axes: a row statistic (shape[:-1]) and a column
    statistic (shape[:-2] + shape[-1:]), float32: O(rows + cols) per matrix;
  - rank < 2: a full second moment (float32; vectors are small);
  - with `beta_1`: a momentum of the variable's size and dtype (off by default, as in the
    paper).

The step (the paper's Algorithms 4 and 5, t counting from 1, all in float32):
    beta2_t = 1 - t^-decay_rate                                     (decay_rate 0.8)
    G2      = G^2 + eps1                                            (eps1 1e-30)
    factored: R = beta2_t R + (1 - beta2_t) mean(G2, -1)
              C = beta2_t C + (1 - beta2_t) mean(G2, -2)
              V = (R / mean(R, -1)) outer C
    else:     V = beta2_t V + (1 - beta2_t) G2
    U       = G / sqrt(V);  U /= max(1, RMS(U) / d)                 (update clipping, d 1.0)
    rho_t   = min(lr_t, 1 / sqrt(t)) if relative_step else lr_t     (lr 1e-2: the paper's min(1e-2, 1/sqrt t))
    alpha_t = max(eps2, RMS(X_{t-1})) rho_t if scale_parameter else rho_t    (eps2 1e-3)
    step    = alpha_t U;  with beta_1: M = beta_1 M + (1 - beta_1) step, step = M
    X_t     = X_{t-1} - step
Means instead of the paper's sums give the same V (the factors' scales cancel) and stay
in range; this is how Keras, transformers and optax store them.

Where it follows which (read: transformers 5.24 `optimization.Adafactor`, optax
`adafactor` / `scale_by_factored_rms`, T5X `adafactor.py`, Keras 3.15 `adafactor.py`):
  - factoring the last two axes of every rank >= 2 variable: the paper, transformers and
    Keras. optax and T5X factor the two largest axes, and only when both are >= 128
    (`min_dim_size_to_factor`; smaller matrices keep a full second moment there); T5X
    refuses a rank > 2 variable without an explicit factorisation rule.
  - eps1 added to G^2 before averaging, beta2_t = 1 - t^-0.8 from t = 1, clipping by the
    RMS of the whole update: all four and the paper.
  - `relative_step` / `scale_parameter`: transformers' two switches. relative_step=True
    with the default lr 1e-2 is the paper's rho_t; relative_step=False takes lr_t (a
    float or a schedule) as rho_t, as transformers and optax (`learning_rate`) do, and
    T5X with its schedule. Keras always caps lr_t at 1/sqrt(t).
  - momentum over the scaled step alpha_t U, not over the gradient: transformers, optax
    (`ema` after the learning rate) and T5X (Mesh TensorFlow's `subtrahend`) all do; the
    paper's algorithms have none.
  - weight decay is Keras' decoupled `weight_decay`: X -= X * wd * lr_t before the update,
    so the parameter scale is the decayed weights' RMS. transformers decays by X * wd *
    alpha_t (the relative step); optax (`weight_decay_rate`) and T5X by X * wd, not scaled
    by any learning rate; all three take the parameter scale before the decay.
  - sparse (IndexedSlices) gradients are made dense first (transformers refuses them).
    The paper's step is dense for an embedding anyway: R decays for every row, C and the
    clipping RMS cover all rows, and momentum moves rows with no gradient; a lazy row
    update would be another algorithm. The dense gradient is the size of the tied head's
    gradient, and `apply` densifies before clipping, so `global_clipnorm` sees the true
    norm (Keras' global norm miscounts repeated rows of IndexedSlices).

bfloat16 weights: `rounding="stochastic"` (`zoo.optimizers.rounding`).
"""

import math

import keras
import tensorflow as tf

from zoo.optimizers.rounding import Rounding, float32_value


def state_shapes(shape, beta_1=None) -> list:
    """The shapes of the state kept for one variable of `shape` (float32 statistics, then the
    momentum in the variable's dtype when `beta_1` is set). Pure arithmetic, for planners."""
    shape = tuple(int(d) for d in shape)
    shapes = [shape[:-1], shape[:-2] + shape[-1:]] if len(shape) >= 2 else [shape]
    return shapes + ([shape] if beta_1 else [])


def state_bytes(shapes, beta_1=None, variable_bytes=4) -> int:
    """Bytes of state for variables of these `shapes` (statistics float32, a momentum in the
    variables' own dtype, `variable_bytes` per element)."""
    total = 0
    for shape in shapes:
        total += sum(math.prod(s) for s in state_shapes(shape)) * 4
        if beta_1:
            total += math.prod(int(d) for d in shape) * variable_bytes
    return total


def _rms(x):
    return tf.sqrt(tf.reduce_mean(tf.square(x)))


@keras.saving.register_keras_serializable(package="zoo")
class Adafactor(Rounding, keras.optimizers.Optimizer):
    """The factored Adafactor (module docstring for the algorithm and its sources).

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
            if not self._overwrite_variable_with_gradient(var):
                name = var.path.replace("/", "_")
                if len(var.shape) >= 2:
                    row, col = state_shapes(var.shape)
                    slots[0] = self.add_variable(row, dtype="float32", name=f"{name}_row")
                    slots[1] = self.add_variable(col, dtype="float32", name=f"{name}_col")
                else:
                    slots[2] = self.add_variable(tuple(var.shape), dtype="float32", name=f"{name}_second_moment")
                if self.beta_1:
                    slots[3] = self.add_variable_from_reference(var, name="momentum")
            for lst, slot in zip((self._rows, self._cols, self._second, self._momentums), slots):
                lst.append(slot)

    def apply(self, grads, trainable_variables=None):
        # Dense before Keras clips: its global norm miscounts repeated rows of IndexedSlices.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        i = self._get_variable_index(variable)
        g = tf.cast(tf.convert_to_tensor(gradient), tf.float32)  # IndexedSlices: dense (module docstring)
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
