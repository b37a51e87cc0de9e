"""ModernBERT in Hugging Face format: `ModernBertConfig` <-> `ModelSpec` (family "modernbert")
and the weight map of `ModernBertModel`, `ModernBertForMaskedLM` and
`ModernBertForSequenceClassification`. Its fused `Wqkv` ([q; k; v] rows) and `Wi` ([gate; up]
rows: transformers applies the activation to the first half) are split into the zoo's
separate kernels (`weights.Entry` with a tuple of variables)."""

from __future__ import annotations

from zoo.hub.config import layer_kinds, layer_types, refuse, rope_parameters, rope_per_kind
from zoo.hub.weights import Entry, dense, norm
from zoo.registry import ModelSpec

FAMILY = "modernbert"
MODEL_TYPE = "modernbert"
ARCHITECTURES = {"ModernBertModel": "backbone", "ModernBertForMaskedLM": "masked_lm",
                 "ModernBertForSequenceClassification": "classifier"}
DEFAULT_ARCHITECTURE = "ModernBertModel"
BASE_PREFIX = "model."
DERIVED = ("decoder.weight",)  # tied to the token embedding
KNOWN_HEADS = ("head.", "decoder.", "classifier.")
LEGACY_NAMES = {}
SPECIAL_IDS = {"pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282, "cls_token_id": 50281,
               "sep_token_id": 50282}  # the released vocabulary's


def spec_from_config(config: dict) -> ModelSpec:
    """The `ModelSpec` of a ModernBERT config in either format: `layer_types` and per-kind
    `rope_parameters` (transformers 5), or `global_attn_every_n_layers`, `global_rope_theta` and
    `local_rope_theta` (ModernBERT's own files). `local_attention` L is |i - j| <= L // 2, the zoo's
    window L // 2 + 1. The dropouts become the zoo's one `dropout` (their largest)."""
    refuse(config, "hidden_activation", ("gelu",), "ModernBERT's MLP is GeGLU with exact GELU")
    refuse(config, "classifier_activation", (config.get("hidden_activation", "gelu"),),
           "zoo's head uses the model's hidden_activation")
    for key in ("attention_bias", "mlp_bias", "classifier_bias"):
        refuse(config, key, (False,), "zoo's ModernBERT projections have no bias")
    refuse(config, "decoder_bias", (True,), "zoo's masked-LM head always has an output bias")
    refuse(config, "tie_word_embeddings", (True,), "zoo's masked-LM decoder is the token embedding")
    every = config.get("global_attn_every_n_layers", 3)
    kinds = layer_kinds(config, lambda i: "local" if i % every else "global")
    local = "local" in kinds
    theta, local_theta, _ = rope_per_kind(config, "global_rope_theta", "local_rope_theta", (160000.0, 10000.0))
    dropout = max(config.get(k, 0.0) for k in ("attention_dropout", "mlp_dropout", "embedding_dropout"))
    return ModelSpec(
        family=FAMILY, vocab_size=config.get("vocab_size", 50368), num_layers=config["num_hidden_layers"],
        hidden_dim=config["hidden_size"], num_heads=config["num_attention_heads"],
        intermediate_dim=config["intermediate_size"], max_sequence_length=config.get("max_position_embeddings", 8192),
        dropout=dropout, layer_norm_epsilon=config.get("norm_eps", 1e-5), norm_bias=config.get("norm_bias", False),
        rope_theta=theta, local_rope_theta=local_theta if local else None, layer_kinds=kinds,
        sliding_window=config.get("local_attention", 128) // 2 + 1 if local else None,
        classifier_pooling=refuse(config, "classifier_pooling", ("cls", "mean"), "zoo pools by [CLS] or the mean"),
    )


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
    """The `ModernBertConfig` transformers 5 builds the same model from (`layer_types`, per-kind
    `rope_parameters`, `local_attention` = 2 (window - 1)). The special tokens' ids are the
    released vocabulary's when it fits, else 0, 1, 2 (they only set the embedding's padding row)."""
    window = spec.sliding_window or 65
    ids = SPECIAL_IDS if spec.vocab_size > max(SPECIAL_IDS.values()) else {
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}
    config = {
        "model_type": MODEL_TYPE, "vocab_size": spec.vocab_size, "num_hidden_layers": spec.num_layers,
        "hidden_size": spec.hidden_dim, "num_attention_heads": spec.num_heads,
        "intermediate_size": spec.intermediate_dim, "max_position_embeddings": spec.max_sequence_length,
        "hidden_activation": spec.activation, "classifier_activation": spec.activation,
        "norm_eps": spec.layer_norm_epsilon, "norm_bias": spec.norm_bias, "attention_bias": False,
        "mlp_bias": False, "classifier_bias": False, "decoder_bias": True, "tie_word_embeddings": True,
        "layer_types": layer_types(spec), "local_attention": 2 * (window - 1),
        "rope_parameters": rope_parameters(spec), "classifier_pooling": spec.classifier_pooling,
        "attention_dropout": spec.dropout, "mlp_dropout": spec.dropout, "embedding_dropout": spec.dropout,
        "classifier_dropout": spec.dropout, "initializer_range": 0.02, **ids,
    }
    if task == "classifier" and num_classes is not None:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(num_classes)}
    return config


def weight_map(model) -> list[Entry]:
    """Every variable of a zoo ModernBERT backbone or task model with its Hugging Face tensor name
    (without the `model.` prefix); `head.*` is the masked-LM and the classifier heads' transform."""
    backbone = getattr(model, "backbone", model)
    entries = [Entry("embeddings.tok_embeddings.weight", backbone.token_embedding.embeddings),
               *norm("embeddings.norm", backbone.embeddings_norm)]
    for i, block in enumerate(backbone.blocks):
        p, att, ffn = f"layers.{i}", block.attention, block.ffn
        if block.attention_norm is not None:
            entries += norm(f"{p}.attn_norm", block.attention_norm)
        entries += [
            Entry(f"{p}.attn.Wqkv.weight", (att.query_dense.kernel, att.key_dense.kernel, att.value_dense.kernel),
                  True),
            *dense(f"{p}.attn.Wo", att.output_dense),
            *norm(f"{p}.mlp_norm", block.ffn_norm),
            Entry(f"{p}.mlp.Wi.weight", (ffn.gate.kernel, ffn.up.kernel), True),
            *dense(f"{p}.mlp.Wo", ffn.down),
        ]
    entries += norm("final_norm", backbone.final_norm)
    if model.task == "masked_lm":
        entries += [*dense("head.dense", model.head._intermediate_dense, "head"),
                    *norm("head.norm", model.head._intermediate_layer_norm, "head"),
                    Entry("decoder.bias", model.head._bias, False, "mlm")]
    if model.task == "classifier":
        entries += [*dense("head.dense", model.head_dense, "head"), *norm("head.norm", model.head_norm, "head"),
                    *dense("classifier", model.classifier, "classifier")]
    return entries
