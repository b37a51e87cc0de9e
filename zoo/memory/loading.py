"""What loading a checkpoint takes (`zoo.hub.load`), before anything is built: the model as stored,
plus what one tensor (or, quantized, one slice of a layer) holds on its way in, plus the runtime.
docs/memory.md (Loading) has the model and its measurements (benchmarks/big_models.py).

A float model takes each tensor as read (its file dtype, numpy) and cast to the variable's. A decoder
loaded with `quantize=` is built quantized, and each layer goes through float twins of at most
`QUANTIZE_SLICE` floats that Keras' own quantizer reads (zoo.quantization.quantize_into), each twin filled from
the checkpoint's rows it covers: the rows as read, their cast copy, the twin's variables and Keras'
quantizer's numpy work on them. An encoder with `quantize=` loads in float and is quantized after
(zoo.quantization.quantize_base), so it holds the float model as well.
"""

from dataclasses import dataclass

from zoo import registry
from zoo.checks import QUANTIZATION_MODES, QUANTIZE_SLICE
from zoo.memory import budget
from zoo.memory.lora import stored_bytes
from zoo.shapes import count, variables

FILE_BYTES = 2  # bfloat16 checkpoints, as published
# What a slice on its way through Keras' quantizer holds (the rows read, their cast copy, the twin's
# variables, the quantizer's temporaries, allocator slack): a fixed part and bytes per float of the slice,
# fitted to dec-1b int4 from mixed_bfloat16 loaded with slices of 4M and 16M floats (peak RSS 1.62 and
# 1.89 GiB; benchmarks/big_models.py --slice, docs/memory.md).
SLICE_FIXED = int(0.27 * 2**30)
SLICE_BYTES = 23
# What the built quantized model takes beyond its variables' bytes (Keras' and TensorFlow's objects and
# allocator slack per variable): fitted to llama3.2-3b int4 (peak RSS 2.97-3.10 GiB); dec-1b is then
# planned at 1.74 GiB against 1.61 measured (+8%).
MODEL_OVERHEAD = 0.22
RUNTIME = int(0.70 * 2**30)  # TensorFlow, Keras and Python in a fresh process, before the model (measured)


@dataclass(frozen=True)
class LoadingPlan:
    model: int  # the model as stored (quantized kernels and embeddings at Keras' layout)
    transient: int  # the largest tensor (float), or a slice on its way in and the built model's overhead
    float_model: int  # a float copy of the model held during loading (an encoder quantized after loading)
    runtime: int

    @property
    def total(self) -> int:
        return self.model + self.transient + self.float_model + self.runtime

    def as_dict(self) -> dict:
        return {"model": self.model, "transient": self.transient, "float model": self.float_model,
                "runtime": self.runtime, "total": self.total}


def _variable_bytes(precision) -> int:
    return 2 if precision in ("bfloat16", "float16") else 4


def loading_plan(spec, task=None, quantize=None, precision="float32") -> LoadingPlan:
    """What `zoo.hub.load(folder, dtype=precision, quantize=quantize)` of a `spec`-shaped bfloat16
    checkpoint peaks at (resident memory, the runtime included)."""
    spec = registry.spec(spec)
    vbytes = _variable_bytes(precision)
    tagged = variables(spec, task)
    model = sum(stored_bytes(tag, shape, quantize, vbytes) for tag, shape in tagged)
    if quantize is None:
        largest = max(count([shape]) for _, shape in tagged)
        return LoadingPlan(model, largest * (FILE_BYTES + vbytes), 0, RUNTIME)
    layers = [count([shape]) for tag, shape in tagged if tag not in (None, "classifier", "lm_head")]
    untied_head = [count([shape]) for tag, shape in tagged if tag == "lm_head"]
    if untied_head:  # the head's reverse table is quantized in one call with the token embedding
        layers.append(untied_head[0] + count([(spec.vocab_size, spec.hidden_dim)]))
    transient = SLICE_FIXED + min(max(layers), QUANTIZE_SLICE) * SLICE_BYTES + int(MODEL_OVERHEAD * model)
    float_model = 0 if spec.is_decoder else sum(count([shape]) for _, shape in tagged) * vbytes
    return LoadingPlan(model, transient, float_model, RUNTIME)


def loading_peak(spec, task=None, quantize=None, precision="float32") -> int:
    """`loading_plan(...).total`: bytes."""
    return loading_plan(spec, task, quantize, precision).total


class DoesNotFit(MemoryError):
    """A load this machine's memory cannot hold, refused before anything is read."""


def check_loading_fits(spec, task=None, quantize=None, precision="float32", available=None, label="this checkpoint"):
    """Refuse (`DoesNotFit`) a load whose plan needs more than the memory available now, with the settings that
    would fit: better than the kernel killing the process halfway through. The plan's runtime is already resident
    in this process, so what loading adds is compared with what is free."""
    spec = registry.spec(spec)
    available = budget.available_bytes() if available is None else available

    def need(q, p):
        plan = loading_plan(spec, task, q, p)
        return plan.total - plan.runtime

    needed = need(quantize, precision)
    if needed <= available:
        return
    # each quantization at the asked dtype, and the float model in bfloat16
    settings = dict.fromkeys([(q, precision) for q in (None, *QUANTIZATION_MODES)] + [(None, "bfloat16")])
    options = sorted((need(q, p), q, p) for q, p in settings if (q, p) != (quantize, precision))
    fits = [f"quantize={q!r}, dtype={p!r}: {n / 2**30:.2f} GiB" for n, q, p in options if n <= available]
    hint = ("Settings that fit: " + "; ".join(fits) + ".") if fits else (
        "No quantization or dtype fits; free memory, or use a machine with more.")
    raise DoesNotFit(f"Loading {label} with quantize={quantize!r}, dtype={precision!r} needs "
                     f"about {needed / 2**30:.2f} GiB (zoo.memory.loading_plan) and {available / 2**30:.2f} GiB is "
                     f"available now. {hint} (check_memory=False loads anyway.)")
