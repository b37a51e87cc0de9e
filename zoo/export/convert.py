"""Functions of a zoo model -> one .tflite flatbuffer, and the two ways an int8 file is made.

    dynamic_range  the converter quantizes the float weights itself (`Optimize.DEFAULT`):
                   hybrid int8 kernels; its peak holds ~5.5 float32 copies of the weights
                   (dec-1b: ~24 GiB)
    weight_only    Keras quantizes the blocks' Dense kernels to int8 first, in a fresh
                   process that loads the model from disk, and a second fresh process
                   converts a SavedModel whose kernels are int8 (the converter folds their
                   dequantization and writes the same hybrid int8 kernels)
    auto           dynamic_range when its predicted peak fits the memory available now

Measurements and the converter's copies: docs/design-notes.md ("Generation in exports").
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import keras
import tensorflow as tf

from zoo.export import size

QUANTIZATIONS = ("float16", "int8")
INT8_MODES = ("auto", "dynamic_range", "weight_only")
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
    when its predicted conversion peak fits the memory available now, else weight_only."""
    if quantize != "int8":
        return None
    if int8_mode != "auto":
        return int8_mode
    need, available = size.conversion_bytes(model, "int8", "dynamic_range"), size.available_bytes()
    if need <= available:
        return "dynamic_range"
    log.warning("int8 with the converter's dynamic-range quantization would need ~%.1f GiB, %.1f GiB are available: "
                "quantizing the weights with Keras first (int8_mode='weight_only', ~%.1f GiB).",
                need / 2**30, available / 2**30, size.conversion_bytes(model, "int8", "weight_only") / 2**30)
    return "weight_only"


def weight_only_int8(model):
    """Keras' weight-only int8 (per output channel, no activation quantizer) on every Dense
    layer of the blocks; the embedding and LM head stay float for the converter to quantize
    (their int8 copies are made there either way)."""
    config = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    blocks = {id(layer) for block in model.backbone.blocks for layer in block._flatten_layers()}
    model.quantize(config=config, filters=lambda layer: isinstance(layer, keras.layers.Dense) and id(layer) in blocks)
    return model


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
    """Convert `make_endpoints(model, **shape)` into the file `target`: in this process, or for
    int8_mode="weight_only" in two fresh ones (`model` saved to a temporary folder; the first
    loads it, quantizes its kernels and writes the SavedModel, the second converts that with
    no model alive). This process's model is left as it was."""
    if int8_mode != "weight_only" or quantize != "int8":
        with plain_attention(model):
            Path(target).write_bytes(convert(make_endpoints(model, **shape), quantize))
        return
    with tempfile.TemporaryDirectory(prefix="zoo-export-") as folder:
        folder = Path(folder)
        model.save(folder / "model", zipped=False)  # unzipped: the weights stream to disk, not through memory
        job = {"model": str(folder / "model"), "saved_model": str(folder / "saved_model"), "target": str(target),
               "endpoints": f"{make_endpoints.__module__}:{make_endpoints.__name__}", "shape": shape}
        for stage in STAGES:
            _run_stage(stage, job)


STAGES = ("quantize", "convert")


def _run_stage(stage, job):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    done = subprocess.run([sys.executable, "-m", "zoo.export", stage, json.dumps(job)], capture_output=True,
                          text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"The weight-only int8 export's {stage} process failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")


def run_stage(stage, job: dict):
    """One fresh process of `write_flatbuffer` (`python -m zoo.export STAGE JOB_JSON`).

    quantize: load the model, quantize the blocks' kernels, write the SavedModel. Keras'
        build-time traces keep the float kernels alive in this process, so it ends here.
    convert: the converter on that SavedModel, int8 kernels in, no Keras model alive."""
    if stage == "quantize":
        import importlib

        module, name = job["endpoints"].split(":")
        model = weight_only_int8(keras.models.load_model(job["model"]))
        endpoints = getattr(importlib.import_module(module), name)(model, **job["shape"])
        with plain_attention(model):
            _write_saved_model(endpoints, job["saved_model"])
        Path(job["saved_model"], "signatures.json").write_text(json.dumps(list(endpoints)))
    elif stage == "convert":
        names = json.loads(Path(job["saved_model"], "signatures.json").read_text())
        Path(job["target"]).write_bytes(_converter(job["saved_model"], names, "int8").convert())
    else:
        raise ValueError(f"Unknown stage {stage!r}; one of {', '.join(STAGES)}.")
