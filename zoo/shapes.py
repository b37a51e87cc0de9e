"""The trainable variables' shapes of a spec's model, without building it.

The one place outside the layers that writes the architecture's shapes: `ModelSpec.num_params`
and the memory planner derive from it, and a test checks it against the built layers of every
registered model's shape (tests/zoo/test_registry.py). The Hugging Face weight maps read their
shapes off the built variables. Pure Python, so a spec can be reasoned about without TensorFlow.
"""

import math

# The tasks each family's models have (zoo.models.TASKS has their classes).
TASKS = {"bert": ("backbone", "masked_lm", "classifier"), "llama": ("backbone", "causal_lm")}


def block_shapes(spec) -> list:
    """One transformer block's variables, in the model's order."""
    h, f = spec.hidden_dim, spec.intermediate_dim
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    if spec.family == "bert":  # q, k, v, o with biases, two LayerNorms, up and down with biases
        return [(h, q), (q,), (h, kv), (kv,), (h, kv), (kv,), (q, h), (h,), (h, f), (f,), (f, h), (h,),
                (h,), (h,), (h,), (h,)]
    return [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h), (h,), (h,)]  # SwiGLU, two RMSNorms


def variable_shapes(spec, task=None, num_classes: int = 2) -> list:
    """The shapes of `zoo.get(spec, task=task).trainable_variables`, in order.

    Example:
    >>> variable_shapes(zoo.spec("enc-base"))[:2]
    [(30522, 768), (512, 768)]
    """
    task = task or spec.default_task
    if task not in TASKS[spec.family]:
        raise ValueError(f"Unknown task {task!r} for family {spec.family!r}; known: {', '.join(TASKS[spec.family])}.")
    h, v = spec.hidden_dim, spec.vocab_size
    blocks = block_shapes(spec) * spec.num_layers
    if spec.family == "bert":
        embeddings = [(v, h), (spec.max_sequence_length, h), (spec.num_segments, h), (h,), (h,)]
        pooler = [(h, h), (h,)]
        # the masked-LM head: output bias, transform dense, LayerNorm (its decoder is the token embedding)
        head = {"backbone": pooler, "classifier": pooler + [(h, num_classes), (num_classes,)],
                "masked_lm": [(v,), (h, h), (h,), (h,), (h,)]}[task]
        return embeddings + blocks + head
    embeddings = [(v, h)] if spec.tie_embeddings else [(v, h), (h, v)]  # an untied head is the reverse kernel
    return embeddings + blocks + [(h,)]  # + the final norm


def count(shapes) -> int:
    """Elements in all of `shapes`."""
    return sum(math.prod(shape) for shape in shapes)


def num_params(spec, task=None, num_classes: int = 2) -> int:
    return count(variable_shapes(spec, task, num_classes))
