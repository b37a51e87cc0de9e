"""Export a zoo model for serving: a SavedModel for TF Serving, a .tflite file for
devices, and a parity report that says how far the exported file is from Keras.

Both formats are built from one *serving model*: a functional Keras model over the
trained model's graph, called with `training=False` (so no recomputation wrapper
is ever traced) and with float32 outputs:

  encoders   token_ids, padding_mask, segment_ids -> sequence_output, pooled_output
             (+ the task head's `logits` when the model has one)
  decoders   token_ids, padding_mask -> next_token_logits [B, vocab] at the last
             real (non-padding) position; a decoder backbone gives sequence_output

A SavedModel can also take raw strings (`tokenizer=`): keras-hub tokenizers and
packers run in the graph, so whoever loads it needs `import tensorflow_text`.
Tokenizer ops do not convert to TFLite: tokenize outside the .tflite file.

Files are written to a temporary sibling and renamed into place, so a failed
export leaves nothing at `path` and an earlier export there survives.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from zoo import export_generate
from zoo.export_size import check_flatbuffer
from zoo.files import atomic_path, check_target

FORMATS = ("saved_model", "tflite")
QUANTIZATIONS = ("float16", "int8")
TEXT_SIGNATURE = "text"


# The serving graph ----------------------------------------------------------
def serving_model(model) -> keras.Model:
    """The inference graph of `model` as a functional Keras model (float32 outputs)."""
    check_exportable(model)
    inputs = dict(model.input)
    outputs = dict(model.output)
    backbone = getattr(model, "backbone", None)
    if backbone is not None:
        # The backbone's outputs as wired inside this task model (its one call site),
        # so serving computes the backbone once for all outputs.
        node = backbone._inbound_nodes[0]
        outputs.update(keras.tree.pack_sequence_as(backbone.output, node.output_tensors))
    if model.task == "causal_lm":
        # Project only the last real position: [B, H] -> [B, vocab], not [B, S, vocab].
        last = ops.maximum(ops.sum(inputs["padding_mask"], axis=1) - 1, 0)
        hidden = ops.take_along_axis(outputs["sequence_output"], last[:, None, None], axis=1)[:, 0]
        outputs = {"next_token_logits": model.lm_logits(hidden)}
    outputs = {name: ops.cast(tensor, "float32") for name, tensor in outputs.items()}
    return keras.Model(inputs, outputs, name=f"{model.name}_serving")


def check_exportable(model):
    if isinstance(model, keras.Model) and not model.built:
        raise ValueError(
            f"Cannot export {type(model).__name__} {model.name!r}: the model was never built. "
            "Export a model from zoo.get(...) or keras.models.load_model('model.keras')."
        )
    if not isinstance(model, keras.Model) or not hasattr(model, "spec"):
        raise ValueError(
            f"{type(model).__name__} {getattr(model, 'name', '')!r} is not a zoo model (it has no `spec`); "
            "export models built by zoo.get(...) or loaded from a .keras file saved from one."
        )


def mask_count(sequence_length):
    """How many masked-LM positions a fixed-shape (TFLite) export takes: BERT's 15%."""
    return max(1, round(0.15 * sequence_length))


def _input_specs(model, batch_size=None, sequence_length=None) -> dict:
    """int32 [batch, length] per input; a masked-LM model's `mask_positions` is [batch, masks]."""
    masks = sequence_length and mask_count(sequence_length)
    return {name: tf.TensorSpec([batch_size, masks if name == "mask_positions" else sequence_length], tf.int32,
                                name=name) for name in model.input}


def _check_length(token_ids, limit):
    """A serving-time error naming the limit, instead of a gather out of range deep in the graph."""
    tf.debugging.assert_less_equal(
        tf.shape(token_ids)[1], limit,
        message=f"Input sequence length exceeds the exported length of {limit} tokens; "
        f"truncate inputs to {limit} tokens or export with a larger sequence_length.",
    )


def _exported_length(model, sequence_length):
    limit = model.spec.max_sequence_length
    if sequence_length is None:
        return limit
    if not 0 < sequence_length <= limit:
        raise ValueError(
            f"sequence_length={sequence_length} is outside this model's range 1..{limit}; "
            f"choose a length of at most {limit} positions."
        )
    return sequence_length


def text_packer(model, tokenizer, sequence_length):
    """strings [B] -> the model's input dict, with keras-hub's packers.

    BERT family: [CLS] text [SEP], padded with [PAD], segment 0 (as BertTextClassifierPreprocessor).
    Llama family: the tokenizer's start token if it has one, padded on the right.
    """
    from keras_hub.layers import MultiSegmentPacker, StartEndPacker

    if model.task == "masked_lm":
        raise ValueError("A masked-LM model also takes mask_positions, which text alone does not give; "
                         "export its backbone (model.backbone) or a classifier for a text signature.")
    if model.spec.family == "bert":
        ids = {}
        for token in ("[CLS]", "[SEP]", "[PAD]"):
            try:
                ids[token] = int(tokenizer.token_to_id(token))
            except (KeyError, ValueError, tf.errors.InvalidArgumentError):
                raise ValueError(f"The tokenizer's vocabulary has no {token} token, which BERT inputs need.") from None
        packer = MultiSegmentPacker(
            sequence_length, start_value=ids["[CLS]"], end_value=ids["[SEP]"], pad_value=ids["[PAD]"]
        )

        def pack(text):
            token_ids, segment_ids = packer(tokenizer(text))
            return {"token_ids": token_ids, "segment_ids": segment_ids,
                    "padding_mask": ops.cast(token_ids != ids["[PAD]"], "int32")}
    else:
        pad = getattr(tokenizer, "pad_token_id", None) or 0
        packer = StartEndPacker(
            sequence_length, start_value=getattr(tokenizer, "start_token_id", None), pad_value=pad,
            return_padding_mask=True,
        )

        def pack(text):
            token_ids, padding_mask = packer(tokenizer(text))
            return {"token_ids": token_ids, "padding_mask": ops.cast(padding_mask, "int32")}
    return pack


# Atomic writes ----------------------------------------------------------------
# SavedModel -------------------------------------------------------------------
def saved_model(model, path, sequence_length=None, tokenizer=None, overwrite=False, generate=None) -> Path:
    """Write `model`'s inference graph as a SavedModel for TF Serving.

    The graph is the inference one (`training=False`), so no recomputation wrapper
    is exported whatever the model's checkpointing policy, and outputs are float32.

    Args:
        model: a zoo model (`zoo.get(...)` or `keras.models.load_model("x.keras")`).
        path: the SavedModel folder (TF Serving expects `.../NAME/VERSION`).
        sequence_length: the longest token-id input served (default: the model's
            maximum); longer inputs are refused at serving time, naming the limit.
        tokenizer: a keras-hub tokenizer; adds the `text` signature (strings in,
            tokenized and packed in the graph; loading it needs `tensorflow_text`).
        overwrite: replace an existing export at `path`.
        generate: add the `generate` signature (and `generate_text` with a tokenizer):
            generation with a key/value cache inside the graph (zoo.export_generate).
            Default: for decoder language models.

    Returns:
        `path`, written atomically (an earlier export survives a failed one).

    Example:
    >>> model = zoo.get("enc-base", task="classifier", num_classes=3)
    >>> export.saved_model(model, "exports/enc-base/1", sequence_length=128)
    """
    serving = serving_model(model)
    length = _exported_length(model, sequence_length)
    generate = model.task == "causal_lm" if generate is None else generate
    if generate:
        export_generate.check_decoder(model)
    check_target(path, overwrite)
    pack = text_packer(model, tokenizer, length) if tokenizer is not None else None
    # Not archive.track(serving): add_endpoint saves the variables the endpoints use, and
    # tracking the model as well stores every weight twice (Keras 3.15's model.export does).
    archive = keras.export.ExportArchive()

    def serve(inputs):
        _check_length(inputs["token_ids"], length)
        return serving(inputs, training=False)

    archive.add_endpoint("serving_default", serve, input_signature=[_input_specs(model)])
    if pack is not None:
        if not tokenizer.built:
            tokenizer.build(None)  # keras-hub tokenizers hold their tables from __init__
        archive.track(tokenizer)

        def serve_text(text):
            return serving(pack(text), training=False)

        text_spec = tf.TensorSpec([None], tf.string, name="text")
        archive.add_endpoint(TEXT_SIGNATURE, serve_text, input_signature=[text_spec])
    if generate:
        export_generate.add_signatures(archive, model, tokenizer)
    with atomic_path(path, overwrite) as tmp:
        archive.write_out(str(tmp), verbose=False)
    return Path(path)


# TFLite -----------------------------------------------------------------------
@dataclass
class ParityReport:
    """How far an exported file's outputs are from Keras on one fixed batch.

    max_rel is the largest absolute difference over the largest |Keras output|:
    the error relative to the output's scale."""

    path: str
    quantize: str
    size_bytes: int
    batch_shape: tuple
    outputs: dict = field(default_factory=dict)  # name -> {"max_abs": .., "max_rel": ..}

    @property
    def max_abs(self) -> float:
        return max(o["max_abs"] for o in self.outputs.values())

    @property
    def max_rel(self) -> float:
        return max(o["max_rel"] for o in self.outputs.values())

    def as_dict(self) -> dict:
        return {"path": self.path, "quantize": self.quantize, "size_bytes": self.size_bytes,
                "batch_shape": list(self.batch_shape), "outputs": self.outputs,
                "max_abs": self.max_abs, "max_rel": self.max_rel}

    def __str__(self):
        rows = [f"{self.path} ({self.quantize}, {self.size_bytes / 2**20:.1f} MiB), batch {self.batch_shape}"]
        rows += [f"  {name:20s} max abs {o['max_abs']:.3g}  max rel {o['max_rel']:.3g}"
                 for name, o in self.outputs.items()]
        return "\n".join(rows)


def parity_batch(model, batch_size, sequence_length, seed=0) -> dict:
    """A fixed batch: random ids, the last quarter of every other row padded."""
    rng = np.random.default_rng(seed)
    shape = (batch_size, sequence_length)
    padding_mask = np.ones(shape, np.int32)
    padding_mask[1::2, sequence_length - sequence_length // 4:] = 0
    batch = {"token_ids": rng.integers(0, model.spec.vocab_size, shape).astype(np.int32) * padding_mask,
             "padding_mask": padding_mask, "segment_ids": np.zeros(shape, np.int32)}
    batch["segment_ids"][:, sequence_length // 2:] = 1
    batch["mask_positions"] = rng.integers(0, sequence_length, (batch_size, mask_count(sequence_length)), np.int32)
    return {name: batch[name] for name in model.input}


def compare(reference: dict, outputs: dict) -> dict:
    """Per output: max absolute difference, and that over the largest |reference|."""
    report = {}
    for name, ref in reference.items():
        ref = np.asarray(ref, np.float64)
        diff = float(np.max(np.abs(np.asarray(outputs[name], np.float64) - ref)))
        report[name] = {"max_abs": diff, "max_rel": diff / max(float(np.max(np.abs(ref))), 1e-30)}
    return report


def _convert(endpoints: dict, quantize) -> bytes:
    """Functions (name -> (fn taking one dict of inputs, its dict of TensorSpecs)) as one .tflite
    flatbuffer with a signature each, built-in ops only.

    Like keras' `export(format="litert")` (ExportArchive -> SavedModel -> converter),
    but without tracking the model, which saves every weight twice and, for a
    135M-parameter model, raised the peak memory by ~1.5 GiB; and without falling
    back to TF (flex) ops, which ai_edge_litert cannot run."""
    import tempfile

    archive = keras.export.ExportArchive()
    for name, (fn, specs) in endpoints.items():
        archive.add_endpoint(name, fn, input_signature=[specs])
    with tempfile.TemporaryDirectory() as folder:
        archive.write_out(folder, verbose=False)
        del archive
        converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=list(endpoints))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]  # alone: int8 weights, float activations
        if quantize == "float16":
            converter.target_spec.supported_types = [tf.float16]
        return converter.convert()


@contextmanager
def _plain_attention(model):
    """TFLite's converter cannot legalise the chunked attention core's loops (their
    TensorLists and 5-D slices), so a .tflite file holds the plain core: at the
    fixed, short lengths of on-device models it is also the faster one."""
    saved = model.attention
    model.set_attention("plain")
    try:
        yield
    finally:
        model.set_attention(*saved)


def run_tflite(path, inputs: dict) -> dict:
    """Outputs of a .tflite file on `inputs`, run by ai_edge_litert's interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner()
    return runner(**inputs)


def tflite(model, path, quantize=None, batch_size=1, sequence_length=128, overwrite=False) -> ParityReport:
    """Write `model`'s inference graph as a .tflite file and check it against Keras.

    The file has fixed input shapes [batch_size, sequence_length] and built-in ops
    only; tokenization stays outside it.

    Args:
        model: a zoo model.
        path: the .tflite file, written atomically.
        quantize: None (float32), "float16" (float16 weights) or "int8" (dynamic
            range: int8 weights, float activations; no calibration data needed).
        batch_size, sequence_length: the fixed input shape.
        overwrite: replace an existing file at `path`.

    Returns:
        A `ParityReport`: the file run with ai_edge_litert against Keras, per output.

    Example:
    >>> report = export.tflite(zoo.get("enc-base"), "enc-base-int8.tflite", quantize="int8")
    >>> report.max_rel
    """
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"Unknown quantization {quantize!r}; use None, {', '.join(map(repr, QUANTIZATIONS))}.")
    if Path(path).suffix != ".tflite":
        raise ValueError(f"A TFLite file name must end in .tflite, got {str(path)!r}.")
    serving = serving_model(model)
    length = _exported_length(model, min(sequence_length, model.spec.max_sequence_length))
    check_flatbuffer(model, quantize)  # the 2 GB flatbuffer limit, before any conversion work
    check_target(path, overwrite)
    specs = _input_specs(model, batch_size, length)
    with atomic_path(path, overwrite) as tmp, _plain_attention(model):
        tmp.write_bytes(_convert({"serving_default": (lambda inputs: serving(inputs, training=False), specs)},
                                 quantize))
        batch = parity_batch(model, batch_size, length)
        reference = {name: np.asarray(value) for name, value in serving(batch, training=False).items()}
        report = ParityReport(str(path), quantize or "float32", tmp.stat().st_size, (batch_size, length),
                              compare(reference, run_tflite(tmp, batch)))
    return report
