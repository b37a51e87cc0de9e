"""The parts of a training step's memory, one function each: `weights`, `optimizer_state`,
`gradients`, `activations`, `loss` and `workspace`. Each reads a `Step` (the step's inputs, checked
and resolved by `zoo.memory.estimate`) and returns the `MemoryEstimate` fields it fills, in bytes;
`estimate` puts them together. The analytical model (Korthikanti et al. 2022's activations, plus what
TensorFlow keeps beyond them) and its measurements: docs/memory.md.
"""

from dataclasses import dataclass
from functools import cached_property

from zoo.memory import optimizer_state as optimizer_table
from zoo.memory.lora import LoraPlan
from zoo.ops import lm_loss
from zoo.ops.attention_core import DEFAULT_CHUNK
from zoo.ops.position_chunks import position_chunk
from zoo.registry import ModelSpec
from zoo.shapes import block_shapes, count, variable_shapes

MASKED_FRACTION = 0.15  # BERT's masked-LM rate: the positions a masked_lm head computes logits for


@dataclass(frozen=True)
class Step:
    """One training step as the parts read it; `estimate` checks and resolves its arguments into one.

    spec, task: the model and its head.
    batch: rows through the backbone at once, one replica's (a preference step's pairs x 2).
    sequence_length: positions per row.
    precision: the dtype policy ("float32", "mixed_bfloat16", "bfloat16").
    rounding: how updates are rounded into bfloat16 weights (zoo.optimizers); None: float32 weights.
    policy: the recomputation policy ("none", "selective", "full"); fused: the update inside the backward.
    attention: the attention core as the model picks it ("plain", "chunked"); chunk_size: its tile side
        (None: the core's default).
    loss_chunk: causal_lm: positions per chunk of the LM loss (None: the default chunk; 0: all at once).
    optimizer, accumulation_steps: the optimizer table's row, and micro-batches per update.
    lora: what LoRA and a quantized base change (zoo.memory.lora.plan); None: every variable trains.
    replicas: data-parallel replicas (zoo.memory.replicas).
    packed: rows pack several examples (ZooModel.set_packed).
    completion_length: a GRPO step (zoo.grpo): the last `completion_length` of each row's positions are the
        sampled completion, scored a chunk at a time, and sampled first with the key/value cache; None: no GRPO.
    """

    spec: ModelSpec
    task: str
    batch: int
    sequence_length: int
    precision: str = "float32"
    rounding: str | None = None
    policy: str = "none"
    fused: bool = False
    attention: str = "plain"
    chunk_size: int | None = None
    loss_chunk: int | None = None
    optimizer: str = "adamw"
    accumulation_steps: int = 1
    lora: LoraPlan | None = None
    replicas: int = 1
    packed: bool = False
    completion_length: int | None = None

    @cached_property
    def shapes(self) -> list:
        """Every variable's shape (the task head's included)."""
        return variable_shapes(self.spec, self.task)

    @cached_property
    def block(self) -> list:
        """One transformer block's variables' shapes."""
        return block_shapes(self.spec)

    @property
    def variable_bytes(self) -> int:
        return _variable_bytes(self.precision)


# The parts ---------------------------------------------------------------------


def weights(step: Step) -> dict:
    """The variables: all of them at the variables' size; with LoRA, the frozen base as Keras stores it
    (float, or int8 / int4 with their scales: zoo.memory.lora) plus the float32 adapters and a new head."""
    return {"weights": (step.lora.frozen if step.lora else 0) + sum(_trained_sizes(step))}


def optimizer_state(step: Step) -> dict:
    """The optimizer's slots for what trains (zoo.memory.optimizer_state's table: in the variables' dtype,
    factored statistics in float32; with LoRA, the float32 adapters' and a new head's), and for Lion outside
    the fused step with float32 weights the two momentum products its update computes ahead (`_ahead_bytes`)."""
    vbytes, name, micro = step.variable_bytes, step.optimizer, step.accumulation_steps
    if step.lora is None:
        return {"optimizer": optimizer_state_bytes(name, step.shapes, vbytes, micro)
                + _ahead_bytes(count(step.shapes), vbytes, name, step.fused, step.rounding)}
    adapters, head = step.lora.adapter_shapes, step.lora.head_shapes
    state = optimizer_state_bytes(name, adapters, 4, micro) + optimizer_state_bytes(name, head, vbytes, micro)
    return {"optimizer": state + _ahead_bytes(count(adapters) + count(head), 4, name, False)}


def gradients(step: Step) -> dict:
    """`gradients`: those alive at once, in the trained variables' dtype: all of them, or fused, one block's
    plus the embedding's and the head's, kept to the end. `head_gradient`: the largest variable's (the token
    embedding's or the untied head's), made at the very start of the backward, while every activation lives."""
    sizes = _trained_sizes(step)
    alive = sum(sizes)
    if step.fused:
        alive -= (step.spec.num_layers - 1) * count(step.block) * step.variable_bytes
    return {"gradients": alive, "head_gradient": max(sizes)}


def activations(step: Step) -> dict:
    """What the forward keeps for the backward (Korthikanti et al.'s 16-bit formula, scaled to the compute
    dtype, with the family's extra tensors and the attention core's own), by policy:

    `activations`: every layer's ("none"), every layer's without the core ("selective"), or each block's
    input and held dropout masks plus one block's replay ("full"); with one layer's working set of score
    tiles, and packed rows' extras (`_packed_bytes`). `saved_extra`: what TensorFlow keeps beyond the
    formula (`SAVED_EXTRA`), per layer, or under "full" one block's. `replay`: under "full", one block
    recomputed, its tiles included. `recompute`: under "full", the first block's working set at the very
    end of the backward, while every other gradient exists."""
    s, b, seq, precision, policy = step.spec, step.batch, step.sequence_length, step.precision, step.policy
    h, a = s.hidden_dim, s.num_heads
    scale = _activation_bytes(precision) / 2  # the formula counts 16-bit activations
    per_layer_no_core = (seq * b * h * 34 + _family_extra_16(s, b, seq)) * scale
    if step.attention == "plain":
        per_layer_full = per_layer_no_core + seq * b * h * (5 * a * seq / h) * scale
        working = 0
    else:  # no s² term kept; float32 output and log-sum-exp saved; a few tiles alive in one layer
        per_layer_no_core += 4 * seq * b * h + 4 * a * seq * b
        per_layer_full = per_layer_no_core
        tile = min(seq, step.chunk_size or DEFAULT_CHUNK)
        looped = TILES_ALIVE + (DROPOUT_TILES if s.dropout else 0)
        working = (ONE_TILE_ALIVE if tile == seq else looped) * b * a * tile * tile * 4
    layers = s.num_layers
    # One block recomputed, its tiles included; a long sequence's MLP replayed a chunk of positions at a time.
    chunk = position_chunk(seq, s.intermediate_dim)
    replay = per_layer_full - (_mlp_16(s, b, seq) - _mlp_16(s, b, chunk)) * scale + working if policy == "full" else 0
    if policy == "none":
        kept = layers * per_layer_full + working
    elif policy == "selective":
        kept = layers * per_layer_no_core + working
    else:
        kept = layers * (2 * seq * b * h * scale + _held_masks(s, b, seq, step.attention)) + replay
    if step.packed:
        kept += _packed_bytes(s, b, seq, precision)
    return {"activations": int(kept), "saved_extra": int(_saved_extra(s, b, seq, precision, policy)),
            "replay": int(replay),
            "recompute": int(replay + _saved_extra(s, b, seq, precision, "full")) if policy == "full" else 0}


def loss(step: Step) -> dict:
    """`logits`: float32 logits, their softmax and their gradient alive at once (one chunk of them when the
    causal-LM loss is chunked; a masked LM's at the masked positions only); with LoRA on a quantized base,
    also the head's table as its matmul dequantizes it (zoo.memory.lora). A GRPO step's chunks are its
    completion's positions, scored as the loss scores them: the entropy TRL logs adds one row's [chunk, vocab]
    temporary before the chunk's cross-entropy, beside the logits alone (zoo.ops.preference._entropy), below
    the chunk's peak (measured at dec-base's shape: the update's peak with and without it equal)."""
    s, b, seq = step.spec, step.batch, step.completion_length or step.sequence_length  # GRPO scores completions
    logits = 0
    if step.task == "causal_lm":
        logits = loss_live_bytes(b, seq, s.vocab_size, step.loss_chunk, trainable_head=step.lora is None)
    elif step.task == "masked_lm":  # never chunked
        logits = 3 * b * int(seq * MASKED_FRACTION) * s.vocab_size * 4
    if step.lora:
        logits += step.lora.head_transient
    return {"logits": int(logits)}


def workspace(step: Step) -> dict:
    """The temporaries of one phase. `update`: the optimizer update's (`_update_bytes`); fused,
    `block_update`: one block's. `transient`: with LoRA, the kernel-sized tensor the largest LoRA or
    quantized matmul makes on the fly (zoo.memory.lora). With replicas, the flat copy of the gradients
    the all-reduce packs them into (zoo.memory.replicas): `reduce_buffer` all of them, or fused, the
    embedding's and head's at the end, and `block_reduce` one block's."""
    vbytes, name = step.variable_bytes, step.optimizer
    if step.lora is None:
        update = _update_bytes(step.shapes, vbytes, name, step.fused, step.rounding)
        block_update = _update_bytes(step.block, vbytes, name, step.fused, step.rounding) if step.fused else 0
        transient = 0
    else:  # the float32 adapters and a new head, never fused nor rounded
        update = _update_bytes(step.lora.adapter_shapes + step.lora.head_shapes, 4, name)
        block_update, transient = 0, step.lora.transient
    reduce_buffer = block_reduce = 0
    if step.replicas > 1:  # the all-reduce concatenates what it reduces into one buffer
        block_reduce = count(step.block) * vbytes if step.fused else 0
        reduce_buffer = gradients(step)["gradients"] - block_reduce
    return {"update": update, "block_update": block_update, "transient": transient,
            "reduce_buffer": reduce_buffer, "block_reduce": block_reduce}


def generation(step: Step) -> dict:
    """A GRPO step's sampling, before its update (zoo.grpo.sample, zoo.generation's cached loop), on top of the
    weights and optimizer state: the key/value cache ([rows, 2, prompt + completion, KV heads, head_dim] per
    block, in the compute dtype) and one block's cache more while the loop replaces it, the prefill's logits
    ([rows, prompt, vocab], float32 beside the compute dtype's), and with LoRA the kernel-sized tensor the largest
    LoRA or quantized matmul makes on the fly and the head's dequantized table (zoo.memory.lora)."""
    if not step.completion_length:
        return {"generation": 0}
    s, rows, seq, act = step.spec, step.batch, step.sequence_length, _activation_bytes(step.precision)
    block_cache = rows * 2 * seq * s.num_kv_heads * s.head_dim * act
    prompt = seq - step.completion_length
    prefill = rows * prompt * s.vocab_size * (4 + act)
    transient = step.lora.transient + step.lora.head_transient if step.lora else 0
    return {"generation": (s.num_layers + 1) * block_cache + prefill + transient}


PARTS = (weights, optimizer_state, gradients, activations, loss, workspace, generation)


# What the parts share ------------------------------------------------------------


def _trained_sizes(step: Step) -> list:
    """Bytes of each trained variable: every variable in the variables' dtype, or with LoRA the float32
    adapters and a new head."""
    vbytes = step.variable_bytes
    if step.lora is None:
        return [count([shape]) * vbytes for shape in step.shapes]
    return ([count([shape]) * 4 for shape in step.lora.adapter_shapes]
            + [count([shape]) * vbytes for shape in step.lora.head_shapes])


def _activation_bytes(precision: str) -> int:
    return 4 if precision == "float32" else 2


def _variable_bytes(precision: str) -> int:
    """Bytes per variable element: mixed_* policies keep float32 variables."""
    return 2 if precision in ("bfloat16", "float16") else 4


def optimizer_state_bytes(optimizer: str, shapes, variable_bytes: int = 4, accumulation_steps: int = 1) -> int:
    """Bytes of the optimizer's slots for variables of `shapes` (zoo.memory.optimizer_state's table)."""
    return optimizer_table.state_bytes(optimizer, shapes, variable_bytes, accumulation_steps)


def loss_live_bytes(batch: int, sequence_length: int, vocab_size: int, chunk_size=None, trainable_head=True) -> int:
    """Float32 logits, softmax and gradient alive at once in the causal-LM loss (zoo.ops.lm_loss).

    chunk_size None: the loss's default chunk; 0: the whole sequence at once (unchunked).
    trainable_head False: a frozen head (LoRA), whose gradient nothing waits for.
    """
    chunk = chunk_size if chunk_size != 0 else sequence_length
    return lm_loss.live_bytes(batch, sequence_length, vocab_size, chunk, trainable_head)


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


def _mlp_16(s, b, positions) -> int:
    """The 16-bit bytes the formula counts for a layer's MLP over `positions` a row: Korthikanti's 16·s·b·h of
    its two wide tensors, and a gated MLP's third (`_family_extra_16`). Under "full" a sequence longer than the
    MLP's chunk (zoo.ops.position_chunks) replays a chunk's."""
    return positions * b * (16 * s.hidden_dim + _gated_third_16(s))


def _gated_third_16(s) -> int:
    """16-bit bytes a position of a gated MLP (SwiGLU, GeGLU) keeps beyond the formula's two ffn-wide tensors."""
    return 2 * s.intermediate_dim if s.gated_ffn else 0


def _family_extra_16(s, b, seq) -> int:
    """16-bit bytes a layer keeps beyond Korthikanti's 34·s·b·h (which assumes BERT's block), from the
    spec's fields: a gated FFN's third ffn-wide tensor (SwiGLU, GeGLU); sandwich norms' two more
    inputs; the Q/K norms' inputs; queries wider than the hidden size (head_dim x heads > hidden:
    the query and the attention output the formula counts at h)."""
    width = s.num_heads * s.head_dim
    extra = _gated_third_16(s)
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
