"""How large an export will be, known before any conversion starts, and the refusal of a
TFLite export that cannot fit a flatbuffer.

A .tflite file is one FlatBuffer, whose offsets are 32-bit: 2 GB at most (TensorFlow's
converter fails past it only after building the whole model in memory: dec-1b in
float32 was killed at 22.8 GB RSS). The weights' bytes follow from the variables and
the quantization, so the size is checked first and a model that cannot fit is refused
with the size, the limit and the fix.

Bytes per weight, as TensorFlow's converter writes them:
    float32   4
    float16   2 (`supported_types=[tf.float16]`: every float constant)
    int8      1 for matrices of at least 1024 elements (dynamic-range quantization, one
              float32 scale per output channel), 4 for the rest (norms, small tensors);
              a tied embedding twice (measured: the converter quantizes the lookup table
              and the LM head's copy of it separately; dec-base's 28.3 MB embedding is in
              its int8 file twice, while the float32 file holds it once)
"""

from __future__ import annotations

import numpy as np

FLATBUFFER_LIMIT = 2**31 - 1  # bytes: flatbuffers' 32-bit offsets
OVERHEAD = 2**20  # the graph, signatures and alignment of a decoder: well under 1 MiB measured
INT8_MIN_ELEMENTS = 1024  # the converter leaves smaller tensors in float32


def weight_bytes(model, quantize=None) -> int:
    """The bytes `model`'s weights take in a .tflite file with `quantize` (None, "float16", "int8")."""
    total = 0
    for variable in model.weights:
        shape = tuple(variable.shape)
        size = int(np.prod(shape)) if shape else 1
        if quantize == "float16":
            total += 2 * size
        elif quantize == "int8" and len(shape) >= 2 and size >= INT8_MIN_ELEMENTS:
            total += size + 4 * shape[-1]
        else:
            total += 4 * size
    spec = getattr(model, "spec", None)
    if quantize == "int8" and spec is not None and spec.tie_embeddings and getattr(model, "task", None) == "causal_lm":
        total += spec.vocab_size * spec.hidden_dim
    return total


def tflite_bytes(model, quantize=None) -> int:
    """The size of a .tflite export of `model`: its weights and the graph's overhead."""
    return weight_bytes(model, quantize) + OVERHEAD


def check_flatbuffer(model, quantize=None, limit=None):
    """Refuse, before converting, a .tflite export larger than a flatbuffer can be (`limit`:
    default FLATBUFFER_LIMIT, read at call time so a test can lower it). Returns the estimate."""
    limit = FLATBUFFER_LIMIT if limit is None else limit
    size = tflite_bytes(model, quantize)
    if size <= limit:
        return size
    fixes = []
    if quantize != "int8" and tflite_bytes(model, "int8") <= limit:
        fixes.append(f"quantize='int8' (--quantize int8: {tflite_bytes(model, 'int8') / 1e9:.2f} GB)")
    if quantize is None and tflite_bytes(model, "float16") <= limit:
        fixes.append(f"quantize='float16' ({tflite_bytes(model, 'float16') / 1e9:.2f} GB)")
    fixes.append("a SavedModel (zoo.export.saved_model, --format saved_model), which has no such limit")
    raise ValueError(f"A {quantize or 'float32'} .tflite file of {model.name!r} would be {size / 1e9:.2f} GB; a "
                     f"TFLite flatbuffer holds at most {limit / 1e9:.2f} GB. Export with " + ", or ".join(fixes) + ".")
