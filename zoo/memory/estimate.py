"""What a training step will take, before anything is built: the analytical model
(Korthikanti et al. 2022's activations, plus what TensorFlow keeps beyond them), explained
with its measurements in docs/memory.md. An estimate, meant to rank choices and to refuse a
run that cannot fit; benchmarks/planner.py measures it against the allocator.
"""

from dataclasses import asdict, dataclass

from zoo import checks, registry
from zoo.memory import optimizer_state
from zoo.memory.budget import default_budget
from zoo.memory.lora import plan as lora_plan
from zoo.ops import lm_loss
from zoo.ops.attention_core import DEFAULT_CHUNK, check_core, resolve_core
from zoo.ops.recompute import policy_name
from zoo.shapes import block_shapes, count, variable_shapes

GiB = 1024**3

# What `checkpointing="auto"` tries, fastest first.
CONFIGS = ("none", "selective", "full", "full+fused")
MASKED_FRACTION = 0.15  # BERT's masked-LM rate: the positions a masked_lm head computes logits for


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes by component; `.total` is what the TF allocator's peak should show for a
    fresh process that builds the model and the optimizer and trains (benchmarks/planner.py).

    weights: the variables (float32 under float32 and mixed_* policies; bfloat16 weights 2 bytes).
    gradients: the gradients alive at once (all of them; one block's + embedding/head when fused),
        in the variables' dtype.
    optimizer: the optimizer's slots by the optimizer table (zoo.memory.optimizer_state: in the
        variables' dtype, factored statistics in float32); for Lion outside the fused step with
        float32 weights also the two momentum products its update computes ahead (`_ahead_bytes`).
    activations: what the forward pass keeps for the backward, and one block's working set.
    logits: float32 logits, their softmax and their gradient (one chunk of them when chunked); with
        LoRA on a quantized base, also the head's table as its matmul dequantizes it (zoo.memory.lora).
    saved_extra: the tensors TensorFlow keeps for the backward beyond the formula's (`SAVED_EXTRA`).
    head_gradient: the largest variable's gradient (the token embedding's, or the untied head's),
        made at the very start of the backward pass, while every activation is still alive.
    update: the optimizer update's temporaries (`_update_bytes`; with bfloat16 weights the float32
        update and its stochastic rounding, `ROUNDED_UPDATE`).
    recompute: under "full", the first block's working set when it is recomputed at the very
        end of the backward pass, while every other gradient exists (its activations, saved
        extras and the attention core's tiles); 0 under the other policies.
    fused: the update runs inside the backward pass (so its phases overlap).
    replay: under "full", the part of `activations` that is one block's replay (its activations and
        the attention core's tiles). The logits and the head's first gradient are gone before the
        first block is replayed, so the start of the backward pass holds the larger of the two, not
        both; 0 under the other policies.
    transient: with LoRA, the kernel-sized tensor the largest LoRA or quantized matmul makes on
        the fly (zoo.memory.lora), in both phases. With LoRA, weights are the frozen base as stored
        plus the adapters and a new head, and gradients, optimizer state and the update count
        those trainable variables only.
    reduce_buffer, block_reduce: with replicas (`estimate(replicas=N)`), the flat copy of the
        gradients the all-reduce packs them into (zoo.memory.replicas): all of them, or fused, the
        embedding's and head's at the end (`reduce_buffer`) and one block's (`block_reduce`).

    `total` is the peak of a step's two phases, on top of weights and optimizer state:
    the start of the backward pass (activations + saved_extra + logits + head_gradient; under
    "full", the logits and head gradient or one block's replay, whichever is larger)
    or its end and the update (all gradients + the update's temporaries + recompute),
    whichever is larger. With `fused` the update happens during the backward pass: the walk
    over the blocks holds the saved inputs and one recomputed block (`activations`,
    `saved_extra`) beside one block's gradients, the embedding's and head's (`gradients`, which
    include the head's first gradient) and that block's update temporaries (`block_update`);
    the embedding's and head's own update comes last, with `update`'s temporaries.
    """

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    saved_extra: int = 0
    head_gradient: int = 0
    update: int = 0
    recompute: int = 0
    fused: bool = False
    block_update: int = 0
    transient: int = 0
    reduce_buffer: int = 0
    block_reduce: int = 0
    replay: int = 0

    @property
    def backward_peak(self) -> int:
        loss = self.logits + self.head_gradient
        return self.activations - self.replay + max(loss, self.replay) + self.saved_extra + self.transient

    @property
    def update_peak(self) -> int:
        return self.gradients + self.update + self.recompute + self.transient

    @property
    def walk_peak(self) -> int:
        """Fused: block i recomputed, its gradients all-reduced, then updated (the logits are gone by then)."""
        return self.activations + self.saved_extra + self.gradients + max(self.block_update, self.block_reduce)

    @property
    def total(self) -> int:
        if self.fused:  # the start, the walk, and the embedding's and head's reduce and update at the end
            steps = max(self.backward_peak, self.walk_peak, self.gradients + max(self.update, self.reduce_buffer))
        else:  # with replicas, the all-reduce comes between the backward pass and the update
            steps = max(self.backward_peak, self.update_peak, self.gradients + self.reduce_buffer)
        return self.weights + self.optimizer + steps

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["fused"], out["block_update"], out["reduce_buffer"], out["block_reduce"], out["replay"]
        return {**out, "total": self.total}

    def table(self) -> str:
        rows = [(k, v) for k, v in self.as_dict().items()]
        return "\n".join(f"{k:12s} {v / GiB:8.2f} GiB" for k, v in rows)


def _activation_bytes(precision: str) -> int:
    return 4 if precision == "float32" else 2


def _variable_bytes(precision: str) -> int:
    """Bytes per variable element: mixed_* policies keep float32 variables."""
    return 2 if precision in ("bfloat16", "float16") else 4


# Float32 [B, heads, chunk, chunk] tiles alive at the peak of the chunked core's backward when its keys loop over
# several tiles (zoo.ops.attention_core._loop). Measured alone (dec-1b's 32 heads of 64, causal, tiles of 512,
# the core's allocator peak over its input gradients): 4.1 tiles' bytes at 4 x 1024 and 5.0 at 1 x 2048 in all,
# of which the input gradients and float32 output take about two; dropout 0.1 adds 1.3 (its keep mask, the
# dropped P). The block's replay adds its activations beside them (`per_layer_full`), which were already freed
# in part by then: 6 here (every tile the backward makes) over-planned dec-1b LoRA at 4 x 1024 by 12-18%.
TILES_ALIVE = 3
DROPOUT_TILES = 2
# Keys of one tile run as straight-line ops (no loop: zoo.ops.attention_core._loop), and the executor frees
# each tile after its last use. Measured at 8 x 512 on dec-1b (docs/memory.md): LoRA steps, whose peak is a
# block's replay, held ~2 tiles, and the (d)/(e) rows' over-prediction was ~4 tiles' bytes.
ONE_TILE_ALIVE = 2


def optimizer_state_bytes(optimizer: str, shapes, variable_bytes: int = 4, accumulation_steps: int = 1) -> int:
    """Bytes of the optimizer's slots for variables of `shapes` (zoo.memory.optimizer_state's table)."""
    return optimizer_state.state_bytes(optimizer, shapes, variable_bytes, accumulation_steps)


def loss_live_bytes(batch: int, sequence_length: int, vocab_size: int, chunk_size=None, trainable_head=True) -> int:
    """Float32 logits, softmax and gradient alive at once in the causal-LM loss (zoo.ops.lm_loss).

    chunk_size None: the loss's default chunk; 0: the whole sequence at once (unchunked).
    trainable_head False: a frozen head (LoRA), whose gradient nothing waits for.
    """
    chunk = chunk_size if chunk_size != 0 else sequence_length
    return lm_loss.live_bytes(batch, sequence_length, vocab_size, chunk, trainable_head)


# TensorFlow's own overhead ------------------------------------------------------
# Bytes per s·b·h element per layer that TensorFlow keeps for the backward pass beyond the
# formula's, measured with benchmarks/planner.py (none rows, chunked core): float32 copies made by
# the norms, GELU/SwiGLU, rotary positions and dropout that the 16-bit-activation formula does not
# count. By (family, float32 activations?). Issue 23's families are not measured yet: they borrow
# Llama's (decoders) or BERT's (ModernBERT) until benchmarks/planner.py runs on them.
SAVED_EXTRA = {("bert", True): 105, ("bert", False): 86, ("llama", True): 58, ("llama", False): 26}


def _held_masks(s, b, seq, core) -> float:
    """Under "full", each block's dropout masks held as bits to its backward (TransformerBlock.draw_masks):
    the two residual branches' and, where the replay runs the plain core, the attention's."""
    if not s.dropout:
        return 0
    return (2 * b * seq * s.hidden_dim + (b * s.num_heads * seq * seq if core == "plain" else 0)) / 8


def _saved_extra(s, b, seq, precision, policy) -> int:
    """Per layer kept (none, selective), or one block's while it is recomputed (full)."""
    measured = s.family if (s.family, True) in SAVED_EXTRA else "llama" if s.is_decoder else "bert"
    per_layer = SAVED_EXTRA[measured, precision == "float32"] * seq * b * s.hidden_dim
    return per_layer * (1 if policy == "full" else s.num_layers)


# With bfloat16 weights (zoo.optimizers' rounding) the update runs in float32 and is rounded into
# each bfloat16 variable: float32 copies of the largest variable alive at once in its update (its
# gradient and weight read in float32, each rounded slot's and the weight's new value, the random
# bits), with the global clip's bfloat16 copy of its gradient. Measured: one 8192 x 2048 variable,
# global clip 1.0, the least of five calls' allocator peaks, two runs: AdamW 6.0 and 7.0, Lion 5.25
# and 5.0, Adafactor 4.0 and 4.0 (docs/memory.md). In a whole step the largest variable's update holds
# less: llama3.2-3b's tied embedding (394M entries, the peak of its fused step at 1 x 2048) held 2.8 float32
# copies with Adafactor (docs/memory.md, Loading); 4 over-planned that step by 13%. Adafactor is counted at 3.
ROUNDED_UPDATE = {"adamw": 6, "lion": 5, "adafactor": 3}


def _update_bytes(shapes, vbytes, optimizer, fused=False, rounding=None) -> int:
    """The optimizer update's temporaries: with global clipping each gradient is replaced by
    its scaled copy, and the update computes each slot's new value before assigning it; TF's
    executor frees each as soon as it is used, so what is alive at once is about two tensors
    of the largest variable (the token embedding). SGD keeps only the scaled copy. Keras' Lion
    makes four (m·β1, g·(1-β1), m·β2, g·(1-β2)) before combining any; outside the fused step two
    of them were made ahead (`_ahead_bytes`). Measured on enc-base and dec-base (README)."""
    largest = max(count([shape]) for shape in shapes)
    name = optimizer.lower()
    if rounding:  # each rounded update waits for the previous one's writes (zoo.optimizers.rounding)
        return largest * 4 * ROUNDED_UPDATE[name]
    return largest * vbytes * (1 if name == "sgd" else 4 if name == "lion" and fused else 2)


def _ahead_bytes(params, vbytes, optimizer, fused, rounding=None) -> int:
    """Keras' Lion computes m·β1 and m·β2 from the momentum alone, so in Keras' own step (and
    `backbone_step`) TF's executor makes both for every variable when the step starts and holds
    them to the update: two more copies of the weights' size for the whole step (enc-base and
    dec-base measured 1.8-2.0). The fused update waits for each block's gradients, and a rounded
    update for its own gradient: none ahead."""
    return 2 * params * vbytes if optimizer.lower() == "lion" and not fused and not rounding else 0


def _family_extra_16(s, b, seq) -> int:
    """16-bit bytes a layer keeps beyond Korthikanti's 34·s·b·h (which assumes BERT's block), from the
    spec's fields: a gated FFN's third ffn-wide tensor (SwiGLU, GeGLU); sandwich norms' two more
    inputs; the Q/K norms' inputs; queries wider than the hidden size (head_dim x heads > hidden:
    the query and the attention output the formula counts at h)."""
    width = s.num_heads * s.head_dim
    extra = 2 * s.intermediate_dim if s.gated_ffn else 0
    extra += 4 * s.hidden_dim if s.norm_placement == "sandwich" else 0
    extra += 2 * (s.num_heads + s.num_kv_heads) * s.head_dim if s.qk_norm else 0
    extra += 4 * (width - s.hidden_dim) if width > s.hidden_dim else 0
    return seq * b * extra


def _packed_bytes(s, b, seq, precision) -> int:
    """What packed rows (ZooModel.set_packed) keep beyond an unpadded row of the same length: the rotary
    cos and sin per row, [B, S, 1, head_dim] each in the compute dtype instead of [1, S, 1, head_dim],
    kept to the backward; Grappler merges the identical computations of every layer's queries and keys,
    so one pair per distinct rotary setting (measured: +8.0-9.4 MiB for a predicted 8 MiB at b4 x s1024,
    head_dim 256, two layers, under "selective" and "full"); and the document runs, first and stop
    indices (int32 [B, S] each, zoo.ops.attention_core.document_spans). The plain core's [B, 1, S, S]
    bool mask the backward keeps is the one a 0/1 padding mask makes today; the document mask combined
    into it is transient (measured within ±1.5 MiB of 0 at the peak, for a 16 MiB mask at b4 x s2048)."""
    rotary = {(s.layer_rope_theta(i), s.layer_kind(i) == "global" and bool(s.rope_scaling))
              for i in range(s.num_layers)} if s.positions == "rope" else set()
    return len(rotary) * 2 * b * seq * s.head_dim * _activation_bytes(precision) + 3 * 4 * b * seq


def split_config(checkpointing, fused=False, accumulation_steps: int = 1) -> tuple:
    """(policy, fused) from a checkpointing policy or a `CONFIGS` name ("full+fused")."""
    if isinstance(checkpointing, str) and checkpointing.endswith("+fused"):
        checkpointing, fused = checkpointing[: -len("+fused")], True
    policy = policy_name(checkpointing)
    if fused:
        checks.fused(policy, accumulation_steps)
    return policy, bool(fused)


def estimate(spec, batch_size: int, sequence_length: int, precision: str | None = None,
             checkpointing="none", task=None, optimizer: str = "adamw", attention: str = "auto",
             chunk_size: int | None = None, fused: bool = False, loss_chunk: int | None = None,
             accumulation_steps: int = 1, weights_dtype: str = "float32", lora_rank: int | None = None,
             lora_targets=None, quantize: str | None = None, replicas: int = 1,
             packed: bool = False, preference: bool = False) -> MemoryEstimate:
    """Bytes one training step holds at its peak, by component: what the TF allocator's
    peak shows for a process that builds the model and the optimizer and trains.

    Args:
        spec: a registered model name or a `ModelSpec` (nothing is built).
        batch_size, sequence_length: the step's shape.
        precision: a dtype policy name ("float32", "mixed_bfloat16", ...); None: float32, or
            bfloat16 for bfloat16 weights.
        checkpointing: "none", "selective", "full", or a `CONFIGS` name ("full+fused").
        task: the task head; None: the family's default.
        optimizer: a row of the optimizer table (`OPTIMIZERS`): "adamw"/"adam" (two moments),
            "lion" (one), "adafactor" (zoo.optimizers': float32 row and column statistics
            only), "keras-adafactor" (a full-size velocity besides them) or "sgd".
        attention: the attention core, "auto" (default: as a model picks it, "plain" under
            "none" up to one chunk of positions, "chunked" otherwise), "chunked" or "plain".
        chunk_size: the chunked core's tile side; None: as the model picks it.
        fused: the optimizer step inside the backward pass, block by block (needs "full").
        loss_chunk: causal_lm only: positions per chunk of the LM loss; None: the default
            chunk, 0: the whole logits at once.
        accumulation_steps: micro-batches per update; above 1 the optimizer keeps one
            accumulator per variable.
        weights_dtype: "float32", or "bfloat16" (no float32 copy; zoo.optimizers' stochastic
            rounding: weights, gradients and full-size slots 2 bytes, the update in float32).
        lora_rank: LoRA adapters of this rank train, the rest is frozen (zoo.lora); None: all train.
        lora_targets: the adapted projections, as zoo.lora.enable_lora takes them (by the last
            part of their names here); None: PEFT's default.
        quantize: "int8" or "int4": the frozen base as Keras' Model.quantize stores it.
        replicas: data-parallel replicas; above 1 the all-reduce's packed copy of the gradients is
            counted too (zoo.memory.replicas). `batch_size` stays ONE replica's batch here.
        packed: rows pack several examples (ZooModel.set_packed): a packed row costs what an unpadded
            row of the same length does, plus `_packed_bytes` (rotary positions per row, document
            spans), counted in the activations.
        preference: a preference-tuning step (zoo.preference): `batch_size` counts PAIRS, and each is two
            rows (chosen, rejected) through the backbone and the chunked scores (the LM loss's chunks).
            The reference pass (LoRA's adapters off) runs before the policy's, without a tape, and keeps
            only [2 x pairs] scores: it adds nothing to the peak.

    Returns:
        A `MemoryEstimate` (bytes per component and `.total`).

    Example:
    >>> estimate("enc-1b", 4, 512, "mixed_bfloat16", "full").total / GiB
    >>> estimate("dec-1b", 8, 512, checkpointing="full+fused", optimizer="adafactor", weights_dtype="bfloat16")
    """
    s = registry.spec(spec)
    checks.positive("batch_size", batch_size)
    checks.positive("sequence_length", sequence_length)
    task = task or s.default_task
    precision, rounding = checks.weights(weights_dtype, precision, accumulation_steps=accumulation_steps,
                                         frozen=lora_rank is not None)
    optimizer_state.check_weights(optimizer, weights_dtype)
    policy, fused = split_config(checkpointing, fused, accumulation_steps)
    checks.lora(lora_rank, None, quantize, fused)
    if preference:
        if fused or task != "causal_lm" or packed:
            raise ValueError("preference=True plans zoo.preference's step: a causal LM's, without the fused update "
                             "or packed rows.")
        batch_size *= 2  # the chosen and the rejected row of each pair
    shapes = variable_shapes(s, task)
    params = count(shapes)
    vbytes = _variable_bytes(precision)
    block = block_shapes(s)
    block_params = count(block)

    check_core(attention)
    attention = resolve_core(attention, policy in ("none", "full"), sequence_length, chunk_size)  # as a model picks it
    b, seq, h, a = batch_size, sequence_length, s.hidden_dim, s.num_heads
    scale = _activation_bytes(precision) / 2  # the formula counts 16-bit activations
    per_layer_no_core = (seq * b * h * 34 + _family_extra_16(s, b, seq)) * scale
    if attention == "plain":
        per_layer_full = per_layer_no_core + seq * b * h * (5 * a * seq / h) * scale
        working = 0
    else:  # no s² term kept; float32 output and log-sum-exp saved; a few tiles alive in one layer
        per_layer_no_core += 4 * seq * b * h + 4 * a * seq * b
        per_layer_full = per_layer_no_core
        tile = min(seq, chunk_size or DEFAULT_CHUNK)
        looped = TILES_ALIVE + (DROPOUT_TILES if s.dropout else 0)
        working = (ONE_TILE_ALIVE if tile == seq else looped) * b * a * tile * tile * 4
    layers = s.num_layers
    replay = per_layer_full + working if policy == "full" else 0  # one block recomputed, its tiles included
    if policy == "none":
        activations = layers * per_layer_full + working
    elif policy == "selective":
        activations = layers * per_layer_no_core + working
    else:
        activations = layers * (2 * seq * b * h * scale + _held_masks(s, b, seq, attention)) + replay
    if packed:
        if not s.is_decoder:
            raise ValueError(f"packed=True: packed rows are for the decoders only (ZooModel.set_packed); "
                             f"{s.family} is an encoder family.")
        activations += _packed_bytes(s, b, seq, precision)
    logits = 0
    if loss_chunk is not None and task != "causal_lm":
        raise ValueError(f"loss_chunk applies to task 'causal_lm' only, not {task!r}.")
    if task == "causal_lm":
        logits = loss_live_bytes(b, seq, s.vocab_size, loss_chunk, trainable_head=lora_rank is None)
    elif task == "masked_lm":  # logits at the masked positions only, never chunked
        logits = 3 * b * int(seq * MASKED_FRACTION) * s.vocab_size * 4
    if fused:  # one block's gradients at a time, plus the embedding's and the head's, kept to the end
        gradients = (block_params + params - layers * block_params) * vbytes
    else:
        gradients = params * vbytes
    trained = dict(
        weights=params * vbytes, gradients=gradients,
        optimizer=optimizer_state_bytes(optimizer, shapes, vbytes, accumulation_steps)
        + _ahead_bytes(params, vbytes, optimizer, fused, rounding),
        head_gradient=max(count([shape]) for shape in shapes) * vbytes,
        update=_update_bytes(shapes, vbytes, optimizer, fused, rounding),
        block_update=_update_bytes(block, vbytes, optimizer, fused, rounding) if fused else 0,
    )
    if lora_rank is not None:
        trained = _lora(s, task, lora_rank, lora_targets, quantize, precision, optimizer, accumulation_steps)
        logits += trained.pop("head_transient")  # the quantized head, dequantized beside the logits
    if checks.positive("replicas", replicas) > 1:  # the all-reduce concatenates what it reduces into one buffer
        outer = trained["gradients"] - (block_params * vbytes if fused else 0)
        trained.update(reduce_buffer=outer, block_reduce=block_params * vbytes if fused else 0)
    return MemoryEstimate(
        activations=int(activations),
        logits=int(logits),
        saved_extra=int(_saved_extra(s, b, seq, precision, policy)),
        recompute=int(replay + _saved_extra(s, b, seq, precision, "full")) if policy == "full" else 0,
        replay=int(replay),
        fused=fused,
        **trained,
    )


def _lora(spec, task, rank, targets, quantize, precision, optimizer, accumulation_steps) -> dict:
    """The components LoRA changes: the frozen base as stored, and everything per trainable variable
    for the float32 adapters and a new head only (zoo.memory.lora)."""
    vbytes = _variable_bytes(precision)
    lo = lora_plan(spec, task, rank, targets, quantize, precision)
    sizes = [count([shape]) * 4 for shape in lo.adapter_shapes] + [count([shape]) * vbytes for shape in lo.head_shapes]
    params = count(lo.adapter_shapes) + count(lo.head_shapes)
    return dict(
        weights=lo.frozen + sum(sizes), gradients=sum(sizes),
        optimizer=optimizer_state_bytes(optimizer, lo.adapter_shapes, 4, accumulation_steps)
        + optimizer_state_bytes(optimizer, lo.head_shapes, vbytes, accumulation_steps)
        + _ahead_bytes(params, 4, optimizer, False),
        head_gradient=max(sizes), update=_update_bytes(lo.adapter_shapes + lo.head_shapes, 4, optimizer),
        transient=lo.transient, head_transient=lo.head_transient,
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
    checks.positive("budget_bytes", budget_bytes)
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


def choose(spec, batch_size: int, sequence_length: int, budget_bytes: int | None = None,
           precision: str | None = None, task=None, optimizer: str = "adamw", configs=CONFIGS,
           accumulation_steps: int = 1, weights_dtype: str = "float32", **kwargs) -> tuple:
    """What `checkpointing="auto"` picks: the first of `configs` (fastest first: none,
    selective, full, full+fused) whose estimate fits `budget_bytes`. Only the recomputation
    and the fused update are chosen: the optimizer and the weights' dtype stay the caller's.

    Args:
        spec: a registered model name or a `ModelSpec`.
        batch_size, sequence_length: the step's shape.
        budget_bytes: the memory to fit in; None: `default_budget()`.
        precision, task, optimizer, weights_dtype, **kwargs: as `estimate` takes them.
        configs: the configurations to try, in order.
        accumulation_steps: above 1, the fused configurations are left out (they cannot accumulate).

    Returns:
        (config name, its `MemoryEstimate`).

    Raises:
        ValueError: none fits; the message names the smallest estimate and what to change.

    Example:
    >>> choose("dec-1b", 1, 2048, 24 * GiB, "mixed_bfloat16")[0]
    """
    budget = default_budget() if budget_bytes is None else checks.positive("budget_bytes", budget_bytes)
    if accumulation_steps > 1:
        configs = [c for c in configs if not c.endswith("+fused")]
    estimates = {c: estimate(spec, batch_size, sequence_length, precision, c, task=task, optimizer=optimizer,
                             accumulation_steps=accumulation_steps, weights_dtype=weights_dtype, **kwargs)
                 for c in configs}
    for config, e in estimates.items():
        if e.total <= budget:
            return config, e
    smallest = min(estimates, key=lambda c: estimates[c].total)
    policy = checks.weights(weights_dtype, precision)[0]
    lighter = optimizer.lower() not in ("adafactor", "sgd")
    hints = [", a lighter optimizer (adafactor: factored statistics, no full-size state)"] if lighter else []
    hints += [", precision='mixed_bfloat16'"] if policy == "float32" else []
    if weights_dtype == "float32":
        hints.append(", bfloat16 weights (weights_dtype='bfloat16': stochastic rounding)")
    name = spec if isinstance(spec, str) else "the model"
    raise ValueError(
        f"No configuration of {name} fits a budget of {budget / GiB:.2f} GiB at batch {batch_size} x sequence "
        f"{sequence_length} ({policy}, {weights_dtype} weights, {optimizer}): the smallest estimate is "
        f"{estimates[smallest].total / GiB:.2f} GiB ({smallest}). Use a smaller batch or sequence{''.join(hints)}, "
        "or a larger budget.")
