"""`zoo plan MODEL`: a training step's estimated memory for each configuration, the one
`checkpointing="auto"` picks under a budget, and the largest batch each one fits."""

from zoo import checks
from zoo.memory import CONFIGS, OPTIMIZERS, GiB, choose, default_budget, estimate, largest_batch, parse_bytes

# The estimate's components in `MemoryEstimate.as_dict()` order, and how `total` adds them up
# (`MemoryEstimate.total`): fused, the walk over the blocks holds one block's update temporaries and the
# embedding's and head's update comes at the end.
COLUMNS = ("weights", "grads", "optimizer", "activ.", "logits", "extra", "head grad", "update", "recompute",
           "transient", "total")
FORMULA = ("total = weights + optimizer + max(activ. + extra + logits + head grad, grads + update + recompute) "
           "(+ transient in both with LoRA); fused: max(the same start, activ. + extra + grads + a block's update, "
           "grads + update)")


def _plan(args):
    budget = parse_bytes(args.budget) if args.budget else default_budget()
    lora = args.lora_rank is not None
    configs = [args.checkpointing] if args.checkpointing else [c for c in CONFIGS if not (lora and "fused" in c)]
    targets = args.lora_targets if args.lora_targets in (None, "all-linear") else args.lora_targets.split(",")
    options = {"precision": args.precision, "task": args.task, "optimizer": args.optimizer,
               "weights_dtype": args.weights_dtype, "lora_rank": args.lora_rank, "lora_targets": targets,
               "quantize": args.quantize}
    policy, rounding = checks.weights(args.weights_dtype, args.precision, frozen=lora)
    weights = f", {args.weights_dtype} weights ({rounding} rounding)" if rounding else ""
    adapted = (f"; LoRA r{args.lora_rank} on {args.lora_targets or 'the default targets'}"
               + (f", {args.quantize} base" if args.quantize else "")) if lora else ""
    print(f"{args.model}: batch {args.batch_size} x sequence {args.sequence_length}, {policy}{weights}, "
          f"{args.optimizer}{adapted}; budget {budget / GiB:.2f} GiB")
    print(f"{'config':11s} " + " ".join(f"{c:>9s}" for c in COLUMNS) + f" {'max batch':>9s}")
    for config in configs:
        e = estimate(args.model, args.batch_size, args.sequence_length, checkpointing=config, **options)
        cells = " ".join(f"{v / GiB:8.2f}G" for v in e.as_dict().values())
        most = largest_batch(args.model, args.sequence_length, budget, checkpointing=config, **options)
        print(f"{config:11s} {cells} {most:9d}")
    choice, e = choose(args.model, args.batch_size, args.sequence_length, budget, configs=configs, **options)
    print(FORMULA)
    print(f"auto: {choice} ({e.total / GiB:.2f} GiB of {budget / GiB:.2f} GiB)")
    return 0


def register(subparsers):
    p = subparsers.add_parser("plan", help="estimate a training step's memory for each configuration and pick one")
    p.add_argument("model")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--precision", default=None, choices=["float32", "mixed_bfloat16", "mixed_float16", "bfloat16"],
                   help="the dtype policy (default: float32; bfloat16 with --weights-dtype bfloat16)")
    p.add_argument("--weights-dtype", default="float32", choices=checks.WEIGHTS_DTYPES,
                   help="bfloat16: no float32 copy, updates rounded stochastically (zoo.optimizers; adamw, lion, "
                   "adafactor)")
    p.add_argument("--task", default=None, help="the task head (default: the family's)")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    p.add_argument("--budget", default=None, help="e.g. 24GiB (default: the device's memory, or RAM on CPU)")
    p.add_argument("--checkpointing", default=None, help="one configuration only (none, selective, full, full+fused)")
    p.add_argument("--lora-rank", type=int, default=None, help="LoRA adapters of this rank train, the rest is frozen")
    p.add_argument("--lora-targets", default=None, help="comma-separated projections or all-linear (default: PEFT's)")
    p.add_argument("--quantize", default=None, choices=checks.QUANTIZATION_MODES,
                   help="with --lora-rank: the frozen base's storage (Keras' Model.quantize)")
    p.set_defaults(func=_plan)
