"""The Llama family in Hugging Face format: `LlamaConfig` <-> `ModelSpec` and the
weight map of `LlamaModel` and `LlamaForCausalLM` (tied or untied head).

A family module is what `zoo.hub` needs to read and write one family; adding a
family means adding a module with the same names (see `zoo/hub/__init__.py`).
"""

from __future__ import annotations

from zoo.hub.config import decoder_config, decoder_sizes
from zoo.hub.weights import Entry, dense, embedding, norm
from zoo.models import block_projections
from zoo.registry import ModelSpec
from zoo.shapes import HF_BLOCKS

FAMILY = "llama"
MODEL_TYPE = "llama"
# Hugging Face architecture -> zoo task.
ARCHITECTURES = {"LlamaModel": "backbone", "LlamaForCausalLM": "causal_lm"}
DEFAULT_ARCHITECTURE = "LlamaForCausalLM"  # a config.json with a model_type and no architectures
BASE_PREFIX = "model."  # the backbone inside a task model
# Tensors Hugging Face stores but rebuilds itself (buffers): skipped on load.
DERIVED = ("rotary_emb.inv_freq",)
# Heads a zoo task may not have: dropped on load, as transformers does.
KNOWN_HEADS = ("lm_head.",)
LEGACY_NAMES = {}


ROPE_TYPES = ("default", "llama3")  # what zoo computes; transformers also knows linear, dynamic, yarn, longrope...


def rope_from_config(config: dict) -> tuple[float, dict | None]:
    """The RoPE base and scaling a `LlamaConfig` means, read as transformers 5 reads
    them, so that no file format silently falls back to a default theta.

    transformers 5 writes `"rope_parameters": {"rope_theta": ..., "rope_type": ...}`;
    transformers 4 wrote a top-level `rope_theta` and `rope_scaling` (with `type` in
    older files). As in transformers, a legacy `rope_scaling` dict takes precedence over
    `rope_parameters`, a theta missing from the dict comes from the top level, then
    10000; for llama3, a top-level `original_max_position_embeddings` wins, then the
    dict's, then `max_position_embeddings`.

    Args:
        config: a parsed `config.json` of model_type "llama".

    Returns:
        `(rope_theta, rope_scaling)`: the scaling is None for plain RoPE, else the
        llama3 dict (rope_type, factor, low_freq_factor, high_freq_factor,
        original_max_position_embeddings).

    Raises:
        ValueError: any rope_type but "default" and "llama3" (named, with the
            supported ones), per-layer RoPE, or a partial rotary dimension.

    Example:
    >>> rope_from_config({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})
    (500000.0, None)
    """
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"Per-layer RoPE parameters ({sorted(params)}) are not supported; Llama uses one RoPE.")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type={rope_type!r} is not supported; zoo computes rope_type "
                         f"{' and '.join(map(repr, ROPE_TYPES))}.")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor={params['partial_rotary_factor']} is not supported; zoo rotates "
                         "the whole head.")
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return theta, None
    original = config.get("original_max_position_embeddings",
                          params.get("original_max_position_embeddings", config.get("max_position_embeddings")))
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
    if missing or original is None:
        raise ValueError(f"rope_type 'llama3' needs {', '.join(missing or ['original_max_position_embeddings'])} "
                         f"in rope_parameters; got {params}.")
    return theta, {"rope_type": "llama3", "factor": params["factor"], "low_freq_factor": params["low_freq_factor"],
                   "high_freq_factor": params["high_freq_factor"], "original_max_position_embeddings": original}


def spec_from_config(config: dict) -> ModelSpec:
    """The `ModelSpec` of a `LlamaConfig`, reading every field that changes the numbers
    (RoPE in all its file formats, head_dim, rms_norm_eps, tie_word_embeddings) and
    refusing what zoo Llama models do not compute (biases, another activation, another
    RoPE type) rather than loading it wrong.

    Args:
        config: a parsed `config.json` of model_type "llama".

    Returns:
        A `ModelSpec` with `family="llama"`.

    Example:
    >>> spec_from_config(json.load(open("Llama-3.2-1B/config.json"))).rope_scaling[0]
    ('factor', 32.0)
    """
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported; zoo Llama models use 'silu' (SwiGLU).")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise ValueError(f"{flag}=True is not supported; zoo Llama projections have no biases.")
    theta, scaling = rope_from_config(config)
    return ModelSpec(family="llama", rope_theta=theta, rope_scaling=scaling, **decoder_sizes(config))


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
    """The `LlamaConfig` fields transformers builds the same model from (the caller
    adds `architectures` and the dtype).

    RoPE is written as transformers 5 writes it (`rope_parameters`), and again as
    transformers 4 read it (top-level `rope_theta`, `rope_scaling` without the theta):
    transformers 5 reads both with no warning, and a reader of the old keys (transformers
    4, keras-hub's converter) would otherwise silently use theta 10000.

    Args:
        spec: a `ModelSpec` with `family="llama"`.
        task: the zoo task ("backbone" or "causal_lm").
        num_classes: unused (no Llama classifier).

    Returns:
        A dict for `config.json`.

    Example:
    >>> config_from_spec(zoo.spec("dec-base"), "causal_lm")["rope_parameters"]
    {'rope_type': 'default', 'rope_theta': 100000.0}
    """
    scaling = dict(spec.rope_scaling) if spec.rope_scaling else None
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if scaling:
        rope = {**scaling, "rope_theta": spec.rope_theta}
    return {**decoder_config(spec, MODEL_TYPE), "rope_parameters": rope, "rope_theta": spec.rope_theta,
            "rope_scaling": scaling, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def weight_map(model) -> list[Entry]:
    """Every variable of a zoo decoder backbone or causal LM with its Hugging Face tensor name
    (without the `model.` prefix), the one table load and save share: Llama's names, and those
    of the relatives that add to them (Q/K/V biases, `q_norm`/`k_norm`, Gemma's sandwich norms).

    Args:
        model: a `DecoderBackbone` or `DecoderCausalLM`.

    Returns:
        A list of `Entry`; an untied causal LM adds `lm_head.weight`.

    Example:
    >>> weight_map(zoo.get("dec-base"))[0].key
    'embed_tokens.weight'
    """
    backbone = getattr(model, "backbone", model)
    entries = [embedding("embed_tokens.weight", backbone.token_embedding)]
    family = backbone.spec.family
    for i, block in enumerate(backbone.blocks):
        p, att = HF_BLOCKS[family].format(i), block.attention
        entries += [entry for name, layer in block_projections(block, family) for entry in dense(f"{p}.{name}", layer)]
        entries += norm(f"{p}.input_layernorm", block.attention_norm)
        if att.query_norm is not None:
            entries += [*norm(f"{p}.self_attn.q_norm", att.query_norm), *norm(f"{p}.self_attn.k_norm", att.key_norm)]
        if block.post_attention_norm is None:  # Llama's post_attention_layernorm is the norm before the MLP
            entries += norm(f"{p}.post_attention_layernorm", block.ffn_norm)
        else:  # Gemma's sandwich
            entries += [*norm(f"{p}.post_attention_layernorm", block.post_attention_norm),
                        *norm(f"{p}.pre_feedforward_layernorm", block.ffn_norm),
                        *norm(f"{p}.post_feedforward_layernorm", block.post_ffn_norm)]
    entries += norm("norm", backbone.final_norm)
    if model is not backbone and not backbone.spec.tie_embeddings:
        # ReversibleEmbedding keeps the untied head as [hidden, vocab]; Hugging Face lm_head is [vocab, hidden].
        entries.append(embedding("lm_head.weight", backbone.token_embedding, "lm_head", reverse=True))
    return entries
