"""LoRA (Hu et al., 2021) on any zoo model, float or with a quantized frozen base (zoo.quantization),
through Keras' own `Dense.enable_lora`: the adapter math is Keras'; this module names the projections
as Hugging Face PEFT does, freezes what LoRA leaves frozen, switches the adapters off, merges, and checks.

    model = zoo.get("dec-1b", weights="TinyLlama-1.1B")
    zoo.quantization.quantize_base(model, "int4")   # optional: an int4 frozen base (QLoRA-like)
    zoo.lora.enable_lora(model, rank=16, alpha=32, targets="all-linear")
    model.compile(...); model.fit(...)
    zoo.hub.save_adapter(model, "adapter/")     # what PEFT's PeftModel.from_pretrained reads

It sits above the models and zoo.quantization, below zoo.hub (whose PEFT files it feeds): targets are
Hugging Face module names, which zoo.models.hf_projections gives from the table hub's weight maps write
too (zoo.shapes). What Keras does underneath, measured: docs/lora.md.
"""

import contextlib
import re

import keras
from keras import ops

from zoo import checks
from zoo.checks import QUANTIZATION_MODES
from zoo.models import classifier_head, hf_projections
from zoo.quantization import collect_once
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
        model: a zoo model, float or quantized (`zoo.quantization.quantize_base`), without LoRA.
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


def _remove_adapter(layer):
    layer._tracker.unlock()
    del layer.lora_kernel_a  # Layer.__delattr__ untracks the variable
    del layer.lora_kernel_b
    layer._tracker.lock()
    layer.lora_enabled, layer.lora_rank, layer.lora_alpha = False, None, None
    layer.__dict__.pop("_zoo_lora_name", None)
