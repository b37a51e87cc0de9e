"""The parts of a training step the zoo's steps share with Keras', and `backbone_step`: Keras'
step with the loss made from the backbone's outputs (the causal LM's chunked loss). Which step
runs is decided in `ZooModel.train_step`. Each reports the loss and metrics as Keras does, so
`fit`, its callbacks and its progress bar see no difference.
"""

import keras
import tensorflow as tf

from zoo.training.keras_optimizer import split_scaling, unscale_loss_for_distribution


def check_weights(model):
    """bfloat16 weights train only with an optimizer that rounds into them (zoo.optimizers'
    `rounding`): Keras' own round each update to nearest, and its AdamW never moves one."""
    inner, _ = split_scaling(model.optimizer)
    bf16 = [v.path for v in model.trainable_variables if keras.backend.standardize_dtype(v.dtype) == "bfloat16"]
    if bf16 and getattr(inner, "rounding", None) is None:
        raise ValueError(
            f"{type(model).__name__} has bfloat16 weights (e.g. {bf16[0]!r}), and {type(inner).__name__} would round "
            "each update to nearest, losing every update below half a bfloat16 step (Keras' AdamW never moves one). "
            "Compile with zoo.optimizers.AdamW, Lion or Adafactor(..., rounding='stochastic'), or build the model "
            "with float32 weights (dtype='mixed_bfloat16').")


def sum_over_replicas(grads, context):
    """Every present gradient summed across the replicas of `context` (one `all_reduce`); Nones
    stay in place. The fused update and recipes' optimizers both sum before anything else reads them."""
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
    for i, g in zip(present, summed):
        grads[i] = g
    return grads


def track_loss(model, x, loss):
    """The running loss `fit` reports, weighted by the batch size as Keras' own step does."""
    model._loss_tracker.update_state(unscale_loss_for_distribution(loss),
                                     sample_weight=tf.shape(x["token_ids"])[0])


def metrics(model, x, y, y_pred, sample_weight):
    """The step's logs. Without outputs (a chunked loss updated the metrics itself) they are read as they are."""
    if y_pred is None:
        return model.get_metrics_result()
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def unpack(model, data):
    """(x, y, sample_weight) of a batch, with the model's optional inputs filled in and checked."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    x = model.complete_inputs(x)
    model.check_inputs(x)
    return x, y, sample_weight


def backbone_step(model, data):
    """Keras' train_step, except that the loss comes from `model.training_loss` on the
    backbone's outputs."""
    x, y, sample_weight = unpack(model, data)
    with tf.GradientTape() as tape:
        outputs = model.backbone({name: x[name] for name in model.backbone.input}, training=True)
        loss, y_pred = model.training_loss(outputs, x, y, sample_weight)
        track_loss(model, x, loss)
        scaled = model.optimizer.scale_loss(loss)
    weights = model.trainable_weights
    model.optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))
    return metrics(model, x, y, y_pred, sample_weight)


def backbone_test_step(model, data):
    """Keras' test_step, with the loss from `model.training_loss(..., training=False)` on the
    backbone's outputs (the chunked loss: no whole logits in validation either)."""
    x, y, sample_weight = unpack(model, data)
    outputs = model.backbone({name: x[name] for name in model.backbone.input}, training=False)
    loss, y_pred = model.training_loss(outputs, x, y, sample_weight, training=False)
    track_loss(model, x, loss)
    return metrics(model, x, y, y_pred, sample_weight)


def needs_lm_head(model, purpose):
    """Refuse a model without a causal LM head for a step that scores tokens (`purpose` says which)."""
    if not hasattr(model, "lm_logits"):
        raise ValueError(f"{purpose} with an LM head; {type(model).__name__} has none (build the causal LM: "
                         "task='causal_lm').")


def attach_step(model, name, step):
    """`step` as `model.<name>`, the step `ZooModel.train_step` dispatches to (None: detached); compiled functions
    retrace either way. Returns `step`."""
    if step is None:
        model.__dict__.pop(name, None)
    else:
        model.__dict__[name] = step
    model._drop_compiled_functions()
    return step
