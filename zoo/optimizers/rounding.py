"""bfloat16 weights with no float32 master copy: each update is computed in float32 and
rounded into the bfloat16 variable, stochastically (Zamirai et al. 2020, "Revisiting
BFloat16 Training"; torchao's `bf16_stochastic_round`).

Why not round to nearest: a bfloat16 has 8 significant bits, so an update smaller than
half a step between neighbours (2^-9 of the weight, ~0.2%) is lost entirely, every time.
AdamW's steps at lr 1e-4 are that small. Stochastic rounding rounds up with probability
equal to the dropped fraction, so the expected stored value is the exact float32 result
and small updates accumulate on average.

`stochastic_round(x, seed)` adds 16 random low bits to the float32 bit pattern and
truncates them (bitcast, add, mask): it is exact on values bfloat16 represents, unbiased
otherwise, and keeps NaN and Inf. Its bits come from a stateless Philox draw keyed by
`seed`; the optimizer derives that from (step, variable), so a resumed run draws what
the uninterrupted one drew.

`Rounding`, mixed in before a Keras optimizer, is how the optimizer applies it. Keras
optimizers write only through `self.assign / assign_add / assign_sub(variable, value)`
(checked for AdamW, Lion and `zoo.optimizers.Adafactor`), and decay weights in
`_apply_weight_decay`; `Rounding` takes over those for bfloat16 variables:
  - `update_step` sees a bfloat16 weight as a float32 variable (`_Float32View`), so the
    optimizer's own arithmetic runs in float32. Keras' AdamW would otherwise compute in
    bfloat16, where beta_2 = 0.999 is 1.0, the bias correction sqrt(1 - 0.999^t) is 0
    and no weight ever moves (keras PR #21238 fixed the same thing in LAMB only).
  - weight decay is folded into the view (x - x * wd * lr, float32), so a step rounds
    each weight once, as torchao does;
  - every write into a bfloat16 variable, weight or full-size optimizer slot (AdamW's
    moments, Lion's momentum, Adafactor's momentum), is computed in float32 and rounded
    with the chosen `rounding`. Slots keep the variable's dtype: float32 moments would
    cost 8 bytes per parameter for AdamW, more than the 2 bytes the bfloat16 weights
    save; with stochastic rounding a bfloat16 moment is unbiased too, where round-to-
    nearest would freeze AdamW's second moment (a 0.1% step per update, below half a
    bfloat16 step). Adafactor's factored statistics are float32 (O(rows + cols)).

`rounding="nearest"` computes in float32 too and rounds to nearest: the failure case,
only when asked for by name. A bfloat16 variable given to an optimizer with this mixin
and no `rounding` is refused: Keras would round to nearest without saying so.
"""

import keras
import tensorflow as tf
from keras import backend

ROUNDINGS = ("stochastic", "nearest")
WEIGHTS_DTYPES = ("float32", "bfloat16")
_LOW_BITS = 1 << 16  # a float32 has 16 more significand bits than a bfloat16
_HIGH_MASK = -_LOW_BITS  # 0xFFFF0000 as an int32


def stochastic_round(x, seed):
    """`x` (float32) rounded to bfloat16, up with probability equal to the fraction of a
    bfloat16 step it drops. `seed`: shape [2] integers (a stateless Philox key); the same
    seed gives the same bits on every run and device."""
    x = tf.convert_to_tensor(x)
    if x.dtype != tf.float32:
        raise TypeError(f"stochastic_round rounds float32 into bfloat16; got {x.dtype.name}. Cast to float32 first.")
    noise = tf.random.stateless_uniform(tf.shape(x), seed, minval=0, maxval=_LOW_BITS, dtype=tf.int32, alg="philox")
    # Adding to the bit pattern adds to the magnitude whatever the sign (sign-magnitude), so
    # a negative value rounds away from zero as often as a positive one: unbiased.
    bits = tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32) + noise, _HIGH_MASK)
    rounded = tf.bitcast(bits, tf.float32)  # the low 16 bits are zero: the cast below is exact
    # A NaN whose payload is only in the low bits could truncate to Inf: keep NaN and Inf as they are.
    return tf.cast(tf.where(tf.math.is_finite(x), rounded, x), tf.bfloat16)


def check_rounding(rounding):
    if rounding is not None and rounding not in ROUNDINGS:
        raise ValueError(f"Unknown rounding {rounding!r}; known: 'stochastic' (bfloat16 weights, unbiased) and "
                         "'nearest' (loses any update below half a bfloat16 step; for comparisons), or None for "
                         "float32 weights.")
    return rounding


def weights_policy(weights_dtype, dtype=None) -> str:
    """The Keras dtype policy a model is built with for `weights_dtype`, given the
    precision `dtype` the user asked for (None: the weights decide).

    bfloat16 weights are Keras' pure "bfloat16" policy (variables and compute in
    bfloat16); "mixed_bfloat16" asks for the same compute, so it becomes "bfloat16".
    Any float16 or float32 compute with bfloat16 weights is not a Keras policy."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"Unknown weights dtype {weights_dtype!r}; known: {', '.join(WEIGHTS_DTYPES)} "
                         "(bfloat16: no float32 copy, updates rounded stochastically).")
    if weights_dtype == "float32":
        if dtype in ("bfloat16", "float16"):
            raise ValueError(f"weights_dtype='float32' with dtype={dtype!r}: that policy stores {dtype} weights. "
                             f"Use dtype='mixed_{dtype}' (float32 weights, {dtype} compute), or "
                             "weights_dtype='bfloat16' for bfloat16 weights with stochastic rounding.")
        return dtype or "float32"
    if dtype in (None, "bfloat16", "mixed_bfloat16"):
        return "bfloat16"
    raise ValueError(
        f"weights_dtype='bfloat16' cannot be combined with dtype={dtype!r}: bfloat16 weights compute in bfloat16 "
        "(Keras policy 'bfloat16'), and float16 or float32 compute with them is not a Keras policy "
        "(mixed_float16's loss scaling assumes float32 weights). Pass dtype='bfloat16' or 'mixed_bfloat16' "
        "(or no dtype), or keep float32 weights (weights_dtype='float32') with dtype='mixed_float16'.")


def _dtype(variable) -> str:
    return backend.standardize_dtype(variable.dtype)


class _Float32View:
    """A bfloat16 variable as `update_step` sees it: float32, this step's weight decay
    already applied. Reads convert to that float32 value; `Rounding` turns writes to it
    into one rounded write of the variable."""

    dtype = tf.float32

    def __init__(self, variable, decay=None):
        self.variable, self.decay, self.written, self._value = variable, decay, False, None

    @property
    def shape(self):
        return self.variable.shape

    @property
    def name(self):
        return self.variable.name

    def read(self):
        if self._value is None:  # one read per step: RMS, update and write see the same value
            x = tf.cast(_read(self.variable), tf.float32)
            self._value = x if self.decay is None else x - x * self.decay
        return self._value


def _read(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def float32_value(variable):
    """A variable's value in float32 (a `_Float32View`'s, decay included)."""
    if isinstance(variable, _Float32View):
        return variable.read()
    return tf.cast(_read(variable), tf.float32)


tf.register_tensor_conversion_function(
    _Float32View, lambda view, dtype=None, name=None, as_ref=False: view.read())


class _WriteState:
    """Per-trace bookkeeping kept off Keras' attribute tracking: the weight decays waiting
    for their variable's update, and each variable's random stream."""

    def __init__(self):
        self.decay, self.streams = {}, None


class Rounding:
    """Mixed in before a Keras optimizer class: writes into bfloat16 variables are
    computed in float32 and rounded (module docstring).

    Args:
        rounding: "stochastic", "nearest" (by name only: the failure case), or None for an
            optimizer of float32 (or mixed-precision) variables; with None a bfloat16
            variable is refused at build.
        rounding_seed: an integer mixed into every draw (another run, other bits).
    """

    def __init__(self, *args, rounding=None, rounding_seed=0, **kwargs):
        rounding = check_rounding(rounding)
        super().__init__(*args, **kwargs)
        self.rounding, self.rounding_seed = rounding, int(rounding_seed)
        self._writes = _WriteState()

    def get_config(self):
        return {**super().get_config(), "rounding": self.rounding, "rounding_seed": self.rounding_seed}

    def build(self, variables):
        if not self.built:
            self._check_variables(variables)
        super().build(variables)

    def _check_variables(self, variables):
        dtypes = sorted({_dtype(v) for v in variables})
        bf16 = [v for v in variables if _dtype(v) == "bfloat16"]
        name = type(self).__name__
        if self.rounding is None:
            if bf16:
                raise ValueError(
                    f"{name} was given {len(bf16)} bfloat16 variables (e.g. {bf16[0].path!r}) and no rounding. Keras "
                    "would round each update to nearest and lose every update below half a bfloat16 step. Pass "
                    f"rounding='stochastic' ({name}(..., rounding='stochastic')), or build the model with float32 "
                    "weights (dtype='mixed_bfloat16').")
            return
        if not bf16:
            raise ValueError(
                f"rounding={self.rounding!r} rounds updates into bfloat16 weights, but the model's variables are "
                f"{', '.join(dtypes)}. Under 'mixed_bfloat16' Keras keeps float32 weights (nothing to round): build "
                "the model with dtype='bfloat16' for bfloat16 weights, or drop rounding= to train the float32 weights.")
        if "float16" in dtypes:
            raise ValueError(f"rounding={self.rounding!r} rounds into bfloat16 only; the model also has float16 "
                             "variables. Use dtype='bfloat16', or 'mixed_float16' with rounding=None.")
        if self.use_ema or self.gradient_accumulation_steps:
            raise ValueError(
                f"rounding={self.rounding!r} does not cover Keras' EMA or gradient accumulators (Keras writes them "
                "directly, to nearest, in bfloat16): drop use_ema / gradient_accumulation_steps (raise the batch "
                "size, or use the fused update), or train float32 weights.")
        if tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1:
            raise ValueError(f"rounding={self.rounding!r} is not yet supported under a tf.distribute strategy with "
                             "more than one replica; train on one device, or with float32 weights.")

    def _rounds(self, variable) -> bool:
        if isinstance(variable, _Float32View):
            return True
        return self.rounding is not None and _dtype(variable) == "bfloat16"

    def _var_key(self, variable):
        if isinstance(variable, _Float32View):
            variable = variable.variable
        return super()._var_key(variable)

    def update_step(self, gradient, variable, learning_rate):
        if not self._rounds(variable):
            return super().update_step(gradient, variable, learning_rate)
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)  # sums repeated rows; the update is dense anyway
        decay = self._writes.decay.pop(self._var_key(variable), (None, None))[1]
        view = _Float32View(variable, decay)
        result = super().update_step(tf.cast(gradient, tf.float32), view, learning_rate)
        if decay is not None and not view.written:  # an update that wrote nothing still decays
            self._store(variable, view.read())
        return result

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or self.rounding is None:
            return super()._apply_weight_decay(variables)
        super()._apply_weight_decay([v for v in variables if not self._rounds(v)])
        for variable in variables:
            if self._rounds(variable) and self._use_weight_decay(variable):
                wd_lr = tf.cast(self.weight_decay, tf.float32) * tf.cast(self.learning_rate, tf.float32)
                self._writes.decay[self._var_key(variable)] = (variable, wd_lr)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        super()._backend_update_step(grads, trainable_variables, learning_rate)
        pending, self._writes.decay = self._writes.decay, {}
        for variable, wd_lr in pending.values():  # decayed but not updated: write the decay alone
            self._store(variable, _Float32View(variable, wd_lr).read())

    def assign(self, variable, value):
        if not self._rounds(variable):
            return super().assign(variable, value)
        if isinstance(value, tf.IndexedSlices):
            raise NotImplementedError("A rounded write of IndexedSlices (a scatter) is not supported; "
                                      "Rounding densifies gradients before update_step.")
        self._write(variable, None, value)

    def assign_add(self, variable, value):
        if not self._rounds(variable):
            return super().assign_add(variable, value)
        self._write(variable, float32_value(variable), _dense(value))

    def assign_sub(self, variable, value):
        if not self._rounds(variable):
            return super().assign_sub(variable, value)
        self._write(variable, float32_value(variable), -_dense(value))

    def _write(self, variable, base, value):
        value = tf.cast(value, tf.float32)
        new = value if base is None else base + value
        if isinstance(variable, _Float32View):
            variable.written = True
            variable = variable.variable
        self._store(variable, new)

    def _store(self, variable, new):
        """Rounds the float32 `new` into the bfloat16 `variable`."""
        if self.rounding == "nearest":
            rounded = tf.cast(new, tf.bfloat16)
        else:
            rounded = stochastic_round(new, self._seed(variable))
        _read(variable).assign(rounded)

    def _seed(self, variable):
        """(step, stream): the stream is the variable's place among the trainable variables
        the optimizer was built with, then among its own variables; both orders are fixed by
        the model and the optimizer's build, so a resumed run has the same streams."""
        if self._writes.streams is None:
            keys = [self._var_key(v) for v in self._trainable_variables + self.variables]
            self._writes.streams = {k: i for i, k in reversed(list(enumerate(keys)))}
        stream = self._writes.streams[self._var_key(variable)] + (self.rounding_seed << 32)
        step = tf.cast(self.iterations, tf.int64)
        return tf.stack([step, tf.constant(stream, tf.int64)])


def _dense(value):
    return tf.convert_to_tensor(value) if isinstance(value, tf.IndexedSlices) else value


@keras.saving.register_keras_serializable(package="zoo")
class AdamW(Rounding, keras.optimizers.AdamW):
    """Keras' AdamW; with `rounding="stochastic"` it trains bfloat16 weights (`Rounding`)."""


@keras.saving.register_keras_serializable(package="zoo")
class Lion(Rounding, keras.optimizers.Lion):
    """Keras' Lion; with `rounding="stochastic"` it trains bfloat16 weights (`Rounding`)."""
