"""int8 .tflite files of models too large for TensorFlow's converter to hold: it converts the
graph with stand-in weights, and the real weights, quantized, are written into its file after.

Why: the converter holds ~8 float32 copies of the weights it converts (dec-1b: ~35 GB; see
docs/design-notes.md, "Generation in exports"). A stand-in is `tf.fill(shape, value)` read in
place of a variable (through Keras' own `StatelessScope`): nothing of its size is saved, loaded
or frozen, and MLIR keeps a constant of equal elements as one element, whatever its shape.

Every variable gets a stand-in of its own value, so every tensor the converter made of one says
which variable it holds: a float tensor by its value, an int8 one by its quantization scale
(value / 127). The converter folds a norm's scale into the matrix of the FULLY_CONNECTED op
after it (Gemma's 1 + scale too); then the tensor holds the product of two stand-ins, which
says both (the values are spaced so that every such product is distinct; `StandIns` checks it). The converter decides
everything else (the ops, each tensor's layout, what is quantized, per channel or per tensor);
this module writes values only, with the converter's arithmetic (the fold's float32 product,
then symmetric narrow-range int8, round half away from zero). Anything it cannot place is
refused, naming the fix. tests/zoo/test_export_litert.py checks the result equals the
converter's own int8 file operator for operator, norms folded, int8 bytes and scales included.
"""

from __future__ import annotations

import flatbuffers
import keras
import numpy as np
import tensorflow as tf
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

MATRIX_STEP = 2.0**-21  # matrix k's stand-in is 1 + (k + 1) * MATRIX_STEP (4 float32 steps apart)
VECTOR_STEP = 2.0**-7  # vector j's is 1 + (j + 1) * VECTOR_STEP: j's products with matrices stay below j + 1's
QMAX = 127  # the converter's weights are int8 in [-127, 127]
MIN_RANGE = 5e-7  # the converter widens a channel's range to at least +-MIN_RANGE (an all-zero channel)
BLOCK_ELEMENTS = 2**22  # quantize() divides this many weights at a time
ALIGNMENT = 16  # the converter's own alignment of buffer data
_FILE_IDENTIFIER = b"TFL3"
_FIX = "Use int8_mode='dynamic_range' (the converter quantizes the real weights; more memory)."


class StandIns:
    """A stand-in value for every float32 variable of a model, and the tables that read them back:
    a float32 value, or an int8 scale, -> (matrix or vector, the vector folded into it or None,
    and 1 where the fold was of 1 + the vector)."""

    def __init__(self, model):
        self.variables = [v for v in model.weights if v.dtype == "float32"]
        matrices = [i for i, v in enumerate(self.variables) if len(v.shape) >= 2]
        vectors = [i for i, v in enumerate(self.variables) if len(v.shape) < 2]
        self.values = np.zeros(len(self.variables), np.float32)
        self.values[matrices] = 1 + (np.arange(len(matrices)) + 1) * MATRIX_STEP
        self.values[vectors] = 1 + (np.arange(len(vectors)) + 1) * VECTOR_STEP
        placed = [(i, None, 0) for i in range(len(self.variables))] + [(v, None, 1) for v in vectors]
        placed += [(m, v, offset) for m in matrices for v in vectors for offset in (0, 1)
                   if self.variables[v].shape and self.variables[v].shape[0] in self.variables[m].shape]
        self.by_value, self.by_scale = {}, {}
        for m, v, offset in placed:
            value = (np.float32(offset) + self.values[m] if v is None
                     else self.values[m] * (np.float32(offset) + self.values[v]))  # float32, as the converter folds
            scale = np.float32(np.float64(value) / QMAX)
            if value in self.by_value or scale in self.by_scale:
                raise ValueError(f"{len(self.variables)} variables are too many for distinct stand-ins. " + _FIX)
            self.by_value[value], self.by_scale[scale] = (m, v, offset), (m, v, offset)

    def endpoints(self, endpoints: dict) -> dict:
        """The endpoints (name -> (fn, specs)) reading the stand-ins instead of the variables."""

        def wrap(fn):
            def with_stand_ins(inputs):
                mapping = [(v, tf.fill(v.shape, value)) for v, value in zip(self.variables, self.values)]
                with keras.StatelessScope(state_mapping=mapping):
                    return fn(inputs)

            return with_stand_ins

        return {name: (wrap(fn), specs) for name, (fn, specs) in endpoints.items()}

    def which(self, model, tensor):
        """(variable, folded vector or None, offset) of a tensor made from stand-ins, else None."""
        quantization = tensor.quantization
        if tensor.type == schema.TensorType.INT8 and _channels(tensor):
            scale = np.asarray(quantization.scale, np.float32)
            if not np.all(scale == scale[0]):
                return None
            if _has_data(model, tensor) and not np.all(model.buffers[tensor.buffer].data.view(np.int8) == QMAX):
                return None
            return self.by_scale.get(scale[0])
        if tensor.type == schema.TensorType.FLOAT32 and _has_data(model, tensor):
            data = model.buffers[tensor.buffer].data.view(np.float32)
            return self.by_value.get(data[0]) if np.all(data == data[0]) else None
        return None

    def real(self, placed, tensor, op):
        """The real float32 weights of a tensor made from stand-ins, in its layout: a matrix as it is
        or transposed (a Dense kernel [in, out] as a FULLY_CONNECTED weight [out, in]), times a
        vector (or 1 + the vector: Gemma's norm scale) folded into a FULLY_CONNECTED weight's input
        axis."""
        m, v, offset = placed
        weights = _layout(self.variables[m].numpy(), tensor, self.variables[m].path, op)
        if v is None:
            return weights + np.float32(offset) if offset else weights
        vector = self.variables[v].numpy()
        if op != schema.BuiltinOperator.FULLY_CONNECTED or weights.ndim != 2 or weights.shape[1] != len(vector):
            raise ValueError(f"The converter folded {self.variables[v].path} into {self.variables[m].path} in a way "
                             "int8_mode='stand_in' cannot follow. " + _FIX)
        return weights * (np.float32(offset) + vector)[None, :]


def write_weights(flatbuffer: bytes, stand_ins: StandIns) -> bytes:
    """The converter's file of stand-ins with the real values in their place. The converter may have
    merged equal stand-in buffers, so every (variable, fold, layout, quantization) gets a new one. A
    tensor computed from an int8 weight (a lookup's int8 rows) carries that weight's scale: it gets
    the real one. Every variable must be found: one the converter combined in a way this module does
    not follow is refused."""
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))
    written, scales, computed = {}, {}, []  # written: key -> (buffer index, scale)
    for subgraph in model.subgraphs:
        weight_inputs = _weight_inputs(model, subgraph)
        for index, tensor in enumerate(subgraph.tensors):
            placed = stand_ins.which(model, tensor)
            if placed is None:
                continue
            if not _has_data(model, tensor):
                computed.append((placed, tensor))
                continue
            key = (placed, tuple(tensor.shape), tensor.type, _channels(tensor))
            if key not in written:  # one float copy of one variable at a time
                weights = stand_ins.real(placed, tensor, weight_inputs.get(index))
                data, scale = (quantize(weights, tensor.quantization.quantizedDimension, _channels(tensor) > 1)
                               if tensor.type == schema.TensorType.INT8 else (weights.astype(np.float32), None))
                model.buffers.append(_AlignedBuffer(data))
                written[key] = len(model.buffers) - 1, scale
            tensor.buffer, scale = written[key]
            if scale is not None:
                tensor.quantization.scale = scales[placed, _channels(tensor)] = scale
    for placed, tensor in computed:
        if (placed, _channels(tensor)) not in scales:
            raise ValueError(f"The converter derived {tensor.name.decode()} from "
                             f"{stand_ins.variables[placed[0]].path} in a way int8_mode='stand_in' cannot follow. "
                             + _FIX)
        tensor.quantization.scale = scales[placed, _channels(tensor)]
    found = {i for (m, v, _), *_ in written for i in (m, v) if i is not None}
    missing = [v.path for i, v in enumerate(stand_ins.variables) if i not in found]
    if missing:
        raise ValueError(f"{missing[0]} (and {len(missing) - 1} more) is not in the converted file as "
                         "int8_mode='stand_in' can follow: the converter combined it with other constants. " + _FIX)
    used = {t.buffer for subgraph in model.subgraphs for t in subgraph.tensors}
    for index, buffer in enumerate(model.buffers):
        if index not in used and index:  # buffer 0 is the format's empty sentinel
            buffer.data = None  # a stand-in no tensor reads any more
    return _serialize(model, sum(len(b.data) for b in model.buffers if b.data is not None))


def quantize(weights: np.ndarray, axis: int, per_channel: bool):
    """int8 values and float32 scales as the converter's dynamic-range quantization writes them:
    the scale in double precision divides, and only the stored copy is float32 (dividing by the
    float32 scale differs from the converter's file in a few elements per million). Rows are
    divided a block at a time: double-precision temporaries of a whole embedding are gigabytes."""
    weights = np.asarray(weights, np.float32)
    others = tuple(i for i in range(weights.ndim) if i != axis) if per_channel else None
    amax = np.maximum(np.max(weights, axis=others, keepdims=True), -np.min(weights, axis=others, keepdims=True))
    scale = np.maximum(amax.astype(np.float64), MIN_RANGE) / QMAX
    values = np.empty(weights.shape, np.int8)
    rows = max(1, BLOCK_ELEMENTS // max(1, weights[0].size))
    for start in range(0, len(weights), rows):
        scaled = weights[start:start + rows] / (scale[start:start + rows] if len(scale) > 1 else scale)
        rounded = np.trunc(scaled + np.copysign(0.5, scaled))  # half away from zero, as std::round
        values[start:start + rows] = np.clip(rounded, -QMAX, QMAX)
    return values, scale.astype(np.float32).reshape(-1)


def _has_data(model, tensor) -> bool:
    data = model.buffers[tensor.buffer].data
    return data is not None and len(data) > 0


def _channels(tensor) -> int:
    """How many scales the tensor's quantization has (0: not quantized)."""
    quantization = tensor.quantization
    return 0 if quantization is None or quantization.scale is None else len(quantization.scale)


def _weight_inputs(model, subgraph) -> dict:
    """tensor index -> the builtin op that reads it as a weight (input 1)."""
    found = {}
    for op in subgraph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if len(op.inputs) > 1 and op.inputs[1] >= 0:
            found[op.inputs[1]] = max(code.builtinCode, code.deprecatedBuiltinCode)
    return found


def _layout(weights, tensor, path, op):
    """`weights` arranged as the converter arranged the stand-in: as they are, transposed (a Dense
    kernel [in, out] as a FULLY_CONNECTED weight [out, in]), or a vector given leading ones."""
    shape = tuple(int(n) for n in tensor.shape)
    same, swapped = shape == weights.shape, weights.ndim == 2 and shape == weights.shape[::-1]
    if same and swapped:  # square: the op says
        swapped = op == schema.BuiltinOperator.FULLY_CONNECTED and path.endswith("kernel")
        same = not swapped
    if same:
        return weights
    if not swapped and int(np.prod(shape)) == weights.size and weights.ndim == 1:  # a vector as [1, n]
        return weights.reshape(shape)
    if swapped:
        return np.ascontiguousarray(weights.T)
    raise ValueError(f"The converter wrote {path} {weights.shape} as a tensor of shape {shape}, which "
                     "int8_mode='stand_in' cannot follow. " + _FIX)


class _AlignedBuffer(schema.BufferT):
    """A buffer packed at the converter's 16-byte alignment (flatbuffers' numpy vectors align to
    the element size only)."""

    def __init__(self, data: np.ndarray):
        super().__init__()
        self.data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def Pack(self, builder):  # noqa: N802 (flatbuffers' name)
        payload = self.data.tobytes()
        builder.StartVector(1, len(payload), ALIGNMENT)
        builder.head -= len(payload)
        builder.Bytes[builder.head:builder.head + len(payload)] = payload
        data = builder.EndVector()
        schema.BufferStart(builder)
        schema.BufferAddData(builder, data)
        return schema.BufferEnd(builder)


def _serialize(model, data_bytes: int) -> bytes:
    """flatbuffer_utils.convert_object_to_bytearray with the builder sized once (it would grow by
    doubling, copying the weights each time)."""
    builder = flatbuffers.Builder(data_bytes + 2**24)
    builder.Finish(model.Pack(builder), file_identifier=_FILE_IDENTIFIER)
    return bytes(builder.Output())
