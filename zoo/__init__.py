"""keras-zoo: memory-efficient Transformers for Keras 3 on TensorFlow.

    model = zoo.get("enc-base", checkpointing=True)
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from zoo.checkpointing import POLICIES  # noqa: E402
from zoo.registry import ModelSpec, names, register, spec  # noqa: E402
from zoo import models  # noqa: E402,F401  (registers the classes, so keras.models.load_model works after `import zoo`)

__version__ = "0.1.0"

PRECISIONS = ("float32", "bfloat16", "float16", "mixed_bfloat16", "mixed_float16")


def get(name, checkpointing=None, dtype=None, task=None, weights=None, **overrides):
    """Build the registered model `name` (or a `ModelSpec`) as a Keras model.

    checkpointing: "none" | "full" | "selective" (True = "full").
    dtype: a Keras dtype policy name ("float32", "mixed_bfloat16", ...); None = global policy.
    task: "backbone", "masked_lm", "classifier" (encoders), "causal_lm" (decoders);
          default: backbone for encoders, causal_lm for decoders.
    weights: a Hugging Face folder or repo id to load weights from (see zoo.hub).
    overrides: spec fields to change, e.g. num_layers=2, hidden_dim=64.
    Task arguments (num_classes for "classifier") may be passed as overrides too.
    """
    import keras

    from zoo import checkpointing as ckpt
    from zoo.models import TASKS

    if weights is not None:
        from zoo import hub

        return hub.load(weights, task=task, checkpointing=checkpointing, dtype=dtype, name=name, **overrides)
    task_args = {k: overrides.pop(k) for k in ("num_classes",) if k in overrides}
    model_spec = spec(name).replace(**overrides) if overrides else spec(name)
    policy = ckpt.resolve(checkpointing)
    if dtype is not None and dtype not in PRECISIONS:
        raise ValueError(f"Unknown dtype policy {dtype!r}; known: {', '.join(PRECISIONS)}.")
    task = task or model_spec.default_task
    classes = TASKS[model_spec.family]
    if task not in classes:
        raise ValueError(f"Unknown task {task!r} for {model_spec.family} models; known: {', '.join(classes)}.")
    if task_args and task != "classifier":
        raise ValueError(f"{sorted(task_args)} only apply to task='classifier', not {task!r}.")
    dtype = dtype or keras.config.dtype_policy().name
    return classes[task](model_spec, checkpointing=policy, dtype=dtype, **task_args)


__all__ = ["POLICIES", "PRECISIONS", "ModelSpec", "get", "names", "register", "spec"]
