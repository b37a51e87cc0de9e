"""Model classes by family and task, and `build`, the one place a spec becomes a model."""

import functools
import random
import re

import keras

from zoo.checks import layer_mode
from zoo.models.decoder import DecoderBackbone, DecoderCausalLM
from zoo.models.encoder import EncoderBackbone, EncoderClassifier, EncoderMaskedLM
from zoo.ops.recompute import policy_name
from zoo.registry import DECODERS, FAMILIES, PRECISIONS, ModelSpec
from zoo.shapes import HF_BASE_PREFIX, HF_BLOCKS, HF_HEADS, HF_MODULES

# family -> task -> class. The task names are the ones recipes, export and the Hub format use.
_ENCODER_TASKS = {cls.task: cls for cls in (EncoderBackbone, EncoderMaskedLM, EncoderClassifier)}
_DECODER_TASKS = {cls.task: cls for cls in (DecoderBackbone, DecoderCausalLM)}
TASKS = {family: _DECODER_TASKS if family in DECODERS else _ENCODER_TASKS for family in FAMILIES}


def build(spec: ModelSpec, task=None, checkpointing=None, dtype=None, quantize=None, **task_args) -> keras.Model:
    """Build the Keras model for `spec` and `task`, with random weights.

    Args:
        spec: a `ModelSpec`.
        task: "backbone", "masked_lm" or "classifier" (encoders); "backbone" or
            "causal_lm" (decoders). None: the family's default.
        checkpointing: "none", "full" or "selective" (`True` = "full").
        dtype: a Keras dtype policy name from `PRECISIONS`; None: the global policy.
        quantize: "int8" | "int4": every `quantizable` layer is built quantized (Keras' own integer
            variables, from a dtype policy per layer path), with no float kernel at any moment. Its
            integer variables hold zeros until a checkpoint is quantized into them, layer by layer
            (`zoo.hub.load(..., quantize=)`); for random weights, build float and `zoo.quantization.quantize_base`.
        **task_args: the task's own arguments (`num_classes` for "classifier").

    Returns:
        A built `ZooModel`.

    Example:
    >>> build(zoo.spec("dec-base").replace(num_layers=2), checkpointing="full").task
    'causal_lm'
    """
    policy = policy_name(checkpointing)
    if dtype is not None and dtype not in PRECISIONS:
        raise ValueError(f"Unknown dtype policy {dtype!r}; known: {', '.join(PRECISIONS)}.")
    task = task or spec.default_task
    classes = TASKS[spec.family]
    if task not in classes:
        raise ValueError(f"Unknown task {task!r} for {spec.family} models; known: {', '.join(classes)}.")
    if task_args and task != "classifier":
        raise ValueError(f"{sorted(task_args)} only apply to task='classifier', not {task!r}.")
    dtype = dtype or keras.config.dtype_policy().name
    if quantize is None:
        return classes[task](spec, checkpointing=policy, dtype=dtype, **task_args)
    policies = quantized_policies(spec, task, dtype, quantize, **task_args)
    model = classes[task](spec, checkpointing=policy, dtype=policies, **task_args)
    # Each layer keeps its own policy, not the shared map: what a model quantized after building has.
    for layer in model._flatten_layers(include_self=True):
        if isinstance(layer._dtype_policy, keras.dtype_policies.DTypePolicyMap):
            layer._dtype_policy = policies[layer.path] if layer.path else policies.default_policy
    model._zoo_dtype = dtype
    return model


def quantizable(model) -> list:
    """The layers a frozen base quantizes: every `Dense` and embedding (so a tied LM head; an untied
    head, BERT's segment embedding) but a new classifier head, which trains in full. Position
    embeddings (keras-hub's PositionEmbedding) and norms stay float."""
    head = classifier_head(model)
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, (keras.layers.Dense, keras.layers.Embedding)) and layer is not head]


def quantized_policies(spec, task, dtype, mode, **task_args):
    """A Keras `DTypePolicyMap`: `mode`'s policy ("int4/128_from_float32", what `Model.quantize` with
    zoo.quantization's config gives) at the path of every `quantizable` layer (int8 at a token table's:
    zoo.checks.TABLE_MODE), `dtype` elsewhere. The paths
    are read off a copy of the model shrunk to 2 blocks and tiny widths (block indices generalised):
    layer names do not depend on sizes."""
    tiny = {"num_layers": min(spec.num_layers, 2), "hidden_dim": 8, "num_heads": 2, "intermediate_dim": 8,
            "vocab_size": 16, "num_kv_heads": 1 if spec.num_kv_heads != spec.num_heads else 2,
            "head_dim": None if spec.head_dim == spec.hidden_dim // spec.num_heads else 4,
            "sliding_window": spec.sliding_window and min(spec.sliding_window, 4)}
    policies = keras.dtype_policies.DTypePolicyMap(default_policy=dtype)
    for path, table in _quantizable_paths(spec.replace(**tiny), task, dtype, tuple(sorted(task_args.items()))):
        policies[path] = _quantized_policy(layer_mode(mode, table), dtype)
    return policies


def _quantized_policy(mode, dtype):
    suffix = "/128" if mode == "int4" else ""  # zoo.quantization.quantization_config: int4 blocks of 128
    return keras.dtype_policies.get(f"{mode}{suffix}_from_{dtype}")


@functools.cache
def _quantizable_paths(tiny_spec, task, dtype, task_args) -> tuple:
    """(generalised path, whether it is a token table) of each `quantizable` layer, once per shrunk spec:
    building the tiny copy is ~0.5 s, paid at every quantized build (each QLoRA run, each resumed one)
    before this cache. The copy draws no seed that the real model would see: Keras seeds unseeded
    initializers and dropout from Python's `random`, so a cached call and a first one must leave it
    alike (a resumed QLoRA run restarts with the seeds the first run drew)."""
    state = random.getstate()
    try:
        small = TASKS[tiny_spec.family][task](tiny_spec, dtype=dtype, **dict(task_args))
    finally:
        random.setstate(state)
    return tuple(sorted({(re.sub(r"block_\d+", r"block_\\d+", re.escape(layer.path)),
                          isinstance(layer, keras.layers.Embedding)) for layer in quantizable(small)}))


# Where each projection role's Dense sits in a transformer block (zoo.layers.block): (sublayer, attribute).
_ROLE_LAYERS = {"query": ("attention", "query_dense"), "key": ("attention", "key_dense"),
                "value": ("attention", "value_dense"), "output": ("attention", "output_dense"),
                "gate": ("ffn", "gate"), "up": ("ffn", "up"), "down": ("ffn", "down")}


def block_projections(block, family) -> list:
    """A block's projections as (Hugging Face module name inside the block, Keras `Dense`), in the
    family's checkpoint order (`zoo.shapes.HF_MODULES`); a role the block lacks is left out."""
    found = []
    for role, name in HF_MODULES[family].items():
        part, attribute = _ROLE_LAYERS[role]
        layer = getattr(getattr(block, part), attribute, None)
        if layer is not None:
            found.append((name, layer))
    return found


def hf_projections(model) -> dict:
    """Hugging Face module name -> Keras `Dense` for every projection of a zoo model but a new
    classifier, named as in the task model's checkpoint ("model.layers.0.self_attn.q_proj",
    "bert.pooler.dense"): the names zoo.lora targets, which zoo.hub's weight maps write too."""
    backbone = getattr(model, "backbone", model)
    family = backbone.spec.family
    prefix = "" if model.task == "backbone" else HF_BASE_PREFIX[family]
    found = {f"{prefix}{HF_BLOCKS[family].format(i)}.{name}": layer
             for i, block in enumerate(backbone.blocks) for name, layer in block_projections(block, family)}
    heads = HF_HEADS.get(family, {})
    if getattr(backbone, "pooler", None) is not None and "pooler" in heads:
        found[prefix + heads["pooler"]] = backbone.pooler
    if model.task == "masked_lm" and "masked_lm" in heads:
        found[heads["masked_lm"]] = model.head._intermediate_dense
    return found


def classifier_head(model):
    """A classifier's new head (a `Dense` trained in full beside LoRA, never quantized), else None."""
    return model.classifier if model.task == "classifier" else None


__all__ = [
    "TASKS", "DecoderBackbone", "DecoderCausalLM", "EncoderBackbone", "EncoderClassifier", "EncoderMaskedLM",
    "block_projections", "build", "classifier_head", "hf_projections", "quantizable", "quantized_policies",
]
