"""The optimizer a recipe asks for: AdamW with global-norm clipping, weight decay
on matrices only, and a warmup-then-decay learning-rate schedule.

Keras has `CosineDecay(warmup_steps=...)` but no linear warmup + linear decay, and
its optimizers call a schedule with the count of *micro*-batches when
`gradient_accumulation_steps` is set (keras 3.15 `_get_current_learning_rate`
passes `_iterations`, not `iterations`), which would run the schedule k times too
fast. `WarmupDecay` covers both decays and divides by the accumulation count.

Under `tf.distribute` Keras 3.15 clips each replica's own gradients and sums them
only afterwards (`TFOptimizer._backend_update_step`), so `global_clipnorm` clips by
the wrong norm; and with `gradient_accumulation_steps` its `cond` (update or
accumulate) holds `merge_call`s, which tf.distribute refuses in a replica's control
flow (keras #20582). `AdamW` sums the gradients first, after which every replica
holds the same gradient and updates its own copy of each variable (aggregation
"none"): no merge_call is left inside the `cond`.
"""

import math

import keras
import tensorflow as tf
from keras import ops


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


@keras.saving.register_keras_serializable(package="recipes")
class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW that sums the replicas' gradients (the strategy's all-reduce) before
    anything else sees them: the global-norm clip, the accumulators and the update then
    act on the global batch's gradient, as on one device. One device: Keras' AdamW."""

    def apply(self, grads, trainable_variables=None):
        context = _replicas()
        if context is not None:
            grads = list(grads)
            present = [i for i, g in enumerate(grads) if g is not None]
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
            for i, g in zip(present, summed):
                grads[i] = g
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


def schedule(recipe) -> WarmupDecay:
    return WarmupDecay(
        recipe.learning_rate, recipe.warmup_steps, recipe.steps, recipe.decay, recipe.min_lr_ratio,
        recipe.accumulation_steps,
    )


def optimizer(recipe, model) -> AdamW:
    """AdamW for `model`, exact under `tf.distribute` too. Norm scales/offsets and biases (every variable with fewer
    than two dimensions) are excluded from weight decay, as in BERT and nanoGPT."""
    opt = AdamW(
        learning_rate=schedule(recipe), beta_1=recipe.beta_1, beta_2=recipe.beta_2, epsilon=recipe.epsilon,
        weight_decay=recipe.weight_decay, global_clipnorm=recipe.clipnorm,
        gradient_accumulation_steps=recipe.accumulation_steps if recipe.accumulation_steps > 1 else None,
    )
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    return opt
