"""A .tflite file of the serving graph for devices (fixed input shapes, built-in ops only),
checked against Keras: the parity report says how far the file's outputs are."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from zoo.export.convert import check_quantize, plain_attention, resolve_int8_mode, write_flatbuffer
from zoo.export.serving import exported_length, input_specs, mask_count, serving_model
from zoo.export.size import check_flatbuffer
from zoo.files import atomic_path, check_target


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
    int8_mode: str = None  # how an int8 file was made: "dynamic_range" or "stand_in" (zoo.export.convert)

    @property
    def max_abs(self) -> float:
        return max(o["max_abs"] for o in self.outputs.values())

    @property
    def max_rel(self) -> float:
        return max(o["max_rel"] for o in self.outputs.values())

    def as_dict(self) -> dict:
        return {"path": self.path, "quantize": self.quantize, "int8_mode": self.int8_mode,
                "size_bytes": self.size_bytes, "batch_shape": list(self.batch_shape), "outputs": self.outputs,
                "max_abs": self.max_abs, "max_rel": self.max_rel}

    def __str__(self):
        how = f", {self.int8_mode}" if self.int8_mode else ""
        rows = [f"{self.path} ({self.quantize}, {self.size_bytes / 2**20:.1f} MiB{how}), batch {self.batch_shape}"]
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


def run_tflite(path, inputs: dict) -> dict:
    """Outputs of a .tflite file on `inputs`, run by ai_edge_litert's interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner()
    return runner(**inputs)


def serving_endpoints(model, batch_size, sequence_length) -> dict:
    """The .tflite file's one signature: the serving graph at a fixed [batch, length]."""
    serving = serving_model(model)
    return {"serving_default": (lambda inputs: serving(inputs, training=False),
                                input_specs(model, batch_size, sequence_length))}


def tflite(model, path, quantize=None, batch_size=1, sequence_length=128, overwrite=False,
           int8_mode="auto") -> ParityReport:
    """Write `model`'s inference graph as a .tflite file and check it against Keras.

    The file has fixed input shapes [batch_size, sequence_length] and built-in ops
    only; tokenization stays outside it.

    Args:
        model: a zoo model.
        path: the .tflite file, written atomically.
        quantize: None (float32), "float16" (float16 weights) or "int8" (int8 weights,
            float activations; no calibration data needed).
        batch_size, sequence_length: the fixed input shape.
        overwrite: replace an existing file at `path`.
        int8_mode: how int8 weights are made: "dynamic_range" (the converter quantizes them;
            ~8 float32 copies of the weights in memory), "stand_in" (the converter sees
            constant stand-ins and the real weights are quantized into its file after: the same
            file in less memory) or "auto" (dynamic_range when it fits the memory available,
            else stand_in). See zoo.export.convert.

    Returns:
        A `ParityReport`: the file run with ai_edge_litert against Keras, per output.

    Example:
    >>> report = export.tflite(zoo.get("enc-base"), "enc-base-int8.tflite", quantize="int8")
    >>> report.max_rel
    """
    check_quantize(quantize, int8_mode)
    if Path(path).suffix != ".tflite":
        raise ValueError(f"A TFLite file name must end in .tflite, got {str(path)!r}.")
    serving = serving_model(model)
    length = exported_length(model, min(sequence_length, model.spec.max_sequence_length))
    check_flatbuffer(model, quantize)  # the 2 GB flatbuffer limit, before any conversion work
    check_target(path, overwrite)
    mode = resolve_int8_mode(model, quantize, int8_mode)
    with atomic_path(path, overwrite) as tmp:
        write_flatbuffer(model, serving_endpoints, {"batch_size": batch_size, "sequence_length": length}, tmp,
                         quantize, mode)
        batch = parity_batch(model, batch_size, length)
        with plain_attention(model):
            reference = {name: np.asarray(value) for name, value in serving(batch, training=False).items()}
        report = ParityReport(str(path), quantize or "float32", tmp.stat().st_size, (batch_size, length),
                              compare(reference, run_tflite(tmp, batch)), mode)
    return report
