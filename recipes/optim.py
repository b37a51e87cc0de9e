"""The optimizer a recipe asks for: AdamW with global-norm clipping, weight decay
on matrices only, and a warmup-then-decay learning-rate schedule.

Keras has `CosineDecay(warmup_steps=...)` but no linear warmup + linear decay, and
its optimizers call a schedule with the count of *micro*-batches when
`gradient_accumulation_steps` is set (keras 3.15 `_get_current_learning_rate`
passes `_iterations`, not `iterations`), which would run the schedule k times too
fast. `WarmupDecay` covers both decays and divides by the accumulation count.
"""

import math

import keras
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


def schedule(recipe) -> WarmupDecay:
    return WarmupDecay(
        recipe.learning_rate, recipe.warmup_steps, recipe.steps, recipe.decay, recipe.min_lr_ratio,
        recipe.accumulation_steps,
    )


def optimizer(recipe, model) -> keras.optimizers.AdamW:
    """AdamW for `model`. Norm scales/offsets and biases (every variable with fewer
    than two dimensions) are excluded from weight decay, as in BERT and nanoGPT."""
    opt = keras.optimizers.AdamW(
        learning_rate=schedule(recipe), beta_1=recipe.beta_1, beta_2=recipe.beta_2, epsilon=recipe.epsilon,
        weight_decay=recipe.weight_decay, global_clipnorm=recipe.clipnorm,
        gradient_accumulation_steps=recipe.accumulation_steps if recipe.accumulation_steps > 1 else None,
    )
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    return opt
