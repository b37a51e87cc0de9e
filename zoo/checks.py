"""Configuration rules that every entry point shares: the model, the recipe, the planner and
the CLI call these, so a rule and its message live in one place. Pure Python."""

from zoo.shapes import LORA_DEFAULT_TARGETS


def positive(name: str, value):
    """`value`, refused unless it is a positive whole number (a batch, a length, a rank, a budget)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
    return value


def sequence_length(length: int, limit: int, model: str) -> int:
    """`length`, refused unless it is positive and within the `limit` of positions of `model` (a registered name, or
    words for a spec): `zoo train`, `zoo plan` and `zoo.memory.estimate` refuse the same lengths."""
    positive("sequence_length", length)
    if length > limit:
        raise ValueError(f"sequence_length={length} is above the {limit} positions of {model}; lower "
                         f"--sequence-length to at most {limit}.")
    return length


def global_batch(batch_size: int, replicas: int, where: str = "") -> int:
    """The slice of a global batch each of `replicas` replicas trains, refused unless it splits
    evenly (every replica's slice has the same size). `where` names the run, e.g. " of this mirrored run"."""
    if batch_size % replicas:
        low = batch_size - batch_size % replicas
        raise ValueError(
            f"--batch-size {batch_size} is the global batch and does not split over {replicas} replicas{where}: each "
            f"replica takes an equal slice, so it must be a multiple of {replicas}. Use --batch-size "
            f"{low + replicas}{f' or {low}' if low else ''}.")
    return batch_size // replicas


def fused(policy: str, accumulation_steps: int = 1):
    """Refuse what the fused update (zoo.training.fused) cannot train with. `policy` is the
    checkpointing policy ("auto" passes: the planner then picks a fused configuration)."""
    if policy not in ("full", "auto"):
        raise ValueError(
            f"The fused update needs checkpointing='full' (it recomputes each block from its saved input during "
            f"the backward pass); got {policy!r}. Use 'full' (model.set_checkpointing('full'); a recipe's "
            "checkpointing='full' or 'auto', `zoo train --checkpointing full`), or turn the fused update off "
            "(model.set_fused_update(False); drop fused / --fused).")
    if accumulation_steps > 1:
        raise ValueError(
            f"The fused update cannot be combined with gradient accumulation (accumulation_steps="
            f"{accumulation_steps}): it applies each block's gradients as soon as they exist, so there is no "
            "whole-step gradient to add up. Raise the batch size instead (the memory the fused update frees is "
            "meant for it), or turn the fused update off.")


WEIGHTS_DTYPES = ("float32", "bfloat16")
ROUNDINGS = ("stochastic", "nearest")


def rounding_name(value):
    """`value` if it is a known rounding of updates into bfloat16 weights (or None)."""
    if value is not None and value not in ROUNDINGS:
        raise ValueError(f"Unknown rounding {value!r}; known: 'stochastic' (bfloat16 weights; unbiased, the default) "
                         "and 'nearest' (loses every update below half a bfloat16 step; only for comparisons).")
    return value


def weights(weights_dtype: str = "float32", precision=None, rounding=None, accumulation_steps: int = 1,
            frozen: bool = False) -> tuple:
    """(the Keras dtype policy to build the model with, the rounding of its updates) for weights
    stored as `weights_dtype`, given the `precision` asked for (None: the weights decide).

    bfloat16 weights are Keras' pure "bfloat16" policy (variables and compute in bfloat16;
    "mixed_bfloat16" asks for the same compute, so it becomes "bfloat16"), updated in float32 and
    rounded stochastically unless "nearest" is asked for by name (docs/memory.md). `frozen`: the
    weights are a frozen LoRA base, so precision "bfloat16" may store them in bfloat16: nothing is
    rounded into them (zoo.lora's adapters are float32)."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"Unknown weights dtype {weights_dtype!r}; known: {', '.join(WEIGHTS_DTYPES)} "
                         "(bfloat16: no float32 copy, each update rounded stochastically).")
    rounding_name(rounding)
    if weights_dtype == "float32":
        if rounding is not None:
            raise ValueError(f"rounding={rounding!r} rounds updates into bfloat16 weights; float32 weights have "
                             "nothing to round. Drop rounding (--rounding), or add weights_dtype='bfloat16' "
                             "(--weights-dtype bfloat16).")
        if precision in ("bfloat16", "float16") and not (frozen and precision == "bfloat16"):
            raise ValueError(
                f"precision {precision!r} stores {precision} weights, but weights_dtype is 'float32'. Use "
                f"'mixed_{precision}' (float32 weights, {precision} compute), or weights_dtype='bfloat16' "
                "(--weights-dtype bfloat16) for bfloat16 weights updated with stochastic rounding.")
        return precision or "float32", None
    if precision not in (None, "bfloat16", "mixed_bfloat16"):
        raise ValueError(
            f"weights_dtype='bfloat16' cannot be combined with precision {precision!r}: bfloat16 weights compute in "
            "bfloat16 (Keras policy 'bfloat16'), and float16 or float32 compute with them is no Keras policy "
            "(mixed_float16's loss scaling assumes float32 weights). Use precision 'mixed_bfloat16' or 'bfloat16' "
            "(or none), or keep float32 weights (weights_dtype='float32') for mixed_float16.")
    if accumulation_steps > 1:
        raise ValueError(
            f"weights_dtype='bfloat16' cannot be combined with gradient accumulation (accumulation_steps="
            f"{accumulation_steps}): Keras keeps its accumulators in the weights' dtype and adds to them rounded to "
            "nearest. Use accumulation_steps=1 (--accumulation-steps 1) with a larger batch (the fused update frees "
            "memory for it), or train float32 weights.")
    return "bfloat16", rounding or "stochastic"


QUANTIZATION_MODES = ("int8", "int4")  # a frozen base through Keras' Model.quantize (zoo.quantization.quantize_base)
# The token tables (embeddings, and so a tied LM head; an untied head) of a quantized base, whatever its mode: int8
# with a scale per row, never 4-bit, as QLoRA leaves the embeddings and `lm_head` out of 4-bit (bitsandbytes). The
# head's logits decide the loss; the tables are a small part of the weights (docs/lora.md, Quantized base).
TABLE_MODE = "int8"


def layer_mode(mode, table) -> str | None:
    """The quantization mode of one layer of a base quantized in `mode`: TABLE_MODE for a token table."""
    return mode and (TABLE_MODE if table else mode)
# Floats of the largest slice of a layer quantized at once while loading (16 MiB in float32;
# zoo.quantization.quantize_into cuts larger layers, zoo.memory.loading plans with it).
QUANTIZE_SLICE = 2**22


def lora(rank, alpha=None, quantize=None, fused=False):
    """Refuse LoRA settings no entry point can train: rank and alpha must be positive, a quantized
    base is frozen, so it trains only with LoRA adapters on top (`rank` None: no LoRA), and the
    fused update has nothing to save with LoRA."""
    if quantize is not None and quantize not in QUANTIZATION_MODES:
        raise ValueError(f"Unknown quantization {quantize!r}; known: {', '.join(QUANTIZATION_MODES)}.")
    if rank is None:
        if quantize is not None:
            raise ValueError(f"quantize={quantize!r} trains nothing without LoRA: the quantized base is frozen "
                             "(Keras' integer kernels take no gradient). Add LoRA adapters (lora_rank, --lora-rank "
                             "16), or drop quantize (--quantize) to fine-tune the float weights.")
        if alpha is not None:
            raise ValueError("lora_alpha applies to LoRA only; set lora_rank (--lora-rank) too, or drop lora_alpha.")
        return
    positive("lora_rank", rank)
    if fused:
        lora_fused()
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0):
        raise ValueError(f"lora_alpha must be a positive number (the update is scaled by alpha / rank); got {alpha!r}.")


def lora_fused():
    """The fused update keeps the whole model's gradients from existing at once; LoRA's are the
    adapters' (dec-1b r16 on every projection: 48 MiB), so it would save at most that, and its exact
    global clip costs a second backward pass."""
    raise ValueError("The fused update is not combined with LoRA: it exists so that the whole model's gradients "
                     "never exist at once, and with LoRA only the adapters' (a few MiB) do; it would save at most "
                     "those, and its global clip adds a second backward pass. Train LoRA without it (drop fused / "
                     "--fused, model.set_fused_update(False)).")


# Why LoRA is refused on a family that is not in LORA_DEFAULT_TARGETS.
LORA_UNSUPPORTED = {
    "modernbert": "Hugging Face's ModernBERT fuses the query, key and value projections into one Wqkv and gate and "
                  "up into one Wi; PEFT adapts each fused Linear with one A·B pair, which Keras' LoRA on zoo's "
                  "separate kernels cannot hold or write back (and adapting only the Wo projections would be half "
                  "of it)",
}


def lora_family(family: str):
    """Refuse LoRA on a family whose Hugging Face projections zoo cannot adapt one for one (PEFT's
    names and shapes), rather than adapting part of them."""
    if family not in LORA_DEFAULT_TARGETS:
        reason = LORA_UNSUPPORTED.get(family, "zoo has no LoRA targets for it")
        raise ValueError(f"LoRA is not supported on the {family} family: {reason}. LoRA works on the "
                         f"{', '.join(LORA_DEFAULT_TARGETS)} families; fine-tune a {family} model in full (no "
                         "lora_rank / --lora-rank).")
