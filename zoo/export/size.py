"""How large a .tflite export will be and how much memory converting it takes, known
before any conversion starts; and the refusal of a file a flatbuffer cannot hold.

A .tflite file is one FlatBuffer, whose offsets are 32-bit: 2 GB at most, and TensorFlow's
converter fails past it only after building the whole model in memory (dec-1b in float32
was killed at 22.8 GB RSS). Bytes per weight as the converter writes them, and the
converter's memory, measured: docs/design-notes.md ("Generation in exports").
"""

from __future__ import annotations

import numpy as np

FLATBUFFER_LIMIT = 2**31 - 1  # bytes: flatbuffers' 32-bit offsets
OVERHEAD = 2**20  # the graph, signatures and alignment of a decoder: well under 1 MiB measured
INT8_MIN_ELEMENTS = 1024  # the converter leaves smaller tensors in float32
# An int8 channel: its float32 scale and int64 zero point (12 bytes) and ~15 more measured per channel
# (dec-base int8 prefill/decode files at 2 and 10 layers were 0.76 and 1.37 MB above 12 bytes a channel).
CHANNEL_BYTES = 28


def quantized(shape) -> bool:
    """Whether the converter stores a variable of `shape` as int8: matrices of at least INT8_MIN_ELEMENTS."""
    return len(shape) >= 2 and int(np.prod(shape)) >= INT8_MIN_ELEMENTS


def weight_bytes(model, quantize=None) -> int:
    """The bytes `model`'s weights take in a .tflite file with `quantize` (None, "float16", "int8"):
    float32 4, float16 2; int8 1 plus CHANNEL_BYTES per output channel for matrices of at least
    INT8_MIN_ELEMENTS, 4 for the rest; an int8 file holds a tied embedding twice (the lookup
    table and the LM head's copy, one channel per vocabulary row, are quantized separately)."""
    total = 0
    for variable in model.weights:
        shape = tuple(variable.shape)
        size = int(np.prod(shape)) if shape else 1
        if quantize == "float16":
            total += 2 * size
        elif quantize == "int8" and quantized(shape):
            total += size + CHANNEL_BYTES * shape[-1]
        else:
            total += 4 * size
    spec = getattr(model, "spec", None)
    if quantize == "int8" and spec is not None and spec.tie_embeddings and getattr(model, "task", None) == "causal_lm":
        total += spec.vocab_size * (spec.hidden_dim + CHANNEL_BYTES)
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


# Peak memory of a conversion (benchmarks/tflite_memory.py, dec-base at 10 layers): what the converter
# adds over its process's start, in float32 copies of the weights it imports. int8: 5.5 for the serving
# graph, 7.7 for a prefill/decode file (two signatures); the larger is used.
CONVERTER_COPIES = {None: 6.8, "float16": 6.8, "int8": 7.7}
# stand_in (zoo.export.stand_in): above the process, a fixed part and bytes per parameter of the weights
# it quantizes (benchmarks/tflite_memory.py, 2026-12-02: dec-base at 10 layers 1.21 GiB, dec-1b 5.20): the
# converter's int8 tensors of the stand-ins for every signature before equal buffers are merged, the
# file's object and its bytes.
STAND_IN_FIXED = 2**30
STAND_IN_BYTES_PER_PARAMETER = 4.5


def conversion_bytes(model, quantize=None, int8_mode="dynamic_range") -> int:
    """The memory a conversion needs beyond what this process holds now."""
    if quantize == "int8" and int8_mode == "stand_in":
        replaced = sum(int(np.prod(v.shape)) for v in model.weights if quantized(tuple(v.shape)))
        return int(STAND_IN_FIXED + STAND_IN_BYTES_PER_PARAMETER * replaced)
    return int(CONVERTER_COPIES[quantize] * weight_bytes(model))


