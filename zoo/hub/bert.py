"""The BERT family in Hugging Face format: `BertConfig` <-> `ModelSpec` and the
weight map of `BertModel`, `BertForMaskedLM` and `BertForSequenceClassification`.

A family module is what `zoo.hub` needs to read and write one family; adding a
family means adding a module with the same names (see `zoo/hub/__init__.py`).
"""

from __future__ import annotations

from zoo.hub.weights import Entry, dense, norm
from zoo.registry import ModelSpec

FAMILY = "bert"
MODEL_TYPE = "bert"
# Hugging Face architecture -> zoo task.
ARCHITECTURES = {"BertModel": "backbone", "BertForMaskedLM": "masked_lm",
                 "BertForSequenceClassification": "classifier"}
DEFAULT_ARCHITECTURE = "BertModel"  # a config.json with a model_type and no architectures
BASE_PREFIX = "bert."  # the backbone inside a task model
# Tensors Hugging Face stores but rebuilds itself (buffers, the decoder tied to the embedding): skipped on load.
DERIVED = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Heads a zoo task may not have: dropped on load, as transformers does.
KNOWN_HEADS = ("pooler.", "cls.", "classifier.")
# TF-era checkpoints name LayerNorm parameters gamma/beta.
LEGACY_NAMES = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}


def spec_from_config(config: dict) -> ModelSpec:
    """The `ModelSpec` of a `BertConfig`, refusing settings zoo BERT models do not
    compute (another activation, relative positions) rather than loading them wrong.

    Args:
        config: a parsed `config.json` of model_type "bert".

    Returns:
        A `ModelSpec` with `family="bert"`.

    Example:
    >>> spec_from_config(json.load(open("all-MiniLM-L6-v2/config.json"))).num_layers
    6
    """
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"hidden_act={act!r} is not supported; zoo BERT models use exact (erf) 'gelu'.")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("Only position_embedding_type='absolute' BERT checkpoints are supported.")
    return ModelSpec(
        family="bert", vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
        hidden_dim=config["hidden_size"], num_heads=config["num_attention_heads"],
        intermediate_dim=config["intermediate_size"],
        max_sequence_length=config.get("max_position_embeddings", 512),
        num_segments=config.get("type_vocab_size", 2), dropout=config.get("hidden_dropout_prob", 0.1),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
    )


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
    """The `BertConfig` fields transformers builds the same model from (the caller adds
    `architectures` and the dtype).

    Args:
        spec: a `ModelSpec` with `family="bert"`.
        task: the zoo task; "classifier" writes the labels.
        num_classes: the classifier's number of labels.

    Returns:
        A dict for `config.json`.

    Example:
    >>> config_from_spec(zoo.spec("enc-base"), "backbone")["hidden_size"]
    768
    """
    config = {
        "model_type": MODEL_TYPE, "vocab_size": spec.vocab_size, "num_hidden_layers": spec.num_layers,
        "hidden_size": spec.hidden_dim, "num_attention_heads": spec.num_heads,
        "intermediate_size": spec.intermediate_dim, "max_position_embeddings": spec.max_sequence_length,
        "type_vocab_size": spec.num_segments, "hidden_act": "gelu", "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.dropout, "layer_norm_eps": spec.layer_norm_epsilon,
        "position_embedding_type": "absolute", "pad_token_id": 0, "initializer_range": 0.02,
    }
    if task == "classifier" and num_classes is not None:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(num_classes)}
    return config


def weight_map(model) -> list[Entry]:
    """Every variable of a zoo BERT backbone or task model with its Hugging Face
    tensor name (without the `bert.` prefix), the one table load and save share.

    Args:
        model: an `EncoderBackbone`, `EncoderMaskedLM` or `EncoderClassifier`.

    Returns:
        A list of `Entry`.

    Example:
    >>> weight_map(zoo.get("enc-mini"))[0].key
    'embeddings.word_embeddings.weight'
    """
    backbone = getattr(model, "backbone", model)
    entries = [
        Entry("embeddings.word_embeddings.weight", backbone.token_embedding.embeddings),
        Entry("embeddings.position_embeddings.weight", backbone.position_embedding.position_embeddings),
        Entry("embeddings.token_type_embeddings.weight", backbone.segment_embedding.embeddings),
        *norm("embeddings.LayerNorm", backbone.embeddings_norm),
    ]
    for i, block in enumerate(backbone.blocks):
        p, att = f"encoder.layer.{i}", block.attention
        entries += [
            *dense(f"{p}.attention.self.query", att.query_dense),
            *dense(f"{p}.attention.self.key", att.key_dense),
            *dense(f"{p}.attention.self.value", att.value_dense),
            *dense(f"{p}.attention.output.dense", att.output_dense),
            *norm(f"{p}.attention.output.LayerNorm", block.attention_norm),
            *dense(f"{p}.intermediate.dense", block.ffn.up),
            *dense(f"{p}.output.dense", block.ffn.down),
            *norm(f"{p}.output.LayerNorm", block.ffn_norm),
        ]
    if backbone.pooler is not None:
        entries += dense("pooler.dense", backbone.pooler, "pooler")
    if model.task == "masked_lm":  # cls.predictions; its decoder is tied to the token embedding
        head = model.head
        entries += [
            *dense("cls.predictions.transform.dense", head._intermediate_dense, "mlm"),
            *norm("cls.predictions.transform.LayerNorm", head._intermediate_layer_norm, "mlm"),
            Entry("cls.predictions.bias", head._bias, False, "mlm"),
        ]
    if model.task == "classifier":
        entries += dense("classifier", model.classifier, "classifier")
    return entries
