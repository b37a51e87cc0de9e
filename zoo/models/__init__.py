"""Model classes by family and task, and `build`, the one place a spec becomes a model."""

import keras

from zoo.models.decoder import DecoderBackbone, DecoderCausalLM
from zoo.models.encoder import EncoderBackbone, EncoderClassifier, EncoderMaskedLM
from zoo.ops.recompute import policy_name
from zoo.registry import DECODERS, FAMILIES, PRECISIONS, ModelSpec

# family -> task -> class. The task names are the ones recipes, export and the Hub format use.
_ENCODER_TASKS = {cls.task: cls for cls in (EncoderBackbone, EncoderMaskedLM, EncoderClassifier)}
_DECODER_TASKS = {cls.task: cls for cls in (DecoderBackbone, DecoderCausalLM)}
TASKS = {family: _DECODER_TASKS if family in DECODERS else _ENCODER_TASKS for family in FAMILIES}


def build(spec: ModelSpec, task=None, checkpointing=None, dtype=None, **task_args) -> keras.Model:
    """Build the Keras model for `spec` and `task`, with random weights.

    Args:
        spec: a `ModelSpec`.
        task: "backbone", "masked_lm" or "classifier" (encoders); "backbone" or
            "causal_lm" (decoders). None: the family's default.
        checkpointing: "none", "full" or "selective" (`True` = "full").
        dtype: a Keras dtype policy name from `PRECISIONS`; None: the global policy.
        **task_args: the task's own arguments (`num_classes` for "classifier").

    Returns:
        A built `ZooModel`.

    Example:
    >>> build(zoo.spec("dec-base").replace(num_layers=2), checkpointing="full").task
    'causal_lm'
    """
    policy = policy_name(checkpointing)
    if dtype is not None and dtype not in PRECISIONS:
        raise ValueError(f"Unknown dtype policy {dtype!r}; known: {', '.join(PRECISIONS)}.")
    task = task or spec.default_task
    classes = TASKS[spec.family]
    if task not in classes:
        raise ValueError(f"Unknown task {task!r} for {spec.family} models; known: {', '.join(classes)}.")
    if task_args and task != "classifier":
        raise ValueError(f"{sorted(task_args)} only apply to task='classifier', not {task!r}.")
    dtype = dtype or keras.config.dtype_policy().name
    return classes[task](spec, checkpointing=policy, dtype=dtype, **task_args)


__all__ = [
    "TASKS", "DecoderBackbone", "DecoderCausalLM", "EncoderBackbone", "EncoderClassifier", "EncoderMaskedLM",
    "build",
]
