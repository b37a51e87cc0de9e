"""The trainable variables' shapes of a spec's model, without building it.

The one place outside the layers that writes the architecture's shapes: `ModelSpec.num_params`
and the memory planner derive from it, and a test checks it against the built layers of every
registered model's shape (tests/zoo/test_registry.py). Every family's shapes follow from the
spec's fields (biases, norms, gating, Q/K norms, positions, pooling); each variable keeps the
role Keras' quantization and LoRA give it (a projection's Hugging Face module name), so that the
LoRA planner reads the same list. The Hugging Face weight maps read their shapes off the built
variables. Pure Python, so a spec can be reasoned about without TensorFlow.
"""

import math

DECODER_TASKS = ("backbone", "causal_lm")
ENCODER_TASKS = ("backbone", "masked_lm", "classifier")

# Each projection's Hugging Face module name inside a block, by family and role, in the checkpoints' order;
# `HF_BLOCKS` is block i's module and `HF_BASE_PREFIX` the backbone's inside a task model. zoo.hub's weight maps
# write these names and zoo.lora names LoRA targets by them (through zoo.models.hf_projections), neither importing
# the other. ModernBERT's checkpoints fuse query, key and value into one `Wqkv` and gate and up into one `Wi`, so
# the zoo's separate kernels share those names (zoo.checks.lora_family refuses LoRA there).
_LLAMA_MODULES = dict(query="self_attn.q_proj", key="self_attn.k_proj", value="self_attn.v_proj",
                      output="self_attn.o_proj", gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj")
HF_MODULES = {
    "bert": dict(query="attention.self.query", key="attention.self.key", value="attention.self.value",
                 output="attention.output.dense", up="intermediate.dense", down="output.dense"),
    "llama": _LLAMA_MODULES, "qwen2": _LLAMA_MODULES, "qwen3": _LLAMA_MODULES, "gemma3": _LLAMA_MODULES,
    "modernbert": dict(query="attn.Wqkv", key="attn.Wqkv", value="attn.Wqkv", output="attn.Wo", up="mlp.Wi",
                       gate="mlp.Wi", down="mlp.Wo"),
}
HF_BLOCKS = {family: "encoder.layer.{}" if family == "bert" else "layers.{}" for family in HF_MODULES}
HF_BASE_PREFIX = {family: "bert." if family == "bert" else "model." for family in HF_MODULES}
# Projections outside the blocks that LoRA may adapt: BERT's pooler and its masked-LM head's transform.
HF_HEADS = {"bert": {"pooler": "pooler.dense", "masked_lm": "cls.predictions.transform.dense"}}
# The last part of each name: what `variables` tags a kernel with.
PROJECTION_NAMES = {family: {role: name.rsplit(".", 1)[-1] for role, name in modules.items()}
                    for family, modules in HF_MODULES.items()}

# PEFT's default LoRA targets per family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, peft 0.21.2,
# under each family's model_type: gemma3_text for gemma3), by the last part of the names above. Its
# keys are the families LoRA works on: PEFT has no default for ModernBERT, and zoo refuses LoRA there.
LORA_DEFAULT_TARGETS = {"bert": ("query", "value"), "llama": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"),
                        "qwen3": ("q_proj", "v_proj"), "gemma3": ("q_proj", "v_proj")}


def tasks(spec) -> tuple:
    """The tasks a spec's models have (zoo.models.TASKS has their classes)."""
    return DECODER_TASKS if spec.is_decoder else ENCODER_TASKS


def _dense(tag, n_in, n_out, bias) -> list:
    return [(tag, (n_in, n_out))] + ([(None, (n_out,))] if bias else [])


def _norm(spec, width) -> list:
    return [(None, (width,))] * (2 if spec.norm == "layer" and spec.norm_bias else 1)


def block_variables(spec, first=False) -> list:
    """One transformer block's variables in the model's order, as (tag, shape): a kernel's tag is
    its projection's name (`PROJECTION_NAMES`; a role the family's checkpoints lack, such as a
    gated BERT's gate, by the role), a bias's or a norm's is None. `first`: block 0, which has no
    attention norm when the spec says so."""
    h, f, d = spec.hidden_dim, spec.intermediate_dim, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    names = PROJECTION_NAMES[spec.family]

    def name(role):
        return names.get(role, role)

    attention = (_dense(name("query"), h, q, spec.qkv_bias) + _dense(name("key"), h, kv, spec.qkv_bias)
                 + _dense(name("value"), h, kv, spec.qkv_bias))
    attention += _norm(spec, d) * 2 if spec.qk_norm else []
    attention += _dense(name("output"), q, h, spec.dense_bias)
    ffn = _dense(name("up"), h, f, spec.dense_bias)
    ffn += _dense(name("gate"), h, f, spec.dense_bias) if spec.gated_ffn else []
    ffn += _dense(name("down"), f, h, spec.dense_bias)
    norms = (4 if spec.norm_placement == "sandwich" else 2) - (first and not spec.first_attention_norm)
    return attention + ffn + _norm(spec, h) * norms


def block_shapes(spec, first=False) -> list:
    """One transformer block's variables, in the model's order."""
    return [shape for _, shape in block_variables(spec, first)]


def block_projections(spec) -> list:
    """One block's projections (what LoRA adapts and quantization stores as integers), in the
    model's order: (the last part of the Hugging Face module name, (in, out))."""
    return [(tag, shape) for tag, shape in block_variables(spec) if len(shape) == 2]


def variables(spec, task=None, num_classes: int = 2) -> list:
    """`zoo.get(spec, task=task).trainable_variables` as (tag, shape), in order. Tags say what
    Keras' quantization and LoRA see: a projection's name for a Dense kernel ("q_proj", "Wqkv",
    "dense": BERT's pooler and the masked-LM / ModernBERT head transform too), "embedding" (the
    token and segment embeddings), "lm_head" (an untied head: the reverse embedding),
    "classifier" (a new head) and None (biases, norms, position embeddings: float).

    Example:
    >>> variables(zoo.spec("enc-base"))[:2]
    [('embedding', (30522, 768)), (None, (512, 768))]
    """
    task = task or spec.default_task
    if task not in tasks(spec):
        raise ValueError(f"Unknown task {task!r} for family {spec.family!r}; known: {', '.join(tasks(spec))}.")
    h, v = spec.hidden_dim, spec.vocab_size
    blocks = [var for i in range(spec.num_layers) for var in block_variables(spec, first=i == 0)]
    final_norm = _norm(spec, h) if spec.norm_placement != "post" else []
    if spec.is_decoder:  # an untied head is the token embedding's reverse kernel
        embeddings = [("embedding", (v, h))] + ([] if spec.tie_embeddings else [("lm_head", (h, v))])
        return embeddings + blocks + final_norm
    embeddings = [("embedding", (v, h))]
    if spec.positions == "learned":  # BERT: positions and token types
        embeddings += [(None, (spec.max_sequence_length, h)), ("embedding", (spec.num_segments, h))]
    embeddings += _norm(spec, h) if spec.embedding_norm else []
    # The pooler (BERT), or the head transform that pooled and masked-LM outputs go through (dense, norm).
    pooler = [("dense", (h, h)), (None, (h,))] if spec.classifier_pooling == "pooler" else []
    transform = _dense("dense", h, h, spec.dense_bias) + _norm(spec, h)
    head = {"backbone": pooler,
            "classifier": (pooler or transform) + [("classifier", (h, num_classes)), ("classifier", (num_classes,))],
            "masked_lm": [(None, (v,))] + transform}[task]  # output bias first; the decoder is the token embedding
    return embeddings + blocks + final_norm + head


def variable_shapes(spec, task=None, num_classes: int = 2) -> list:
    """The shapes of `zoo.get(spec, task=task).trainable_variables`, in order (`variables`)."""
    return [shape for _, shape in variables(spec, task, num_classes)]


def count(shapes) -> int:
    """Elements in all of `shapes`."""
    return sum(math.prod(shape) for shape in shapes)


def num_params(spec, task=None, num_classes: int = 2) -> int:
    return count(variable_shapes(spec, task, num_classes))
