"""The Llama family in Hugging Face format: `LlamaConfig` <-> `ModelSpec` and the
weight map of `LlamaModel` and `LlamaForCausalLM` (tied or untied head).

A family module is what `zoo.hub` needs to read and write one family; adding a
family means adding a module with the same names (see `zoo/hub/__init__.py`).
"""

from __future__ import annotations

from zoo.hub.weights import Entry, dense, norm
from zoo.registry import ModelSpec

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


def spec_from_config(config: dict) -> ModelSpec:
    """The `ModelSpec` of a `LlamaConfig`, refusing settings zoo Llama models do not
    compute (biases, another activation, scaled RoPE) rather than loading them wrong.

    Args:
        config: a parsed `config.json` of model_type "llama".

    Returns:
        A `ModelSpec` with `family="llama"`.

    Example:
    >>> spec_from_config({"model_type": "llama", "vocab_size": 32000, ...}).num_kv_heads
    4
    """
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported; zoo Llama models use 'silu' (SwiGLU).")
    if config.get("rope_scaling"):
        raise ValueError(f"rope_scaling={config['rope_scaling']!r} is not supported; only plain RoPE.")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise ValueError(f"{flag}=True is not supported; zoo Llama projections have no biases.")
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim")
    return ModelSpec(
        family="llama", vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        hidden_dim=hidden, num_heads=heads, num_kv_heads=config.get("num_key_value_heads", heads),
        head_dim=None if head_dim in (None, hidden // heads) else head_dim,
        intermediate_dim=config["intermediate_size"],
        max_sequence_length=config.get("max_position_embeddings", 2048),
        dropout=config.get("attention_dropout", 0.0), layer_norm_epsilon=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
    """The `LlamaConfig` fields transformers builds the same model from (the caller
    adds `architectures` and the dtype).

    Args:
        spec: a `ModelSpec` with `family="llama"`.
        task: the zoo task ("backbone" or "causal_lm").
        num_classes: unused (no Llama classifier).

    Returns:
        A dict for `config.json`.

    Example:
    >>> config_from_spec(zoo.spec("dec-base"), "causal_lm")["num_key_value_heads"]
    3
    """
    return {
        "model_type": MODEL_TYPE, "vocab_size": spec.vocab_size, "num_hidden_layers": spec.num_layers,
        "hidden_size": spec.hidden_dim, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_dim, "max_position_embeddings": spec.max_sequence_length,
        "rms_norm_eps": spec.layer_norm_epsilon, "rope_theta": spec.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": spec.tie_embeddings, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "attention_dropout": spec.dropout, "initializer_range": 0.02,
    }


def weight_map(model) -> list[Entry]:
    """Every variable of a zoo Llama backbone or causal LM with its Hugging Face
    tensor name (without the `model.` prefix), the one table load and save share.

    Args:
        model: a `DecoderBackbone` or `DecoderCausalLM`.

    Returns:
        A list of `Entry`; an untied causal LM adds `lm_head.weight`.

    Example:
    >>> weight_map(zoo.get("dec-base"))[0].key
    'embed_tokens.weight'
    """
    backbone = getattr(model, "backbone", model)
    entries = [Entry("embed_tokens.weight", backbone.token_embedding.embeddings)]
    for i, block in enumerate(backbone.blocks):
        p, att, ffn = f"layers.{i}", block.attention, block.ffn
        entries += [
            *dense(f"{p}.self_attn.q_proj", att.query_dense),
            *dense(f"{p}.self_attn.k_proj", att.key_dense),
            *dense(f"{p}.self_attn.v_proj", att.value_dense),
            *dense(f"{p}.self_attn.o_proj", att.output_dense),
            *dense(f"{p}.mlp.gate_proj", ffn.gate),
            *dense(f"{p}.mlp.up_proj", ffn.up),
            *dense(f"{p}.mlp.down_proj", ffn.down),
            *norm(f"{p}.input_layernorm", block.attention_norm),
            *norm(f"{p}.post_attention_layernorm", block.ffn_norm),
        ]
    entries += norm("norm", backbone.final_norm)
    if model is not backbone and not backbone.spec.tie_embeddings:
        # ReversibleEmbedding keeps the untied head as [hidden, vocab]; Hugging Face lm_head is [vocab, hidden].
        entries.append(Entry("lm_head.weight", backbone.token_embedding.reverse_embeddings, True, "lm_head"))
    return entries
