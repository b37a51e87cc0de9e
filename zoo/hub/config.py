"""config.json keys that several families share, read and written once: the per-layer attention
kinds (`layer_types`, or each family's older pattern key), RoPE per layer kind, the decoders'
sizes, and the refusal of a setting the zoo cannot honour (docs/families.md lists them)."""

from __future__ import annotations

KINDS = {"full_attention": "global", "sliding_attention": "local"}  # transformers' layer_types -> zoo's kinds
LAYER_TYPES = {kind: name for name, kind in KINDS.items()}


def refuse(config: dict, key: str, allowed, why: str):
    """Refuse `key`'s value unless it is one of `allowed` (its transformers default when absent
    is the first), naming the key, the value and what the zoo computes."""
    value = config.get(key, allowed[0])
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not supported: {why}. zoo computes {key} "
                         f"{' or '.join(map(repr, allowed))}.")
    return value


def pattern(kinds: list) -> tuple:
    """The shortest prefix whose repetition gives `kinds` (ModelSpec.layer_kinds is a repeating pattern)."""
    for n in range(1, len(kinds) + 1):
        if all(kind == kinds[i % n] for i, kind in enumerate(kinds)):
            return tuple(kinds[:n])
    return tuple(kinds)


def layer_kinds(config: dict, legacy) -> tuple:
    """The layers' attention kinds as transformers 5 reads them: `layer_types` when present (transformers
    obeys it whatever the older keys say), else `legacy(i)` ("global"/"local") for each layer."""
    layers = config["num_hidden_layers"]
    types = config.get("layer_types")
    if types is None:
        return pattern([legacy(i) for i in range(layers)])
    unknown = sorted(set(types) - set(KINDS))
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported; zoo computes {', '.join(KINDS)}.")
    if len(types) != layers:
        raise ValueError(f"layer_types has {len(types)} entries for num_hidden_layers={layers}; it needs one a layer.")
    return pattern([KINDS[t] for t in types])


def layer_types(spec) -> list:
    """`layer_types` as transformers 5 writes it."""
    return [LAYER_TYPES[spec.layer_kind(i)] for i in range(spec.num_layers)]


def rope_per_kind(config: dict, legacy_global: str, legacy_local: str, defaults: tuple, linear_global=False) -> tuple:
    """(global theta, local theta, global scaling) of a family with a RoPE per layer kind (Gemma 3, ModernBERT):
    transformers 5's `rope_parameters: {"full_attention": {...}, "sliding_attention": {...}}`, or the
    older top-level keys (and `rope_scaling`, the global layers'), then `defaults`. Plain RoPE (`rope_type`
    "default") is computed, and with `linear_global` (Gemma 3 4B+) the global layers' "linear" scaling: the
    scaling is `{"rope_type": "linear", "factor": F}`, or None."""
    params = config.get("rope_parameters") or {}
    if params and not all(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"rope_parameters {params} is one set; this family's transformers config takes one per layer "
                         "kind ({'full_attention': {...}, 'sliding_attention': {...}}).")
    if config.get("rope_scaling"):
        params = {**params, "full_attention": {**params.get("full_attention", {}), **config["rope_scaling"]}}
    thetas, scaling = [], None
    for kind, key, default in (("full_attention", legacy_global, defaults[0]),
                               ("sliding_attention", legacy_local, defaults[1])):
        kind_params = params.get(kind) or {}
        rope_type = kind_params.get("rope_type", kind_params.get("type", "default"))
        if rope_type == "linear" and linear_global and kind == "full_attention":
            scaling = {"rope_type": "linear", "factor": float(kind_params["factor"])}
        elif rope_type != "default":
            raise ValueError(f"rope_type={rope_type!r} ({kind} layers) is not supported; zoo computes rope_type "
                             "'default' for this family.")
        if kind_params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"partial_rotary_factor={kind_params['partial_rotary_factor']} is not supported; zoo "
                             "rotates the whole head.")
        thetas.append(float(kind_params.get("rope_theta", config.get(key, default))))
    return (*thetas, scaling)


def rope_parameters(spec) -> dict:
    """Per-kind `rope_parameters` as transformers 5 writes them."""
    local = spec.local_rope_theta if spec.local_rope_theta is not None else spec.rope_theta
    scaling = dict(spec.rope_scaling) if spec.rope_scaling else {"rope_type": "default"}  # the global layers'
    return {"full_attention": {**scaling, "rope_theta": spec.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}


def decoder_sizes(config: dict, head_dim=None, tied=False, max_positions=2048, epsilon=1e-6) -> dict:
    """The `ModelSpec` sizes of a Llama-like decoder config. `head_dim`, `tied`, `max_positions` and
    `epsilon` are the family's defaults where the file has no key (transformers' config classes)."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or head_dim or hidden // heads
    return dict(
        vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"], hidden_dim=hidden, num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=None if head_dim == hidden // heads else head_dim, intermediate_dim=config["intermediate_size"],
        max_sequence_length=config.get("max_position_embeddings", max_positions),
        dropout=config.get("attention_dropout", 0.0), layer_norm_epsilon=config.get("rms_norm_eps", epsilon),
        tie_embeddings=bool(config.get("tie_word_embeddings", tied)),
    )


def decoder_config(spec, model_type: str) -> dict:
    """The Llama-like keys of a decoder's config.json, as `decoder_sizes` reads them."""
    return {
        "model_type": model_type, "vocab_size": spec.vocab_size, "num_hidden_layers": spec.num_layers,
        "hidden_size": spec.hidden_dim, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_dim, "max_position_embeddings": spec.max_sequence_length,
        "rms_norm_eps": spec.layer_norm_epsilon, "tie_word_embeddings": spec.tie_embeddings,
        "attention_dropout": spec.dropout, "initializer_range": 0.02,
    }
