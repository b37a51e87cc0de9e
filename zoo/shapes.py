"""The trainable variables' shapes of a spec's model, without building it.

The one place outside the layers that writes the architecture's shapes: `ModelSpec.num_params`
and the memory planner derive from it, and a test checks it against the built layers of every
registered model's shape (tests/zoo/test_registry.py). The Hugging Face weight maps read their
shapes off the built variables. Pure Python, so a spec can be reasoned about without TensorFlow.
"""

import math

# The tasks each family's models have (zoo.models.TASKS has their classes).
TASKS = {"bert": ("backbone", "masked_lm", "classifier"), "llama": ("backbone", "causal_lm")}


# PEFT's default LoRA targets per family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), by the
# last part of the Hugging Face module names `block_projections` gives.
LORA_DEFAULT_TARGETS = {"llama": ("q_proj", "v_proj"), "bert": ("query", "value")}


def block_projections(spec) -> list:
    """One block's projections (what LoRA adapts and quantization stores as integers), in the
    model's order: (the last part of the Hugging Face module name, (in, out))."""
    h, f = spec.hidden_dim, spec.intermediate_dim
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    if spec.family == "bert":
        return [("query", (h, q)), ("key", (h, kv)), ("value", (h, kv)), ("dense", (q, h)), ("dense", (h, f)),
                ("dense", (f, h))]
    return [("q_proj", (h, q)), ("k_proj", (h, kv)), ("v_proj", (h, kv)), ("o_proj", (q, h)), ("up_proj", (h, f)),
            ("gate_proj", (h, f)), ("down_proj", (f, h))]


def block_variables(spec) -> list:
    """One transformer block's variables in the model's order, as (tag, shape): a kernel's tag is
    its projection's name (`block_projections`), a bias's or a norm's is None."""
    h = spec.hidden_dim
    kernels = block_projections(spec)
    if spec.family == "bert":  # each projection with its bias, then two LayerNorms
        return [v for name, shape in kernels for v in ((name, shape), (None, shape[1:]))] + [(None, (h,))] * 4
    return kernels + [(None, (h,))] * 2  # SwiGLU, two RMSNorms


def block_shapes(spec) -> list:
    """One transformer block's variables, in the model's order."""
    return [shape for _, shape in block_variables(spec)]


def variables(spec, task=None, num_classes: int = 2) -> list:
    """`zoo.get(spec, task=task).trainable_variables` as (tag, shape), in order. Tags say what
    Keras' quantization and LoRA see: a projection's name for a Dense kernel ("q_proj", "dense":
    BERT's pooler and masked-LM transform too), "embedding" (the token and segment embeddings),
    "lm_head" (an untied head: the reverse embedding), "classifier" (a new head) and None
    (biases, norms, position embeddings: float).

    Example:
    >>> variables(zoo.spec("enc-base"))[:2]
    [('embedding', (30522, 768)), (None, (512, 768))]
    """
    task = task or spec.default_task
    if task not in TASKS[spec.family]:
        raise ValueError(f"Unknown task {task!r} for family {spec.family!r}; known: {', '.join(TASKS[spec.family])}.")
    h, v = spec.hidden_dim, spec.vocab_size
    blocks = block_variables(spec) * spec.num_layers
    if spec.family == "bert":
        embeddings = [("embedding", (v, h)), (None, (spec.max_sequence_length, h)),
                      ("embedding", (spec.num_segments, h)), (None, (h,)), (None, (h,))]
        pooler = [("dense", (h, h)), (None, (h,))]
        # the masked-LM head: output bias, transform dense, LayerNorm (its decoder is the token embedding)
        head = {"backbone": pooler, "classifier": pooler + [("classifier", (h, num_classes)),
                                                            ("classifier", (num_classes,))],
                "masked_lm": [(None, (v,)), ("dense", (h, h)), (None, (h,)), (None, (h,)), (None, (h,))]}[task]
        return embeddings + blocks + head
    # an untied head is the token embedding's reverse kernel
    embeddings = [("embedding", (v, h))] + ([] if spec.tie_embeddings else [("lm_head", (h, v))])
    return embeddings + blocks + [(None, (h,))]  # + the final norm


def variable_shapes(spec, task=None, num_classes: int = 2) -> list:
    """The shapes of `zoo.get(spec, task=task).trainable_variables`, in order (`variables`)."""
    return [shape for _, shape in variables(spec, task, num_classes)]


def count(shapes) -> int:
    """Elements in all of `shapes`."""
    return sum(math.prod(shape) for shape in shapes)


def num_params(spec, task=None, num_classes: int = 2) -> int:
    return count(variable_shapes(spec, task, num_classes))
