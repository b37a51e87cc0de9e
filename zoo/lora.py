"""LoRA (Hu et al., 2021) on any zoo model, and a quantized frozen base, through Keras' own
`Dense.enable_lora` and `Model.quantize`: the adapter math is Keras'; this module names the
projections as Hugging Face PEFT does, freezes what LoRA leaves frozen, merges, and checks.

    model = zoo.get("dec-1b", weights="TinyLlama-1.1B")
    zoo.lora.quantize_base(model, "int4")       # optional: an int4 frozen base (QLoRA-like)
    zoo.lora.enable_lora(model, rank=16, alpha=32, targets="all-linear")
    model.compile(...); model.fit(...)
    zoo.hub.save_adapter(model, "adapter/")     # what PEFT's PeftModel.from_pretrained reads

It sits above the models, below zoo.hub (whose PEFT files it feeds): targets are Hugging Face module
names, which zoo.models.hf_projections gives from the table hub's weight maps write too (zoo.shapes).
What Keras does underneath, measured: docs/lora.md.
"""

import contextlib
import gc
import re

import keras
import ml_dtypes
from keras import ops

from zoo import checks
from zoo.checks import QUANTIZATION_MODES, QUANTIZE_SLICE
from zoo.models import classifier_head, hf_projections, quantizable
from zoo.ops.scratch_graphs import release_scratch_graphs
from zoo.shapes import LORA_DEFAULT_TARGETS, variables

ALL_LINEAR = "all-linear"
# Weight-map groups of a task head that is new and trained in full beside the adapters
# (PEFT's modules_to_save for SEQ_CLS: the classifier).
HEAD_GROUPS = ("classifier",)


def _family(model):
    return getattr(model, "backbone", model).spec.family


def _head_variables(model) -> set:
    head = classifier_head(model)
    return set() if head is None else {id(v) for v in head.trainable_variables}


def projections(model) -> dict:
    """Hugging Face module name -> Keras `Dense`, for every projection LoRA may target (a new
    classifier head excluded: it trains in full). Names are those of the task model's Hugging
    Face checkpoint ("model.layers.0.self_attn.q_proj", "encoder.layer.0.attention.self.query").

    Example:
    >>> list(projections(zoo.get("dec-base", num_layers=1)))[:2]
    ['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj']
    """
    checks.lora_family(_family(model))
    return hf_projections(model)


def adapters(model) -> dict:
    """Hugging Face module name -> `Dense`, for every projection that has LoRA now."""
    return {layer._zoo_lora_name: layer for layer in model._flatten_layers()
            if getattr(layer, "lora_enabled", False) and hasattr(layer, "_zoo_lora_name")}


def has_lora(model) -> bool:
    return any(getattr(layer, "lora_enabled", False) for layer in model._flatten_layers())


def match(names, targets, family) -> list:
    """The names PEFT's rule picks for `targets`, in model order: a target in a list matches a name
    that is it or ends with "." + it ("q_proj", "self_attn.q_proj"); "all-linear" takes every
    projection; any other string is a regular expression the whole name must match; None is
    PEFT's default for the family (`zoo.shapes.LORA_DEFAULT_TARGETS`). On BERT "dense" also takes
    the pooler, as in PEFT.

    Raises:
        ValueError: a target that matches nothing, listing the known ones.
    """
    names = list(names)
    if targets is None:
        targets = LORA_DEFAULT_TARGETS[family]
    if targets == ALL_LINEAR:
        return names
    if isinstance(targets, str):
        chosen = [n for n in names if re.fullmatch(targets, n)]
        if not chosen:
            raise ValueError(f"LoRA target pattern {targets!r} matches none of this {family} model's projections "
                             f"(e.g. {names[0]!r}); {_known(names)}")
        return chosen
    targets = list(targets)
    for target in targets:
        if not isinstance(target, str) or not any(n == target or n.endswith("." + target) for n in names):
            raise ValueError(f"Unknown LoRA target {target!r} for this {family} model; {_known(names)}")
    return [n for n in names if any(n == t or n.endswith("." + t) for t in targets)]


def _known(names) -> str:
    short = list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))
    return (f"known: {', '.join(short)} (or a dotted suffix of a module name such as "
            f"{'.'.join(names[0].split('.')[-2:])!r}, a regular expression, or {ALL_LINEAR!r}).")


def check_targets(spec, task, targets):
    """Refuse, before anything is built, a list of targets whose last parts name no projection of
    `spec`'s model (the full names are checked again when the adapters are added), and a family
    LoRA does not support."""
    checks.lora_family(spec.family)
    if targets is None or isinstance(targets, str):
        return
    names = list(dict.fromkeys(tag for tag, shape in variables(spec, task) if len(shape) == 2 and tag not in
                               (None, "embedding", "lm_head", "classifier")))
    for target in targets:
        if not isinstance(target, str) or target.rsplit(".", 1)[-1] not in names:
            raise ValueError(f"Unknown LoRA target {target!r} for a {spec.family} model; known: {', '.join(names)} "
                             f"(or a dotted suffix of a Hugging Face module name, or {ALL_LINEAR!r}).")


def enable_lora(model, rank=16, alpha=32, targets=None, dropout=0.0) -> list:
    """Add LoRA adapters (Keras' `Dense.enable_lora`) to a zoo model's projections and freeze
    everything else but a new task head, so that `fit` trains only the adapters.

    Args:
        model: a zoo model, float or quantized (`quantize_base`), without LoRA.
        rank: the adapters' rank r.
        alpha: LoRA alpha; the update is scaled by alpha / rank, as in PEFT.
        targets: Hugging Face module names or suffixes ("q_proj", "self_attn.o_proj", "dense"),
            "all-linear", or a regular expression string; None: PEFT's default for the family
            (the rule: `match`).
        dropout: must be 0.0. Keras' LoRA has no dropout on the adapter's input (PEFT's
            lora_dropout); adding it would mean a second adapter matmul outside Keras, seeded
            from the block's dropout seed so that recomputation redraws the same mask.

    Returns:
        The Hugging Face names of the projections that got adapters.

    Raises:
        ValueError: rank <= 0, alpha <= 0, dropout != 0, an unknown target (the known ones are
            listed), a model that already has LoRA, or a family LoRA does not support
            (`zoo.checks.lora_family`: ModernBERT's fused projections).

    Example:
    >>> enable_lora(zoo.get("dec-base", num_layers=2), rank=8, alpha=16)
    ['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.v_proj', ...]
    """
    checks.lora(rank, alpha)
    if dropout:
        raise ValueError(
            f"LoRA dropout={dropout!r} is not supported: Keras' Dense LoRA has no dropout on the adapter's input, "
            "and adding one would compute the adapter outside Keras. Use dropout=0.0 (PEFT's default), or the "
            "model's own dropout (the spec's `dropout`).")
    names = match(_names_without_lora(model), targets, _family(model))
    return add_adapters(model, {name: (rank, alpha) for name in names})


def _names_without_lora(model):
    if has_lora(model):
        present = list(adapters(model))
        raise ValueError(f"This model already has LoRA ({len(present)} adapters, e.g. {present[:1]}); Keras adds "
                         "adapters once per layer. Keep training them, or call merge_lora() to fold them into the "
                         "kernels before enabling new ones.")
    return projections(model)


def add_adapters(model, plan: dict) -> list:
    """Enable LoRA on the named projections, each with its own (rank, keras_alpha), with A drawn
    as PEFT draws it and B zero; freeze every other variable but a new task head.
    `zoo.hub.load_adapter` calls it with an adapter file's ranks before assigning its tensors."""
    modules = _names_without_lora(model)
    if getattr(model, "fused_update", None):
        checks.lora_fused()
    missing = [name for name in plan if name not in modules]
    if missing:
        raise ValueError(f"No projection {missing[0]!r} in this model; {_known(list(modules))}")
    head = _head_variables(model)
    frozen = [v for v in model.trainable_variables if id(v) not in head]
    for name, (rank, alpha) in plan.items():
        layer = modules[name]
        # PEFT's A init, kaiming_uniform_(a=sqrt(5)) on [r, in], is U(+-1/sqrt(in)); Keras' A is [in, r].
        # A fresh initializer per layer: an unseeded Keras initializer repeats its values.
        layer.enable_lora(rank, lora_alpha=alpha, b_initializer="zeros",
                          a_initializer=keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"))
        layer._zoo_lora_name = name
    _set_trainable(frozen, False)
    # Plain attributes (not tracked by Keras): what merge_lora makes trainable again, and the
    # projections save_adapter names its targets among.
    model.__dict__["_zoo_lora_frozen"] = frozen
    model.__dict__["_zoo_lora_projections"] = list(modules)
    model._drop_compiled_functions()
    return list(plan)


@contextlib.contextmanager
def adapters_off(model):
    """The model without its adapters, for what is called (or traced into a graph) inside: PEFT's
    `disable_adapter()`, the reference model of TRL's DPOTrainer with PEFT. Keras' Dense reads
    `lora_enabled` when called (its `kernel`, its quantized matmuls), so a graph traced here keeps
    only the base; the adapters' variables stay as they are.

    Raises:
        ValueError: a model without LoRA (there is no reference to switch to).

    Example:
    >>> with zoo.lora.adapters_off(model):
    ...     reference = model(x)   # the base model's outputs
    """
    layers = [layer for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False)]
    if not layers:
        raise ValueError("This model has no LoRA adapters to switch off (enable_lora() adds them), so it has no "
                         "base model to serve as the reference.")
    for layer in layers:
        layer.lora_enabled = False
    try:
        yield layers
    finally:
        for layer in layers:
            layer.lora_enabled = True


def merge_lora(model) -> list:
    """Fold every adapter into its kernel, W + (alpha / r)·A·B, and remove the adapters, so that
    the model is a plain one again (export, `zoo.hub.save`); the variables enable_lora froze are
    trainable again.

    A float kernel is merged in its variable dtype (Keras' own merge, `Dense.kernel`, rounds to
    the compute dtype: bfloat16 under mixed_bfloat16). A quantized kernel is dequantized, merged
    and quantized again by Keras (`_get_kernel_with_merged_lora`, what its own `save` does), which
    rounds once more: to deploy a QLoRA adapter, merge it into the float base instead
    (`merge_lora(zoo.hub.load(base, adapter=folder))`).

    Returns:
        The Hugging Face names of the merged projections.

    Raises:
        ValueError: a model without LoRA.
    """
    layers = [layer for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False)]
    if not layers:
        raise ValueError("This model has no LoRA adapters to merge (enable_lora() adds them).")
    names = []
    with collect_once():
        for layer in layers:
            names.append(_merge(layer))
    _set_trainable(model.__dict__.pop("_zoo_lora_frozen", []), True)
    model.__dict__.pop("_zoo_lora_projections", None)
    model._drop_compiled_functions()
    return names


def _set_trainable(variables, trainable):
    """Set Keras' flag and the TensorFlow variable's under it. Keras' `trainable = False` after a
    variable is made leaves the tf.Variable trainable, so GradientTapes still watch it, and
    `tf.recompute_grad` then computes a kernel-sized gradient for every frozen kernel of every
    recomputed block and holds them to the end of the backward: about a float32 copy of the
    weights (dec-base LoRA at 1 x 64: +0.49 GiB on a 0.25 GiB model)."""
    for variable in variables:
        variable.trainable = trainable
        handle = variable._value  # `value` may be an autocast copy
        for component in getattr(handle, "values", (handle,)):  # a distributed variable's copies
            component._trainable = trainable


def _merge(layer):
    """Fold one layer's adapter into its kernel and remove it; returns its name."""
    if layer.quantization_mode in QUANTIZATION_MODES:
        kernel, scale, zero = layer._get_kernel_with_merged_lora()
        layer._kernel.assign(kernel)
        layer.kernel_scale.assign(scale)
        if zero is not None:
            layer.kernel_zero.assign(zero)
    else:
        delta = (layer.lora_alpha / layer.lora_rank) * ops.matmul(layer.lora_kernel_a, layer.lora_kernel_b)
        layer._kernel.assign(ops.cast(ops.add(ops.cast(layer._kernel, "float32"), delta), layer._kernel.dtype))
    name = getattr(layer, "_zoo_lora_name", layer.path)
    _remove_adapter(layer)
    return name


@contextlib.contextmanager
def collect_once():
    """Keras' `Layer.__delattr__` runs `gc.collect()` after every variable it deletes (Dense.quantize
    deletes each float kernel, merge_lora two factors per layer): with TensorFlow's heap that is
    0.1-0.5 s a call, minutes for a 1B model's 154 projections. Collect once, at the end, instead."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def _remove_adapter(layer):
    layer._tracker.unlock()
    del layer.lora_kernel_a  # Layer.__delattr__ untracks the variable
    del layer.lora_kernel_b
    layer._tracker.lock()
    layer.lora_enabled, layer.lora_rank, layer.lora_alpha = False, None, None
    layer.__dict__.pop("_zoo_lora_name", None)


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
    """Quantize the frozen base through Keras' `Model.quantize`: every `Dense` and embedding
    (the token embedding and so a tied LM head, an untied head, BERT's segment embedding),
    never a new task head, which trains in full. Call it before `enable_lora`.

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
    config = quantization_config(mode)
    if has_lora(model):
        raise ValueError("Quantize the base before enable_lora(): the adapters train on top of the quantized "
                         "kernels (merge_lora() first to quantize a merged model).")
    layers = quantizable(model)
    modes = {layer.quantization_mode for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)}
    if modes == {mode} and all(layer.quantization_mode == mode for layer in layers):
        return [layer.path for layer in layers]  # built quantized and loaded (zoo.hub.load(..., quantize=mode))
    if modes:
        raise ValueError(f"This model is already quantized ({', '.join(sorted(modes))}).")
    chosen = {id(layer) for layer in layers}
    release_scratch_graphs()  # else the replaced float kernels stay alive (zoo.ops.scratch_graphs)
    with collect_once():
        model.quantize(config=config, filters=lambda layer: id(layer) in chosen, type_check=False)
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
