"""What LoRA and a quantized frozen base change in a step's memory: frozen weights at the size
Keras stores them, gradients and optimizer state for the adapters (and a new head) only, and the
kernel-sized tensor a LoRA or quantized matmul makes on the fly. docs/memory.md (LoRA) has the
model and its measurements.
"""

import math
from dataclasses import dataclass

from zoo import checks
from zoo.checks import layer_mode
from zoo.ops.quantized_head import slice_rows
from zoo.shapes import LORA_DEFAULT_TARGETS, count, variables

INT4_BLOCK = 128  # Keras' Int4QuantizationConfig default, which zoo.quantization.quantize_base uses
# Bytes per parameter of the largest projection a step holds on the fly, by what the layer computes
# (benchmarks/lora_keras_facts.py, table B): a float LoRA Dense merges W + s·A·B and takes its
# kernel-sized gradient x^T·dy (float32 sum and gradient; in pure bfloat16 also float32 copies); int8
# casts its kernel to the compute dtype; int4 unpacks to int8, dequantizes in float32 and casts.
TRANSIENT = {("float", False): 8, ("float", True): 18, "int8": 5, "int4": 9}
# A quantized decoder's LM head (zoo.ops.quantized_head) casts one slice of its int8 table at a time, at most
# quantized_head.SLICE_BYTES; an encoder's masked-LM head is Keras' int8 ReversibleEmbedding, which casts its whole
# table to the compute dtype for every logits matmul. (Before the tables were kept out of int4, Keras' int4 head
# dequantized its whole table in float32 in every loss chunk: llama3.1-8b's step 8.52 GiB, 1.96 GiB of it that table.)


def stored_bytes(tag, shape, quantize, variable_bytes) -> int:
    """Bytes Keras keeps for one frozen variable of the base (`zoo.shapes.variables` tags it):
    float at `variable_bytes`, or a quantized kernel / embedding in the layout Keras 3.15 creates:
    int8 values, or int4 packed two to a byte, with scales in the variable dtype (int4: one per
    block of 128 inputs, with zero points and a float32 input order `g_idx`). Token tables are int8
    under either mode (zoo.checks.TABLE_MODE)."""
    n, scale = count([shape]), variable_bytes
    if quantize is None or tag in (None, "classifier"):
        return n * variable_bytes
    if tag == "embedding":  # [rows, width] in int8 (zoo.checks.TABLE_MODE) with a scale per row
        return n + scale * shape[0]
    fan_in, fan_out = shape  # a Dense kernel, or an untied head's int8 reverse embedding [hidden, vocab]
    if layer_mode(quantize, tag == "lm_head") == "int8":
        return n + scale * fan_out
    blocks = math.ceil(fan_in / INT4_BLOCK) * fan_out
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
    head_transient: int = 0  # what a quantized LM head's logits matmul casts of its table, in the loss's phase


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
        compute = 4 if precision == "float32" else 2  # the compute dtype's bytes
        rows = slice_rows(spec.vocab_size, spec.hidden_dim, compute) if task == "causal_lm" else spec.vocab_size
        head = rows * spec.hidden_dim * compute
    return LoraPlan(frozen=frozen, adapter_shapes=adapters,
                    head_shapes=[shape for tag, shape in tagged if tag == "classifier"],
                    transient=largest * per_param, head_transient=head)
