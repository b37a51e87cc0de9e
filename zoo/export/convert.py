"""Functions of a zoo model -> one .tflite flatbuffer, and the two ways an int8 file is made.

    dynamic_range  the converter quantizes the float weights itself (`Optimize.DEFAULT`):
                   hybrid int8 kernels; its peak holds ~8 float32 copies of the weights
                   (dec-1b: ~35 GB)
    stand_in       the converter converts the same graph with a constant stand-in for each
                   weight it would quantize, and the real weights are quantized into its file
                   after, with its formula: the same file, tensor for tensor, in a fraction of
                   the memory (zoo.export.stand_in)
    auto           dynamic_range when its predicted peak fits the memory available now

Measurements and the converter's copies: docs/design-notes.md ("Generation in exports").
"""

import logging
import tempfile
from contextlib import contextmanager
from pathlib import Path

import keras
import tensorflow as tf

from zoo.export import size, stand_in
from zoo.memory import budget

QUANTIZATIONS = ("float16", "int8")
INT8_MODES = ("auto", "dynamic_range", "stand_in")
log = logging.getLogger("zoo.export")


@contextmanager
def plain_attention(model):
    """TFLite's converter cannot legalise the chunked attention core's loops (their
    TensorLists and 5-D slices), so a .tflite file holds the plain core: at the
    fixed, short lengths of on-device models it is also the faster one."""
    saved = model.attention
    model.set_attention("plain")
    try:
        yield
    finally:
        model.set_attention(*saved)


def check_quantize(quantize, int8_mode="auto"):
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"Unknown quantization {quantize!r}; use None, {', '.join(map(repr, QUANTIZATIONS))}.")
    if int8_mode not in INT8_MODES:
        raise ValueError(f"Unknown int8_mode {int8_mode!r}; use one of {', '.join(INT8_MODES)}.")


def resolve_int8_mode(model, quantize, int8_mode="auto"):
    """The int8 route for `model` (None unless quantize is "int8"); "auto" picks dynamic_range
    when its predicted conversion peak fits the memory available now, else stand_in."""
    if quantize != "int8":
        return None
    if int8_mode != "auto":
        return int8_mode
    need, available = size.conversion_bytes(model, "int8", "dynamic_range"), budget.available_bytes()
    if need <= available:
        return "dynamic_range"
    log.warning("int8 with the converter's dynamic-range quantization would need ~%.1f GiB, %.1f GiB are available: "
                "converting stand-in weights and quantizing the real ones into the file (int8_mode='stand_in', "
                "~%.1f GiB).", need / 2**30, available / 2**30,
                size.conversion_bytes(model, "int8", "stand_in") / 2**30)
    return "stand_in"


def _converter(folder, signature_keys, quantize):
    converter = tf.lite.TFLiteConverter.from_saved_model(str(folder), signature_keys=list(signature_keys))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # alone: int8 weights, float activations
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    return converter


def convert(endpoints: dict, quantize) -> bytes:
    """Functions (name -> (fn taking one dict of inputs, its dict of TensorSpecs)) as one .tflite
    flatbuffer with a signature each, built-in ops only.

    Like keras' `export(format="litert")` (ExportArchive -> SavedModel -> converter),
    but without tracking the model, which saves every weight twice and, for a
    135M-parameter model, raised the peak memory by ~1.5 GiB; and without falling
    back to TF (flex) ops, which ai_edge_litert cannot run."""
    with tempfile.TemporaryDirectory() as folder:
        _write_saved_model(endpoints, folder)
        return _converter(folder, endpoints, quantize).convert()


def _write_saved_model(endpoints, folder):
    archive = keras.export.ExportArchive()
    for name, (fn, specs) in endpoints.items():
        archive.add_endpoint(name, fn, input_signature=[specs])
    archive.write_out(str(folder), verbose=False)


def write_flatbuffer(model, make_endpoints, shape: dict, target, quantize=None, int8_mode="dynamic_range"):
    """Convert `make_endpoints(model, **shape)` into the file `target`, with stand-in weights
    written over after (zoo.export.stand_in) for int8_mode="stand_in"."""
    with plain_attention(model):
        endpoints = make_endpoints(model, **shape)
        if quantize == "int8" and int8_mode == "stand_in":
            stand_ins = stand_in.StandIns(model)
            flatbuffer = stand_in.write_weights(convert(stand_ins.endpoints(endpoints), quantize), stand_ins)
        else:
            flatbuffer = convert(endpoints, quantize)
    Path(target).write_bytes(flatbuffer)
