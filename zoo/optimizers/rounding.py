"""bfloat16 weights with no float32 copy: `Rounding`, mixed in before a Keras optimizer, computes
each update in float32 and rounds it into the bfloat16 variable, stochastically
(zoo.ops.rounding.stochastic_round), with bits keyed by (step, variable) so that a resumed run
draws what the uninterrupted one drew. Keras' own optimizers compute in the variable's dtype
(AdamW never moves a bfloat16 weight) and round to nearest. How it hooks into Keras, and why
slots keep the variable's dtype: docs/design-notes.md (bfloat16 weights and stochastic rounding).
"""

import keras
import tensorflow as tf
from keras import backend

from zoo import checks
from zoo.ops.rounding import stochastic_round
from zoo.training import keras_optimizer


def _dtype(variable) -> str:
    return backend.standardize_dtype(variable.dtype)


def _read(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


class _Float32View:
    """A bfloat16 variable as `update_step` sees it: float32, this step's weight decay applied.
    Reads give that value; `Rounding` turns writes to it into one rounded write of the variable."""

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


def float32_value(variable):
    """A variable's value in float32 (a `_Float32View`'s, decay included)."""
    if isinstance(variable, _Float32View):
        return variable.read()
    return tf.cast(_read(variable), tf.float32)


tf.register_tensor_conversion_function(
    _Float32View, lambda view, dtype=None, name=None, as_ref=False: view.read())


class _WriteState:
    """Per-trace bookkeeping kept off Keras' attribute tracking: the variables built with, the weight
    decays waiting for their variable's update, each variable's random stream, the last writes."""

    def __init__(self):
        self.built, self.decay, self.streams, self.writes = [], {}, None, []


class Rounding:
    """Mixed in before a Keras optimizer class: writes into bfloat16 variables are computed in
    float32 and rounded (module docstring).

    Args:
        rounding: "stochastic", "nearest" (by name only: the failure case), or None for float32
            (or mixed-precision) variables; with None a bfloat16 variable is refused at build.
        rounding_seed: an integer mixed into every draw (another run, other bits).
    """

    def __init__(self, *args, rounding=None, rounding_seed=0, **kwargs):
        rounding = checks.rounding_name(rounding)
        super().__init__(*args, **kwargs)
        self.rounding, self.rounding_seed = rounding, int(rounding_seed)
        self._writes = _WriteState()

    def get_config(self):
        return {**super().get_config(), "rounding": self.rounding, "rounding_seed": self.rounding_seed}

    def build(self, variables):
        if not self.built:
            self._check_variables(variables)
            self._writes.built = list(variables)
        super().build(variables)

    def _check_variables(self, variables):
        dtypes = sorted({_dtype(v) for v in variables})
        bf16 = [v for v in variables if _dtype(v) == "bfloat16"]
        name = type(self).__name__
        if self.rounding is None:
            if bf16:
                example = getattr(bf16[0], "path", bf16[0].name)
                raise ValueError(
                    f"{name} was given {len(bf16)} bfloat16 variables (e.g. {example!r}) and no rounding. Keras "
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
        replicas = tf.distribute.get_strategy().num_replicas_in_sync if tf.distribute.has_strategy() else 1
        if replicas > 1:
            raise ValueError(
                f"rounding={self.rounding!r} is not supported under a tf.distribute strategy with {replicas} replicas "
                "yet: each replica rounds into its own copy of every weight, and that the copies stay equal is "
                "untested. Train on one device, or train float32 weights (weights_dtype='float32') data-parallel.")

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
        # One variable's update at a time: every float32 read, temporary and random draw of this update
        # waits for its gradient and for the previous variable's rounded writes, where TF's executor would
        # make them for every variable as the step starts and hold them (docs/design-notes.md).
        with tf.control_dependencies([gradient, *self._writes.writes]):
            self._writes.writes = []
            result = super().update_step(tf.cast(gradient, tf.float32), view, learning_rate)
            if decay is not None and not view.written:  # an update that wrote nothing still decays
                self._store(variable, view.read())
        return result

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or self.rounding is None:
            return super()._apply_weight_decay(variables)
        super()._apply_weight_decay([v for v in variables if not self._rounds(v)])
        for variable in variables:
            if self._rounds(variable) and keras_optimizer.decays(self, variable):
                wd_lr = tf.cast(self.weight_decay, tf.float32) * tf.cast(self.learning_rate, tf.float32)
                self._writes.decay[self._var_key(variable)] = (variable, wd_lr)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        self._writes.writes = []  # the chain of rounded writes starts afresh in each traced step
        super()._backend_update_step(grads, trainable_variables, learning_rate)
        pending, self._writes.decay = self._writes.decay, {}
        for variable, wd_lr in pending.values():  # decayed but not updated: write the decay alone
            self._store(variable, _Float32View(variable, wd_lr).read())
        self._writes.writes = []

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
        self._writes.writes.append(_read(variable).assign(rounded, read_value=False))

    def _seed(self, variable):
        """(step, stream): the stream is the variable's place among the trainable variables the
        optimizer was built with, then among its own variables; both orders are fixed by the model
        and the optimizer's build, so a resumed run has the same streams."""
        if self._writes.streams is None:
            keys = [self._var_key(v) for v in self._writes.built + self.variables]
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
