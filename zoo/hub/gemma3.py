"""Gemma 3 text models in Hugging Face format: `Gemma3TextConfig` <-> `ModelSpec` (family
"gemma3"). The tensors are Llama's names plus `q_norm`/`k_norm` and the sandwich norms
(zoo.hub.llama's weight map writes them); the head is always tied. The multimodal
`Gemma3ForConditionalGeneration` (model_type "gemma3") is not supported."""

from __future__ import annotations

from zoo.hub import llama
from zoo.hub.config import (
    decoder_config,
    decoder_sizes,
    layer_kinds,
    layer_types,
    refuse,
    rope_parameters,
    rope_per_kind,
)
from zoo.registry import ModelSpec

FAMILY = "gemma3"
MODEL_TYPE = "gemma3_text"
ARCHITECTURES = {"Gemma3TextModel": "backbone", "Gemma3ForCausalLM": "causal_lm"}
DEFAULT_ARCHITECTURE = "Gemma3ForCausalLM"
BASE_PREFIX, DERIVED, KNOWN_HEADS, LEGACY_NAMES = llama.BASE_PREFIX, llama.DERIVED, llama.KNOWN_HEADS, {}
# transformers' Gemma3TextConfig defaults, for keys a file leaves out
DEFAULTS = dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, sliding_window_pattern=6,
                max_position_embeddings=131072, thetas=(1000000.0, 10000.0))


def spec_from_config(config: dict) -> ModelSpec:
    """The `ModelSpec` of a Gemma 3 text config in either format: `layer_types` and per-kind
    `rope_parameters` (transformers 5), or `sliding_window_pattern`, `rope_theta` and
    `rope_local_base_freq` (Gemma 3's own files); refusing by name what the zoo does not compute
    (softcapping, bidirectional attention, biases, RoPE scaling other than the global layers' "linear")."""
    refuse(config, "hidden_activation", ("gelu_pytorch_tanh",), "Gemma 3's MLP is GeGLU with tanh-approximate GELU")
    refuse(config, "attention_bias", (False,), "zoo's Gemma 3 projections have no bias")
    refuse(config, "final_logit_softcapping", (None,), "zoo does not softcap the logits")
    refuse(config, "attn_logit_softcapping", (None,), "zoo does not softcap the attention scores")
    refuse(config, "use_bidirectional_attention", (False,), "zoo's Gemma 3 is a causal decoder")
    period = config.get("sliding_window_pattern", DEFAULTS["sliding_window_pattern"])
    kinds = layer_kinds(config, lambda i: "local" if (i + 1) % period else "global")
    window = config.get("sliding_window", DEFAULTS["sliding_window"])
    local = "local" in kinds
    if local and not window:
        raise ValueError(f"layer_types has sliding_attention layers but sliding_window is {window!r}; set it.")
    theta, local_theta, scaling = rope_per_kind(config, "rope_theta", "rope_local_base_freq", DEFAULTS["thetas"],
                                                linear_global=True)
    sizes = decoder_sizes(config, head_dim=DEFAULTS["head_dim"], tied=True,
                          max_positions=DEFAULTS["max_position_embeddings"])
    if not sizes["tie_embeddings"]:
        raise ValueError("tie_word_embeddings=False is not supported; Gemma 3's head is the token embedding.")
    return ModelSpec(family=FAMILY, rope_theta=theta, local_rope_theta=local_theta if local else None,
                     rope_scaling=scaling,
                     layer_kinds=kinds, sliding_window=window if local else None,
                     query_pre_attn_scalar=config.get("query_pre_attn_scalar", DEFAULTS["query_pre_attn_scalar"]),
                     **sizes)


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
    """The `Gemma3TextConfig` transformers 5 builds the same model from (`layer_types`, per-kind
    `rope_parameters`)."""
    return {
        **decoder_config(spec, MODEL_TYPE), "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": rope_parameters(spec), "layer_types": layer_types(spec),
        "sliding_window": spec.sliding_window,
        "query_pre_attn_scalar": _number(spec.query_pre_attn_scalar or spec.head_dim), "attention_bias": False,
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
        "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    }


def _number(value):
    """An integral float as an int: transformers' strict config refuses 256.0 for query_pre_attn_scalar: int."""
    return int(value) if float(value).is_integer() else value


def weight_map(model):
    return llama.weight_map(model)
