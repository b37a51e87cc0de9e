"""What LoRA and a quantized frozen base change in a step's memory: frozen weights at the size
Keras stores them, gradients and optimizer state for the adapters (and a new head) only, and the
kernel-sized tensor a LoRA or quantized matmul makes on the fly. docs/memory.md (LoRA) has the
model and its measurements.
"""

import math
from dataclasses import dataclass

from zoo import checks
from zoo.shapes import LORA_DEFAULT_TARGETS, count, variables

INT4_BLOCK = 128  # Keras' Int4QuantizationConfig default, which zoo.quantization.quantize_base uses
# Bytes per parameter of the largest projection a step holds on the fly, by what the layer computes
# (benchmarks/lora_keras_facts.py, table B): a float LoRA Dense merges W + s·A·B and takes its
# kernel-sized gradient x^T·dy (float32 sum and gradient; in pure bfloat16 also float32 copies); int8
# casts its kernel to the compute dtype; int4 unpacks to int8, dequantizes in float32 and casts.
TRANSIENT = {("float", False): 8, ("float", True): 18, "int8": 5, "int4": 9}
# Bytes per parameter of a quantized LM head's table (the tied embedding, or an untied head) that its logits
# matmul makes on the fly, beside the loss's chunk of logits: Keras' int4 ReversibleEmbedding unpacks the table
# to int8 and dequantizes it before every matmul (keras/src/layers/core/reversible_embedding.py, `_int4_call`);
# int8 casts it. Measured, QLoRA r16 all-linear at mixed_bfloat16, allocator peak against the plan with it:
# llama3.1-8b (128256 x 4096) 1 x 2048 8.52 GiB against 8.65, llama3.2-3b (tied) 4.80 against 5.03, dec-1b
# (32000 x 2048) 8 x 512 2.24 against 2.08 and 1 x 2048 (loss chunks of 1024) 1.30 against 1.56. Two bytes (the
# compute dtype alone) planned the first three 11-14% low. int8's is the cast alone, not measured.
HEAD_TRANSIENT = {"int8": 2, "int4": 4}


def stored_bytes(tag, shape, quantize, variable_bytes) -> int:
    """Bytes Keras keeps for one frozen variable of the base (`zoo.shapes.variables` tags it):
    float at `variable_bytes`, or a quantized kernel / embedding in the layout Keras 3.15 creates:
    int8 values, or int4 packed two to a byte, with scales in the variable dtype (int4: one per
    block of 128 inputs, with zero points and a float32 input order `g_idx`)."""
    n, scale = count([shape]), variable_bytes
    if quantize is None or tag in (None, "classifier"):
        return n * variable_bytes
    if tag == "embedding":  # [rows, width]: per-row scales, int4 blocks along the width
        rows, width = shape
        if quantize == "int8":
            return n + scale * rows
        return rows * math.ceil(width / 2) + rows * math.ceil(width / INT4_BLOCK) * (scale + 1) + 4 * width
    fan_in, fan_out = shape  # a Dense kernel, or an untied head's reverse embedding [hidden, vocab]
    if quantize == "int8":
        return n + scale * fan_out
    blocks = math.ceil(fan_in / INT4_BLOCK) * fan_out
    if tag == "lm_head":  # packed along the hidden axis; zero points in the variable dtype; no g_idx
        return math.ceil(fan_in / 2) * fan_out + blocks * 2 * scale
    return fan_in * math.ceil(fan_out / 2) + blocks * (scale + 1) + 4 * fan_in  # int8 zero points


def targeted(spec, task, targets) -> list:
    """The (in, out) shapes of the projections LoRA adapts. Targets by the last part of their name
    (PEFT's suffix rule, read on names alone); "all-linear", or any other string (a regular
    expression zoo.lora would match on full names), counts every projection: an upper bound."""
    kernels = [(tag, shape) for tag, shape in variables(spec, task)
               if len(shape) == 2 and tag not in (None, "embedding", "lm_head", "classifier")]
    if targets is None:
        targets = LORA_DEFAULT_TARGETS[spec.family]
    if isinstance(targets, str):
        return [shape for _, shape in kernels]
    short = {t.rsplit(".", 1)[-1] for t in targets}
    return [shape for tag, shape in kernels if tag in short]


@dataclass(frozen=True)
class LoraPlan:
    frozen: int  # bytes of the frozen base as stored
    adapter_shapes: list  # float32 A [in, r] and B [r, out] of every targeted projection
    head_shapes: list  # a new task head's variables (a classifier), trained in full
    transient: int  # the largest kernel-sized tensor a LoRA or quantized matmul makes on the fly
    head_transient: int = 0  # a quantized LM head's table as its logits matmul makes it, in the loss's phase


def plan(spec, task, rank, targets=None, quantize=None, precision="float32") -> LoraPlan:
    """What a LoRA step on `spec` holds beside the activations (see the module docstring)."""
    checks.lora(rank, None, quantize)
    checks.lora_family(spec.family)
    vbytes = 2 if precision in ("bfloat16", "float16") else 4
    tagged = variables(spec, task)
    frozen = sum(stored_bytes(tag, shape, quantize, vbytes) for tag, shape in tagged if tag != "classifier")
    adapted = targeted(spec, task, targets)
    adapters = [s for fan_in, fan_out in adapted for s in ((fan_in, rank), (rank, fan_out))]
    if quantize:  # every quantized Dense dequantizes, targeted or not
        largest = max(count([shape]) for tag, shape in tagged if len(shape) == 2 and tag not in
                      (None, "embedding", "lm_head", "classifier"))
        per_param = TRANSIENT[quantize]
    else:
        largest = max((count([shape]) for shape in adapted), default=0)
        per_param = TRANSIENT["float", precision == "bfloat16"]
    head = 0
    if quantize and task in ("causal_lm", "masked_lm"):  # the logits come from the token table, tied or not
        head = spec.vocab_size * spec.hidden_dim * HEAD_TRANSIENT[quantize]
    return LoraPlan(frozen=frozen, adapter_shapes=adapters,
                    head_shapes=[shape for tag, shape in tagged if tag == "classifier"],
                    transient=largest * per_param, head_transient=head)
