"""The private parts of Keras' optimizer API that zoo relies on, in one place.

The fused update applies an optimizer to one block's variables at a time, which Keras' public
`apply` cannot do without advancing the step counter; recipes.optim overrides a few hooks to sum
replicas' gradients first; zoo.optimizers keeps per-variable slots and rounds bfloat16 writes. All
use the methods below. `PRIVATE_API` names each with the
parameters it has in the Keras version pyproject.toml pins, and tests/zoo/test_keras_optimizer.py
fails by name when a Keras upgrade renames or reshapes one.
"""

from keras.optimizers import LossScaleOptimizer
from keras.src.losses.loss import unscale_loss_for_distribution as _unscale

# "Class.method": its parameters (self first). Classes: keras.src.optimizers.base_optimizer.BaseOptimizer,
# the TensorFlow backend's optimizer (keras.src.backend.tensorflow.optimizer.TFOptimizer), LossScaleOptimizer.
PRIVATE_API = {
    "BaseOptimizer._clip_gradients": ("self", "grads"),
    "BaseOptimizer._apply_weight_decay": ("self", "variables"),
    "BaseOptimizer._use_weight_decay": ("self", "variable"),
    "BaseOptimizer._var_key": ("self", "variable"),
    "BaseOptimizer._get_variable_index": ("self", "variable"),
    "BaseOptimizer._overwrite_variable_with_gradient": ("self", "variable"),
    "TFOptimizer._backend_update_step": ("self", "grads", "trainable_variables", "learning_rate"),
    "TFOptimizer._all_reduce_sum_gradients": ("self", "grads_and_vars"),
    "BaseOptimizer._backend_increment_gradient_accumulators": ("self", "grads", "acc_grads"),
    "LossScaleOptimizer._stateful_handle_non_finite_grads": ("self",),
    "unscale_loss_for_distribution": ("value",),
}


def split_scaling(optimizer):
    """(the optimizer that updates, its LossScaleOptimizer or None)."""
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.inner_optimizer, optimizer
    return optimizer, None


def clip_each(optimizer, grads):
    """The optimizer's own per-variable `clipnorm` / `clipvalue` (gradients unchanged without)."""
    return optimizer._clip_gradients(grads)


def update(optimizer, grads, variables):
    """Decoupled weight decay, then the optimizer's update of `variables`, without advancing its
    step counter (the caller advances it once per step)."""
    optimizer._apply_weight_decay(variables)
    optimizer._backend_update_step(grads, variables, optimizer.learning_rate)


def decays(optimizer, variable) -> bool:
    """Whether the optimizer's weight decay applies to `variable` (not excluded)."""
    return optimizer._use_weight_decay(variable)


def variable_index(optimizer, variable) -> int:
    """`variable`'s place among the variables the optimizer was built with (its slots' index)."""
    return optimizer._get_variable_index(variable)


def overwritten(optimizer, variable) -> bool:
    """Whether the optimizer overwrites `variable` with its gradient (Keras' float8 scales): no slots."""
    return optimizer._overwrite_variable_with_gradient(variable)


def skip_step(scaler):
    """A non-finite step under dynamic loss scaling: halve the scale, reset the growth counter."""
    scaler._stateful_handle_non_finite_grads()


def grow_scale(scaler):
    """LossScaleOptimizer's bookkeeping after a finite step: double the scale every
    `dynamic_growth_steps` finite steps."""
    import tensorflow as tf

    def upscale():
        scaler.step_counter.assign(0)
        scaler.dynamic_scale.assign(scaler.dynamic_scale * 2.0)

    def count():
        scaler.step_counter.assign_add(1)

    tf.cond(tf.equal(scaler.step_counter, scaler.dynamic_growth_steps - 1), upscale, count)


def unscale_loss_for_distribution(loss):
    """The loss as one replica reports it (Keras scales it by the replica count for the gradients)."""
    return _unscale(loss)
