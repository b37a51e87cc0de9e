"""The optimizer a recipe asks for: AdamW, Lion, the factored Adafactor (zoo.optimizers: bfloat16
weights with stochastic rounding too) or Keras' Adafactor ("keras-adafactor"), each exact under
tf.distribute (`SumReplicaGradients`), with the recipe's warmup-then-decay schedule, global-norm
clip, weight decay on matrices only and gradient accumulation. Their state per parameter, which
recipe fields each reads, and the Keras behaviours worked around here: docs/design-notes.md
(Recipe optimizers).
"""

import math

import keras
import tensorflow as tf
from keras import ops

from zoo import optimizers
from zoo.memory.optimizer_state import RECIPE_OPTIMIZERS, check, state_bytes
from zoo.training.step import sum_over_replicas

__all__ = [
    "RECIPE_OPTIMIZERS", "AdamW", "Adafactor", "KerasAdafactor", "Lion", "SumReplicaGradients", "WarmupDecay",
    "optimizer", "schedule", "state_bytes",
]


@keras.saving.register_keras_serializable(package="recipes")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr(t) = peak * t / warmup for t < warmup, then decays from `peak` to
    `peak * min_ratio` at `steps`: linearly, or along a half cosine. `t` counts
    optimizer updates (micro-batches // accumulation_steps)."""

    def __init__(self, peak, warmup_steps, steps, decay="linear", min_ratio=0.0, accumulation_steps=1):
        self.peak, self.warmup_steps, self.steps = float(peak), int(warmup_steps), int(steps)
        self.decay, self.min_ratio, self.accumulation_steps = decay, float(min_ratio), int(accumulation_steps)

    def __call__(self, step):
        t = ops.cast(ops.floor_divide(step, self.accumulation_steps), "float32")
        warmup = self.peak * t / max(self.warmup_steps, 1)
        progress = ops.clip((t - self.warmup_steps) / max(self.steps - self.warmup_steps, 1), 0.0, 1.0)
        if self.decay == "cosine":
            shape = 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            shape = 1.0 - progress
        decayed = self.peak * (self.min_ratio + (1.0 - self.min_ratio) * shape)
        return ops.where(t < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak": self.peak, "warmup_steps": self.warmup_steps, "steps": self.steps, "decay": self.decay,
            "min_ratio": self.min_ratio, "accumulation_steps": self.accumulation_steps,
        }


def _replicas():
    """The replica context when tf.distribute runs this step on more than one replica, else None."""
    context = tf.distribute.get_replica_context()
    return context if context is not None and context.num_replicas_in_sync > 1 else None


class SumReplicaGradients:
    """Mixed into a Keras optimizer: sums the replicas' gradients (the strategy's all-reduce)
    before anything else sees them, so the global-norm clip, the accumulators and the update
    act on the global batch's gradient, as on one device. One device: the Keras optimizer."""

    def apply(self, grads, trainable_variables=None):
        if self.global_clipnorm:  # Keras' global norm miscounts IndexedSlices: see the module docstring
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        context = _replicas()
        if context is not None:
            grads = sum_over_replicas(grads, context)
        return super().apply(grads, trainable_variables)

    # Below: with the gradients already summed, each replica applies them to its own copies.
    def _all_reduce_sum_gradients(self, grads_and_vars):
        return grads_and_vars

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if _replicas() is None:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        for grad, variable in zip(grads, trainable_variables):
            self.update_step(grad, variable, learning_rate)

    def _backend_increment_gradient_accumulators(self, grads, acc_grads):
        if _replicas() is None:
            return super()._backend_increment_gradient_accumulators(grads, acc_grads)
        for grad, accumulator in zip(grads, acc_grads):
            accumulator.assign(accumulator + grad)

    def _apply_weight_decay(self, variables):
        if _replicas() is None or self.weight_decay is None:
            return super()._apply_weight_decay(variables)
        for variable in variables:
            if self._use_weight_decay(variable):
                lr = ops.cast(self.learning_rate, variable.dtype)
                variable.assign(variable - variable * ops.cast(self.weight_decay, variable.dtype) * lr)


# `rounding` (bfloat16 weights) composes with `SumReplicaGradients` on one device; zoo.optimizers.Rounding
# refuses a strategy with more than one replica at build, with the reason.
@keras.saving.register_keras_serializable(package="recipes")
class AdamW(SumReplicaGradients, optimizers.AdamW):
    """Keras' AdamW (bfloat16 weights with `rounding`), exact under `tf.distribute` (`SumReplicaGradients`)."""


@keras.saving.register_keras_serializable(package="recipes", name="FactoredAdafactor")
class Adafactor(SumReplicaGradients, optimizers.Adafactor):
    """The factored Adafactor of zoo.optimizers, exact under `tf.distribute` (`SumReplicaGradients`)."""


# Registered under the name recipes' "adafactor" was saved with before it became the factored one, so a
# model.keras of such a run loads with the optimizer it trained with.
@keras.saving.register_keras_serializable(package="recipes", name="Adafactor")
class KerasAdafactor(SumReplicaGradients, keras.optimizers.Adafactor):
    """Keras' Adafactor ("keras-adafactor": a full-size velocity), exact under `tf.distribute`."""


@keras.saving.register_keras_serializable(package="recipes")
class Lion(SumReplicaGradients, optimizers.Lion):
    """Keras' Lion (bfloat16 weights with `rounding`), exact under `tf.distribute` (`SumReplicaGradients`)."""


def schedule(recipe) -> WarmupDecay:
    return WarmupDecay(
        recipe.learning_rate, recipe.warmup_steps, recipe.steps, recipe.decay, recipe.min_lr_ratio,
        recipe.accumulation_steps,
    )


def optimizer(recipe, model) -> keras.optimizers.Optimizer:
    """`recipe.optimizer` for `model`, exact under `tf.distribute` too, with the recipe's
    schedule, global-norm clipping, weight decay and gradient accumulation. Norm
    scales/offsets and biases (every variable with fewer than two dimensions) are
    excluded from weight decay, as in BERT and nanoGPT. Which recipe fields each
    optimizer reads: the module docstring."""
    common = dict(
        learning_rate=schedule(recipe), weight_decay=recipe.weight_decay, global_clipnorm=recipe.clipnorm,
        gradient_accumulation_steps=recipe.accumulation_steps if recipe.accumulation_steps > 1 else None,
    )
    name = check(recipe.optimizer, RECIPE_OPTIMIZERS)
    rounding = {"rounding": recipe.weights_rounding}
    if name == "adamw":
        opt = AdamW(beta_1=recipe.beta_1, beta_2=recipe.beta_2, epsilon=recipe.epsilon, **rounding, **common)
    elif name == "lion":
        opt = Lion(beta_1=recipe.beta_1, beta_2=recipe.beta_2, **rounding, **common)
    elif name == "adafactor":  # the paper's defaults, no momentum; the step relative to the weights' RMS and
        opt = Adafactor(**rounding, **common)  # capped at 1/sqrt(t), as Keras' (the same steps, less state)
    else:  # Keras' defaults are the paper's (Shazeer & Stern 2018): decay 1 - t^-0.8, eps 1e-30 / 1e-3, d = 1
        opt = KerasAdafactor(relative_step=False, **common)
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    return opt
