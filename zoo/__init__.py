"""keras-zoo: memory-efficient Transformers for Keras 3 on TensorFlow.

    model = zoo.get("enc-base", checkpointing=True)
"""

import os
import warnings

from zoo import verbosity

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Peak memory is measured with TensorFlow's allocator (zoo.memory.measure), which keeps statistics on the CPU only as
# a BFC allocator: with oneDNN on (TensorFlow's default only on CPUs with AVX-512 VNNI or AMX), or with this variable.
# TensorFlow reads it when it first makes its devices, not at import, so this works after `import tensorflow` too.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
verbosity.configure_tensorflow_env()
if verbosity.problem():
    warnings.warn(verbosity.problem(), stacklevel=2)

# Importing the models registers their classes, so keras.models.load_model works after `import zoo`. TensorFlow's
# terminal lines as it loads (here, and again as keras-hub loads tensorflow-text) are silenced: zoo.verbosity.
with verbosity.quiet_import():
    from zoo import export, generation, grpo, hub, loading, lora, memory, models, optimizers, preference, quantization
verbosity.set_python_loggers()
from zoo.loading import load
from zoo.ops.recompute import POLICIES
from zoo.registry import PRECISIONS, ModelSpec, names, register, spec

__version__ = "0.1.0"


def get(name, checkpointing=None, dtype=None, task=None, weights=None, quantize=None, **overrides):
    """Build a registered model (or a `ModelSpec`) as a Keras model.

    Args:
        name: a registered name (`zoo.names()`) or a `ModelSpec`.
        checkpointing: activation recomputation, "none" | "full" | "selective"
            (`True` = "full").
        dtype: a Keras dtype policy name from `PRECISIONS`; None: the global policy.
        task: "backbone", "masked_lm", "classifier" (encoders) or "causal_lm"
            (decoders). None: backbone for encoders, causal_lm for decoders.
        weights: a Hugging Face folder or repo id to load weights from (`zoo.hub.load`);
            its shape must be `name`'s.
        quantize: "int8" | "int4": the frozen base quantized as `zoo.quantization.quantize_base` does;
            with `weights`, each tensor is quantized as it is read (`zoo.hub.load`), so the
            float model never exists.
        **overrides: spec fields to change (`num_layers=2, hidden_dim=64`), and the
            task's own arguments (`num_classes=` for "classifier").

    Returns:
        A built Keras model (a `zoo.models.ZooModel`).

    Example:
    >>> model = zoo.get("enc-base", checkpointing="selective", num_layers=2)
    >>> model.checkpointing
    'selective'
    """
    if weights is not None:
        return hub.load(weights, task=task, checkpointing=checkpointing, dtype=dtype, name=name, quantize=quantize,
                        **overrides)
    task_args = {k: overrides.pop(k) for k in ("num_classes",) if k in overrides}
    model_spec = spec(name).replace(**overrides) if overrides else spec(name)
    model = models.build(model_spec, task=task, checkpointing=checkpointing, dtype=dtype, **task_args)
    if quantize is not None:  # random weights: quantized from float ones
        quantization.quantize_base(model, quantize)
    return model


__all__ = [
    "POLICIES", "PRECISIONS", "ModelSpec", "export", "generation", "get", "grpo", "hub", "load", "loading", "lora",
    "memory", "models", "names", "optimizers", "preference", "quantization", "register", "spec",
]
