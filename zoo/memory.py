"""What a training step will take, before anything is built.

The analytical model: fp32 master weights, fp32 gradients and Adam's two fp32
moments (16 bytes/param), plus activations kept for the backward pass per
layer, following Korthikanti et al. (2022), "Reducing Activation Recomputation
in Large Transformer Models": s·b·h·(34 + 5·a·s/h) bytes per layer with 16-bit
activations, where 5·a·s²·b is the attention core (softmax output, dropout mask
and dropped probabilities) that selective recomputation drops. Activations in
float32 take twice the 16-bit figure. Under `full` only each block's input
(2·s·b·h bytes in 16-bit) is kept, plus one block's activations while it is
recomputed. Logits and their gradient are float32 [b, s, vocab].

The chunked attention core (the default) keeps none of the 5·a·s²·b term, under
any policy: it saves its float32 output (4·s·b·h bytes) and each row's
log-sum-exp (4·a·s·b) instead, and works on float32 tiles of chunk × chunk
scores, about six of them alive at once in one layer's backward pass. So its
estimate grows linearly in s; the plain core's (`attention="plain"`) grows as s².

It is an estimate, meant to rank choices and to refuse a run that cannot fit;
`benchmarks/memory.py` measures the real figures on this stack.
"""

from dataclasses import asdict, dataclass

from zoo.layers.attention_core import DEFAULT_CHUNK, check_core
from zoo.recompute import resolve
from zoo.registry import ModelSpec
from zoo.registry import spec as lookup

GiB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}

    def table(self) -> str:
        rows = [(k, v) for k, v in self.as_dict().items()]
        return "\n".join(f"{k:12s} {v / GiB:8.2f} GiB" for k, v in rows)


def _activation_bytes(precision: str) -> int:
    return 4 if precision == "float32" else 2


TILES_ALIVE = 6  # float32 tiles in the chunked core's backward: scores, P, dropout scale, dP, dS, dropped P


def estimate(spec, batch_size: int, sequence_length: int, precision: str = "float32",
             checkpointing="none", task=None, optimizer: str = "adam", attention: str = "chunked",
             chunk_size: int | None = None) -> MemoryEstimate:
    """Bytes one training step holds at its peak, by component.

    Args:
        spec: a registered model name or a `ModelSpec` (nothing is built).
        batch_size, sequence_length: the step's shape.
        precision: a dtype policy name ("float32", "mixed_bfloat16", ...).
        checkpointing: "none", "full" or "selective".
        task: the task head; None: the family's default.
        optimizer: "adam"/"adamw" (two fp32 moments) or "sgd".
        attention: the attention core, "chunked" (default) or "plain".
        chunk_size: the chunked core's tile side; None: as the model picks it.

    Returns:
        A `MemoryEstimate` (bytes per component and `.total`).

    Example:
    >>> estimate("enc-1b", 4, 512, "mixed_bfloat16", "full").total / GiB
    """
    s: ModelSpec = lookup(spec)
    policy = resolve(checkpointing)
    params = s.num_params(task)
    weight_bytes = 2 if precision in ("bfloat16", "float16") else 4
    optimizer_slots = {"adam": 2, "adamw": 2, "sgd": 0}[optimizer.lower()]

    check_core(attention)
    b, seq, h, a = batch_size, sequence_length, s.hidden_dim, s.num_heads
    scale = _activation_bytes(precision) / 2  # the formula counts 16-bit activations
    per_layer_no_core = seq * b * h * 34 * scale
    if s.family == "llama":  # SwiGLU holds three ffn-wide tensors instead of two
        per_layer_no_core += seq * b * s.intermediate_dim * 2 * scale
    if attention == "plain":
        per_layer_full = per_layer_no_core + seq * b * h * (5 * a * seq / h) * scale
        working = 0
    else:  # no s² term kept; float32 output and log-sum-exp saved; a few tiles alive in one layer
        per_layer_no_core += 4 * seq * b * h + 4 * a * seq * b
        per_layer_full = per_layer_no_core
        tile = min(seq, chunk_size or DEFAULT_CHUNK)
        working = TILES_ALIVE * b * a * tile * tile * 4
    layers = s.num_layers
    if policy == "none":
        activations = layers * per_layer_full
    elif policy == "selective":
        activations = layers * per_layer_no_core
    else:
        activations = layers * 2 * seq * b * h * scale + per_layer_full
    activations += working
    logits = 0
    if (task or s.default_task) in ("causal_lm",):
        logits = 3 * b * seq * s.vocab_size * 4  # logits, softmax, their gradient
    return MemoryEstimate(
        weights=params * weight_bytes,
        gradients=params * weight_bytes,
        optimizer=params * 4 * optimizer_slots,
        activations=int(activations),
        logits=int(logits),
    )


def largest_batch(spec, sequence_length: int, budget_bytes: int, limit: int = 4096, **kwargs) -> int:
    """The largest batch size whose estimate fits `budget_bytes` (0 if none does).

    Args:
        spec: a registered model name or a `ModelSpec`.
        sequence_length: the step's sequence length.
        budget_bytes: the memory available.
        limit: the largest batch tried.
        **kwargs: `estimate`'s other arguments (precision, checkpointing, ...).

    Returns:
        The batch size, 0 if not even batch 1 fits.

    Example:
    >>> largest_batch("dec-1b", 512, 24 * GiB, precision="mixed_bfloat16", checkpointing="full")
    """
    best = 0
    batch = 1
    while batch <= limit and estimate(spec, batch, sequence_length, **kwargs).total <= budget_bytes:
        best, batch = batch, batch * 2
    low, high = best, min(batch, limit + 1)
    while high - low > 1:  # the doubling overshot: bisect between the last fit and the first miss
        mid = (low + high) // 2
        if estimate(spec, mid, sequence_length, **kwargs).total <= budget_bytes:
            low = mid
        else:
            high = mid
    return low
