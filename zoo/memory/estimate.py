"""What a training step will take, before anything is built: `estimate` checks and resolves a
step's arguments into a `Step` and puts together its parts (zoo.memory.parts: weights, optimizer
state, gradients, activations, loss, workspace), explained with their measurements in
docs/memory.md. An estimate, meant to rank choices and to refuse a run that cannot fit;
benchmarks/planner.py measures it against the allocator. `largest_batch` and `choose` search with it.
"""

from dataclasses import asdict, dataclass

from zoo import checks, registry
from zoo.memory import optimizer_state, parts
from zoo.memory.budget import default_budget
from zoo.memory.lora import plan as lora_plan
from zoo.memory.parts import ROUNDED_UPDATE as ROUNDED_UPDATE  # its old home, which tests/zoo/test_memory.py names
from zoo.ops.attention_core import check_core, resolve_core
from zoo.ops.recompute import policy_name

GiB = 1024**3

# What `checkpointing="auto"` tries, fastest first.
CONFIGS = ("none", "selective", "full", "full+fused")


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
    generation: a GRPO step's sampling with the key/value cache (zoo.memory.parts.generation), a phase of its
        own before the update; 0 for other steps.
    reduce_buffer, block_reduce: with replicas (`estimate(replicas=N)`), the flat copy of the
        gradients the all-reduce packs them into (zoo.memory.replicas): all of them, or fused, the
        embedding's and head's at the end (`reduce_buffer`) and one block's (`block_reduce`).

    Each field comes from one part (zoo.memory.parts): `weights`; `optimizer_state` the optimizer;
    `gradients` the gradients and head_gradient; `activations` the activations, saved_extra, replay
    and recompute; `loss` the logits; `workspace` the update, block_update, transient, reduce_buffer
    and block_reduce.

    `total` is the peak of a step's two phases (with GRPO three: its sampling first), on top of weights and
    optimizer state:
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
    generation: int = 0

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
        return self.weights + self.optimizer + max(steps, self.generation)

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["fused"], out["block_update"], out["reduce_buffer"], out["block_reduce"], out["replay"]
        if not self.generation:  # a column of GRPO's plans only
            del out["generation"]
        return {**out, "total": self.total}

    def table(self) -> str:
        rows = [(k, v) for k, v in self.as_dict().items()]
        return "\n".join(f"{k:12s} {v / GiB:8.2f} GiB" for k, v in rows)


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
             packed: bool = False, preference: bool = False, grpo: int | None = None,
             completion_length: int | None = None) -> MemoryEstimate:
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
            row of the same length does, plus the rotary positions per row and the document spans,
            counted in the activations (zoo.memory.parts.activations).
        preference: a preference-tuning step (zoo.preference): `batch_size` counts PAIRS, and each is two
            rows (chosen, rejected) through the backbone and the chunked scores (the LM loss's chunks).
            The reference pass (LoRA's adapters off) runs before the policy's, without a tape, and keeps
            only [2 x pairs] scores: it adds nothing to the peak.
        grpo: a GRPO step (zoo.grpo) with this many completions of each prompt (G): `batch_size` counts prompts,
            and `sequence_length` is prompt + completion. The step samples the batch x G rows with the
            key/value cache first (`generation`), scores the reference (the adapters off) and the sampling
            policy without a tape (they keep [rows, completion] log-probabilities: nothing at the peak), then
            trains on the rows with the completions' log-probabilities a chunk of positions at a time.
        completion_length: with `grpo`, the completion's positions (max_completion_length).

    Returns:
        A `MemoryEstimate` (bytes per component and `.total`).

    Example:
    >>> estimate("enc-1b", 4, 512, "mixed_bfloat16", "full").total / GiB
    >>> estimate("dec-1b", 8, 512, checkpointing="full+fused", optimizer="adafactor", weights_dtype="bfloat16")
    """
    s = registry.spec(spec)
    checks.positive("batch_size", batch_size)
    checks.sequence_length(sequence_length, s.max_sequence_length, repr(spec) if isinstance(spec, str) else "this spec")
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
    if grpo is not None:
        _check_grpo(grpo, completion_length, sequence_length, task != "causal_lm" or packed or preference)
        batch_size *= grpo  # G completions of each prompt
    elif completion_length is not None:
        raise ValueError("completion_length plans a GRPO step: pass grpo=G (completions per prompt) too.")
    check_core(attention)
    if packed and not s.is_decoder:
        raise ValueError(f"packed=True: packed rows are for the decoders only (ZooModel.set_packed); "
                         f"{s.family} is an encoder family.")
    if loss_chunk is not None and task != "causal_lm":
        raise ValueError(f"loss_chunk applies to task 'causal_lm' only, not {task!r}.")
    lora = None if lora_rank is None else lora_plan(s, task, lora_rank, lora_targets, quantize, precision)
    core = resolve_core(attention, policy in ("none", "full"), sequence_length, chunk_size)  # as a model picks it
    return assemble(parts.Step(
        spec=s, task=task, batch=batch_size, sequence_length=sequence_length, precision=precision,
        rounding=rounding, policy=policy, fused=fused, attention=core, chunk_size=chunk_size, loss_chunk=loss_chunk,
        optimizer=optimizer, accumulation_steps=accumulation_steps, lora=lora,
        replicas=checks.positive("replicas", replicas), packed=packed, completion_length=completion_length))


def _check_grpo(generations, completion_length, sequence_length, other_kind):
    if other_kind:
        raise ValueError("grpo= plans zoo.grpo's step: a causal LM's, without packed rows or preference pairs.")
    if isinstance(generations, bool) or not isinstance(generations, int) or generations < 2:
        raise ValueError(f"grpo (completions per prompt, G) must be an integer >= 2, got {generations!r}.")
    if (isinstance(completion_length, bool) or not isinstance(completion_length, int)
            or not 0 < completion_length < sequence_length):
        raise ValueError(f"grpo= needs completion_length, the completion's positions, an integer between 1 and "
                         f"sequence_length - 1 ({sequence_length - 1}): sequence_length is prompt + completion; got "
                         f"{completion_length!r}.")


def assemble(step: parts.Step) -> MemoryEstimate:
    """A step's estimate: the fields each of its parts fills (`zoo.memory.parts.PARTS`)."""
    fields = {field: size for part in parts.PARTS for field, size in part(step).items()}
    return MemoryEstimate(fused=step.fused, **fields)


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
