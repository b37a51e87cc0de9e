"""The trainable variables' shapes of a spec's model, without building it.

The one place outside the layers that writes the architecture's shapes: `ModelSpec.num_params`
and the memory planner derive from it, and a test checks it against the built layers of every
registered model's shape (tests/zoo/test_registry.py). The Hugging Face weight maps read their
shapes off the built variables. Pure Python, so a spec can be reasoned about without TensorFlow.
"""

import math

DECODER_TASKS = ("backbone", "causal_lm")
ENCODER_TASKS = ("backbone", "masked_lm", "classifier")


def tasks(spec) -> tuple:
    """The tasks a spec's models have (zoo.models.TASKS has their classes)."""
    return DECODER_TASKS if spec.is_decoder else ENCODER_TASKS


def _dense(n_in, n_out, bias) -> list:
    return [(n_in, n_out)] + ([(n_out,)] if bias else [])


def _norm(spec, width) -> list:
    return [(width,), (width,)] if spec.norm == "layer" and spec.norm_bias else [(width,)]


def block_shapes(spec, first=False) -> list:
    """One transformer block's variables, in the model's order (`first`: block 0, which has no
    attention norm when the spec says so)."""
    h, f, d = spec.hidden_dim, spec.intermediate_dim, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    attention = _dense(h, q, spec.qkv_bias) + _dense(h, kv, spec.qkv_bias) * 2
    attention += _norm(spec, d) * 2 if spec.qk_norm else []
    attention += _dense(q, h, spec.dense_bias)
    ffn = _dense(h, f, spec.dense_bias) * (2 if spec.gated_ffn else 1) + _dense(f, h, spec.dense_bias)
    norms = (4 if spec.norm_placement == "sandwich" else 2) - (first and not spec.first_attention_norm)
    return attention + ffn + _norm(spec, h) * norms


def variable_shapes(spec, task=None, num_classes: int = 2) -> list:
    """The shapes of `zoo.get(spec, task=task).trainable_variables`, in order.

    Example:
    >>> variable_shapes(zoo.spec("enc-base"))[:2]
    [(30522, 768), (512, 768)]
    """
    task = task or spec.default_task
    if task not in tasks(spec):
        raise ValueError(f"Unknown task {task!r} for family {spec.family!r}; known: {', '.join(tasks(spec))}.")
    h, v = spec.hidden_dim, spec.vocab_size
    blocks = [shape for i in range(spec.num_layers) for shape in block_shapes(spec, first=i == 0)]
    final_norm = _norm(spec, h) if spec.norm_placement != "post" else []
    if spec.is_decoder:
        embeddings = [(v, h)] if spec.tie_embeddings else [(v, h), (h, v)]  # an untied head is the reverse kernel
        return embeddings + blocks + final_norm
    embeddings = [(v, h)]
    if spec.positions == "learned":  # BERT: positions and token types
        embeddings += [(spec.max_sequence_length, h), (spec.num_segments, h)]
    embeddings += _norm(spec, h) if spec.embedding_norm else []
    # The pooler (BERT), or the head transform that pooled and masked-LM outputs go through (dense, norm).
    pooler = [(h, h), (h,)] if spec.classifier_pooling == "pooler" else []
    transform = _dense(h, h, spec.dense_bias) + _norm(spec, h)
    head = {"backbone": pooler,
            "classifier": (pooler or transform) + [(h, num_classes), (num_classes,)],
            "masked_lm": [(v,)] + transform}[task]  # output bias first; the decoder is the token embedding
    return embeddings + blocks + final_norm + head


def count(shapes) -> int:
    """Elements in all of `shapes`."""
    return sum(math.prod(shape) for shape in shapes)


def num_params(spec, task=None, num_classes: int = 2) -> int:
    return count(variable_shapes(spec, task, num_classes))
