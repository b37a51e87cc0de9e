"""What the machine sees of a training step (the process's peak RSS), beside what TensorFlow's allocator holds
(`estimate`): the kernel kills a process by its RSS, not by the allocator's peak.

The allocator holds the model's variables and the step's tensors; the process adds its runtime (TensorFlow, Keras
and Python), the built model's objects beyond its variables' bytes, and the traced step: each block's ops, their
recomputation and their instantiated kernels live in the C library's heap while the step function exists, about
0.1 GiB a block whatever its width (docs/memory.md, "Where the RSS above the allocator goes": measured 0.07-0.12 GiB
a block at dec-1b, llama3.2-3b and llama3.1-8b). That part grows with depth, not with the batch; sharing one traced
block between layers is what would remove it (docs/memory.md, benchmarks/block_heap.py).
"""

from dataclasses import dataclass

from zoo import checks, registry
from zoo.memory import budget
from zoo.memory.estimate import estimate
from zoo.memory.loading import MODEL_OVERHEAD, RUNTIME, DoesNotFit, loading_plan

GiB = 1024**3
# The traced training step's heap per block: fitted to four steps at 1 x 2048 (QLoRA r16 on an int4 base under
# `full` for dec-1b, llama3.2-3b and llama3.1-8b; llama3.2-3b fully fine-tuned, bfloat16 weights, fused), which
# read 0.085-0.121 GiB a block above the runtime, the allocator's peak and the model's objects (docs/memory.md).
STEP_HEAP_PER_BLOCK = int(0.10 * GiB)


@dataclass(frozen=True)
class ResidentPlan:
    runtime: int  # TensorFlow, Keras and Python before the model (zoo.memory.loading.RUNTIME)
    allocator: int  # the step's allocator peak as planned (`estimate(...).total`): the model and the step's tensors
    model_objects: int  # Keras' and TensorFlow's objects per variable beyond its bytes (loading.MODEL_OVERHEAD)
    traced_step: int  # the step function's graph and kernels, STEP_HEAP_PER_BLOCK a block

    @property
    def total(self) -> int:
        return self.runtime + self.allocator + self.model_objects + self.traced_step

    def as_dict(self) -> dict:
        return {"runtime": self.runtime, "allocator": self.allocator, "model objects": self.model_objects,
                "traced step": self.traced_step, "total": self.total}


def step_resident(spec, step, task=None, quantize=None, precision="float32") -> ResidentPlan:
    """The planned peak RSS of a fresh process that builds (or loads) `spec` and trains the step `step` plans (a
    `MemoryEstimate` made with the same task, quantization and precision)."""
    spec = registry.spec(spec)
    model = loading_plan(spec, task, quantize, precision).model
    return ResidentPlan(RUNTIME, step.total, int(MODEL_OVERHEAD * model), STEP_HEAP_PER_BLOCK * spec.num_layers)


def _step_need(spec, batch_size, sequence_length, options) -> int:
    """What a step's process adds to the one asking (its runtime is already resident)."""
    step = estimate(spec, batch_size, sequence_length, **options)
    policy, _ = checks.weights(options.get("weights_dtype", "float32"), options.get("precision"),
                               accumulation_steps=options.get("accumulation_steps", 1),
                               frozen=options.get("lora_rank") is not None)  # the dtype policy `estimate` planned
    plan = step_resident(spec, step, options.get("task"), options.get("quantize"), policy)
    return plan.total - plan.runtime


def check_step_fits(spec, batch_size, sequence_length, available=None, label=None, **options):
    """Refuse (`DoesNotFit`), before anything is loaded or built, a training step whose process would outgrow the
    memory available now (MemAvailable, or `available`), naming both figures and the settings that would fit:
    better than the kernel killing the run halfway through its first step. `options` as `estimate` takes them."""
    spec = registry.spec(spec)
    available = budget.available_bytes() if available is None else available
    needed = _step_need(spec, batch_size, sequence_length, options)
    if needed <= available:
        return
    changes = []  # (what, batch, changed options), each alone; then all of them together
    policy = str(options.get("checkpointing", "none"))
    if not policy.startswith("full"):
        changes.append(("checkpointing 'full'", batch_size, {"checkpointing": "full"}))
    if options.get("lora_rank") and options.get("quantize") != "int4":
        changes.append(("quantize 'int4'", batch_size, {"quantize": "int4"}))
    if batch_size > 1:
        changes.append(("batch size 1", 1, {}))
    if len(changes) > 1:
        together = {k: v for _, _, c in changes for k, v in c.items()}
        changes.append((" + ".join(what for what, _, _ in changes), min(b for _, b, _ in changes), together))
    fits = []
    shorter = [sequence_length >> k for k in range(1, 16) if sequence_length >> k >= 128]
    for what, batch, changed in [("", batch_size, {})] + changes:
        for length in ([sequence_length] if what else []) + shorter:  # the longest that fits with the change
            need = _step_need(spec, batch, length, {**options, **changed})
            if need <= available:
                at = f"sequence length {length}" if length < sequence_length else ""
                fits.append(f"{' + '.join(filter(None, [what, at]))}: {need / GiB:.2f} GiB")
                break
    hint = ("Settings that fit: " + "; ".join(fits) + ".") if fits else (
        "Nothing fits down to 128 positions with full checkpointing, int4 and batch 1; free memory, or use a "
        "machine with more.")
    raise DoesNotFit(f"Training {label or 'this model'} at batch {batch_size} x sequence {sequence_length} "
                     f"({policy}) needs a process of about {needed / GiB:.2f} GiB besides this one's runtime "
                     f"(zoo.memory.step_resident) and {available / GiB:.2f} GiB is available now. {hint}")
