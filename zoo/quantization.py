"""A frozen base in int8 or int4, through Keras' own `Model.quantize`: quantize a built float model
(`quantize_base`), or fill a model built quantized from float tensors as they are read
(`quantize_into`, what zoo.hub.load(..., quantize=) streams a checkpoint through). LoRA's adapters
(zoo.lora) then train on top of it, as QLoRA does:

    model = zoo.get("dec-1b", weights="TinyLlama-1.1B")
    zoo.quantization.quantize_base(model, "int4")   # before zoo.lora.enable_lora
    zoo.lora.enable_lora(model, rank=16, alpha=32, targets="all-linear")

Which layers a base quantizes (`zoo.models.quantizable`) and the dtype policies of a model built
quantized (`zoo.models.quantized_policies`) sit with the models; the planner's side is
zoo.memory.lora. What Keras does underneath, measured: docs/lora.md.
"""

import contextlib
import gc

import keras
import ml_dtypes
import tensorflow as tf

from zoo.checks import QUANTIZATION_MODES, QUANTIZE_SLICE, layer_mode
from zoo.models import quantizable
from zoo.ops.scratch_graphs import release_scratch_graphs


@contextlib.contextmanager
def collect_once():
    """Keras' `Layer.__delattr__` runs `gc.collect()` after every variable it deletes (Dense.quantize
    deletes each float kernel, zoo.lora.merge_lora two factors per layer): with TensorFlow's heap that is
    0.1-0.5 s a call, minutes for a 1B model's 154 projections. Collect once, at the end, instead."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def quantization_config(mode):
    """Keras' weight-only config for `mode`: weights stored in int8 / int4 (blocks of 128 along
    the input: Keras' int4 default), matmuls in the compute dtype, as QLoRA computes. Keras'
    default int8 also quantizes each layer's input: in the LM head (ReversibleEmbedding's
    reverse) that has no straight-through gradient, so the gradient to the hidden states flows
    only through the input's scale (adapter gradients at cosine 0.006 to the float base's), and
    its int8 x int8 matmul ran 5x slower on this CPU (docs/lora.md)."""
    if mode == "int8":
        return keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    if mode == "int4":
        return keras.quantizers.Int4QuantizationConfig(block_size=128)
    raise ValueError(f"Unknown quantization mode {mode!r}; known: {', '.join(QUANTIZATION_MODES)}.")


def quantize_base(model, mode) -> list:
    """Quantize the frozen base through Keras' `Model.quantize`: every `Dense` in `mode`, and every
    embedding (the token embedding and so a tied LM head, an untied head, BERT's segment embedding)
    in int8 with a scale per row whatever `mode` (zoo.checks.TABLE_MODE), never a new task head,
    which trains in full. Call it before `zoo.lora.enable_lora`.

    keras-hub's ReversibleEmbedding is a trivial subclass of Keras', whose `quantize` refuses
    subclasses unless `type_check=False`; the filter lets only Dense and Embedding layers through.
    Position embeddings (keras-hub's PositionEmbedding) and norms stay float.

    Args:
        model: a zoo model without LoRA, not yet quantized (or quantized in `mode` already, as
            `zoo.hub.load(..., quantize=mode)` builds it: then nothing changes).
        mode: "int8" or "int4".

    Returns:
        The paths of the quantized layers.
    """
    quantization_config(mode)  # a known mode
    layers = quantizable(model)
    if any(getattr(layer, "lora_enabled", False) for layer in layers):
        raise ValueError("Quantize the base before enable_lora(): the adapters train on top of the quantized "
                         "kernels (merge_lora() first to quantize a merged model).")
    chosen = {id(layer): layer_mode(mode, isinstance(layer, keras.layers.Embedding)) for layer in layers}
    modes = {layer.quantization_mode for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)}
    if modes and all(layer.quantization_mode == chosen[id(layer)] for layer in layers):
        return [layer.path for layer in layers]  # built quantized and loaded (zoo.hub.load(..., quantize=mode))
    if modes:
        raise ValueError(f"This model is already quantized ({', '.join(sorted(modes))}).")
    release_scratch_graphs()  # else the replaced float kernels stay alive (zoo.ops.scratch_graphs)
    with collect_once():
        for each in sorted(set(chosen.values())):
            model.quantize(config=quantization_config(each), type_check=False,
                           filters=lambda layer, each=each: chosen.get(id(layer)) == each)
    model._drop_compiled_functions()
    return [layer.path for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)]


# The float variables of a layer Keras' quantize replaces, by the slot a checkpoint tensor fills.
SLOTS = ("kernel", "embeddings", "reverse_embeddings")


def quantize_into(layer, tensors: dict, mode):
    """Fill a layer built quantized (`zoo.models.build(..., quantize=mode)`) from its float tensors, by
    Keras' own quantizer: a float twin of the layer (its config, in the layer's source policy) takes the
    tensors, `twin.quantize(mode)` runs exactly as `quantize_base` runs it on a float model, and the
    twin's integer variables, scales and quantizers are copied into the layer. A layer above
    `QUANTIZE_SLICE` floats goes through twins of a slice of its tokens (embeddings: rows of the table,
    columns of an untied head's reverse) or outputs (a kernel's columns, an even number: int4 packs
    pairs of them), which Keras quantizes each on its own (per-row / per-column scales, blocks along
    the other axis), so the result is bitwise what quantizing the float model gives.

    Args:
        layer: a quantized `Dense` or (Reversible)Embedding.
        tensors: slot -> the float tensor in Keras' layout ("kernel" [in, out]; "embeddings" [vocab, width];
            "reverse_embeddings" [width, vocab], an untied head), in any float dtype; or a function
            `(begin, end) -> that tensor's slice` (tokens or outputs begin:end, Keras' layout), so that
            only a slice is ever read (zoo.hub.weights reads the checkpoint's rows begin:end).
        mode: "int8" or "int4".
    """
    policy = layer.dtype_policy
    if policy.quantization_mode != mode:
        raise ValueError(f"Layer {layer.path} is {policy.name}, not built for {mode}.")
    embedding = isinstance(layer, keras.layers.Embedding)
    size, other = (layer.input_dim, layer.output_dim) if embedding else (layer.units, layer._kernel.shape[0])
    step = max(2, QUANTIZE_SLICE // (other * len(tensors)) // 2 * 2)
    mine = {v.name: v for v in layer.weights}
    offsets = dict.fromkeys(mine, 0)
    reads = {slot: tensor if callable(tensor) else _slicer(slot, tensor) for slot, tensor in tensors.items()}
    for begin in range(0, size, step):
        end = min(begin + step, size)
        twin = _quantized_twin(layer, mode, end - begin, {slot: read(begin, end) for slot, read in reads.items()})
        for variable in twin.weights:
            if variable.name != "bias":  # a float bias is loaded as is, beside the kernel
                offsets[variable.name] = _assign_part(mine[variable.name], variable, offsets[variable.name])
    for variable in mine.values():
        read_in_place(variable)
    for name, value in vars(twin).items():
        if name == "quantization_config" or name.endswith("quantizer"):
            object.__setattr__(layer, name, value)


def _slicer(slot, array):
    """(begin, end) -> tokens / outputs begin:end of an array in Keras' layout (the table's rows, else columns)."""
    return (lambda begin, end: array[begin:end]) if slot == "embeddings" else (lambda begin, end: array[:, begin:end])


def _quantized_twin(layer, mode, size, tensors):
    """A float copy of `layer` (`size` tokens or outputs) holding `tensors`, quantized by Keras."""
    policy = layer.dtype_policy
    embedding = isinstance(layer, keras.layers.Embedding)
    config = {**layer.get_config(), "dtype": policy._source_name, "input_dim" if embedding else "units": size}
    config.pop("quantization_config", None)
    for key in ("kernel_initializer", "embeddings_initializer"):
        if key in config:
            config[key] = "zeros"  # the tensors overwrite them: no random draw of a float copy
    twin = type(layer).from_config(config)
    twin.build(None if embedding else (layer._kernel.shape[0],))
    for slot, array in tensors.items():  # cast in numpy: no TensorFlow copy beside the variable
        variable = getattr(twin, slot)
        variable.assign(array.astype(ml_dtypes.bfloat16 if variable.dtype == "bfloat16" else variable.dtype))
    twin.quantize(mode, type_check=False, config=quantization_config(mode))
    if twin.dtype_policy.name != policy.name:
        raise ValueError(f"Layer {layer.path} was built {policy.name}, but Keras quantizes it to "
                         f"{twin.dtype_policy.name}.")
    return twin


def read_in_place(variable):
    """Take `variable` out of TensorFlow's copy-on-read mode, which a write of a slice (ResourceStridedSliceAssign,
    `_assign_part`) turns on for good: in it every read copies the variable whole, so a training step copied the
    int8 head (376 MiB at llama3.2-3b) on each read and held a copy of each block's int4 kernels from its forward to
    its backward under shared blocks (docs/memory.md). Nothing writes slices of a loaded model after loading."""
    tf.raw_ops.DisableCopyOnRead(resource=variable._value.handle)  # the tf.Variable under Keras'


def _assign_part(target, part, offset) -> int:
    """Write `part` into `target` where their shapes differ (the sliced axis) from `offset`; a variable the
    slices share (int4's input order g_idx) is written whole. Returns the next offset on that axis."""
    axes = [i for i, (a, b) in enumerate(zip(target.shape, part.shape)) if a != b]
    if not axes:
        target.assign(part)
        return offset
    axis, width = axes[0], part.shape[axes[0]]
    index = tuple(slice(offset, offset + width) if i == axis else slice(None) for i in range(len(target.shape)))
    target._value[index].assign(part.value)  # the tf.Variable under Keras': a slice written in place
    return offset + width
