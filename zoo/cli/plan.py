"""`zoo plan MODEL`: a training step's estimated memory for each configuration, the one
`checkpointing="auto"` picks under a budget, and the largest batch each one fits."""

from zoo import checks, registry
from zoo.memory import (
    CONFIGS,
    OPTIMIZERS,
    GiB,
    choose,
    default_budget,
    estimate,
    largest_batch,
    loading_plan,
    parse_bytes,
    replicas,
    step_resident,
)

# The estimate's components in `MemoryEstimate.as_dict()` order, and how `total` adds them up
# (`MemoryEstimate.total`): fused, the walk over the blocks holds one block's update temporaries and the
# embedding's and head's update comes at the end.
COLUMNS = ("weights", "grads", "optimizer", "activ.", "logits", "extra", "head grad", "update", "recompute",
           "transient", "total")
FORMULA = ("total = weights + optimizer + max(activ. + extra + logits + head grad, grads + update + recompute) "
           "(+ transient in both with LoRA; under full, activ. holds one block's replay, and the start counts the "
           "larger of it and logits + head grad); fused: max(the same start, activ. + extra + grads + a block's "
           "update, grads + update)")


REPLICA_FORMULA = ("per replica: the same at the per-replica batch, with the all-reduce's flat copy of the gradients "
                   "it reduces beside them (all of them; fused: one block's, then the embedding's and head's)")


def _plan(args):
    checks.sequence_length(args.sequence_length, registry.spec(args.model).max_sequence_length, repr(args.model))
    fused_clip = None if args.fused_clip == "none" else args.fused_clip
    batch = replicas.per_replica_batch(args.batch_size, args.replicas, args.hosts)
    budget = parse_bytes(args.budget) if args.budget else default_budget()
    lora = args.lora_rank is not None
    configs = [args.checkpointing] if args.checkpointing else [c for c in CONFIGS if not (lora and "fused" in c)]
    targets = args.lora_targets if args.lora_targets in (None, "all-linear") else args.lora_targets.split(",")
    options = {"precision": args.precision, "task": args.task, "optimizer": args.optimizer,
               "weights_dtype": args.weights_dtype, "lora_rank": args.lora_rank, "lora_targets": targets,
               "quantize": args.quantize, "packed": args.packing, "preference": args.preference, "grpo": args.grpo,
               "completion_length": args.completion_length, "loss_chunk": args.loss_chunk}
    policy, rounding = checks.weights(args.weights_dtype, args.precision, frozen=lora)
    weights = f", {args.weights_dtype} weights ({rounding} rounding)" if rounding else ""
    adapted = (f"; LoRA r{args.lora_rank} on {args.lora_targets or 'the default targets'}"
               + (f", {args.quantize} base" if args.quantize else "")) if lora else ""
    adapted += "; packed rows (examples numbered in the padding mask)" if args.packing else ""
    adapted += "; preference pairs (--batch-size pairs, two rows each)" if args.preference else ""
    adapted += (f"; GRPO: {args.grpo} completions of {args.completion_length} tokens per prompt (--batch-size "
                 f"prompts, --sequence-length prompt + completion), sampled with the key/value cache first"
                 if args.grpo else "")
    if args.preference:
        configs = [c for c in configs if "fused" not in c]
    if args.replicas > 1:  # every figure below is one replica's, at its slice of the global batch
        options["replicas"] = args.replicas
        print(f"{args.model}: global batch {args.batch_size} = {args.replicas} replicas x {batch} on {args.hosts} "
              f"host{'s' if args.hosts > 1 else ''}, sequence {args.sequence_length}, {policy}{weights}, "
              f"{args.optimizer}{adapted}; budget {budget / GiB:.2f} GiB per replica")
    else:
        print(f"{args.model}: batch {args.batch_size} x sequence {args.sequence_length}, {policy}{weights}, "
              f"{args.optimizer}{adapted}; budget {budget / GiB:.2f} GiB")
    columns = (*COLUMNS[:-1], "generation", COLUMNS[-1]) if args.grpo else COLUMNS
    print(f"{'config':11s} " + " ".join(f"{c:>9s}" for c in columns) + f" {'max batch':>9s}")
    most = {}
    for config in configs:
        e = estimate(args.model, batch, args.sequence_length, checkpointing=config, **options)
        cells = " ".join(f"{v / GiB:8.2f}G" for v in e.as_dict().values())
        most[config] = largest_batch(args.model, args.sequence_length, budget, checkpointing=config, **options)
        print(f"{config:11s} {cells} {most[config]:9d}")
    choice, e = choose(args.model, batch, args.sequence_length, budget, configs=configs, **options)
    print(FORMULA + (" ; GRPO: max(that, generation) beside weights + optimizer" if args.grpo else ""))
    if args.replicas > 1:
        print(REPLICA_FORMULA)
        _distribution(args, configs, most, fused_clip, options)
    loading = _loading(args, policy) if lora else ""
    resident = _resident(args, e, policy, budget)
    print(f"auto: {choice} ({e.total / GiB:.2f} GiB of {budget / GiB:.2f} GiB){loading}{resident}")
    return 0


def _resident(args, e, policy, budget) -> str:
    """The chosen step's planned peak RSS: what the machine (and its out-of-memory killer) sees of the process."""
    plan = step_resident(args.model, e, args.task, args.quantize, policy)
    parts = " + ".join(f"{k} {v / GiB:.2f}" for k, v in plan.as_dict().items() if k != "total")
    blocks = registry.spec(args.model).num_layers
    text = (f"; its process's planned peak RSS {plan.total / GiB:.2f} GiB ({parts}: {blocks} blocks traced into the "
            f"step, ~{plan.traced_step / blocks / GiB:.2f} GiB each; docs/memory.md)")
    if plan.total > budget:
        text += f", above the {budget / GiB:.2f} GiB budget: a shorter sequence, a smaller batch or int4 lowers it"
    return text


def _loading(args, policy) -> str:
    """What loading the frozen base from a bfloat16 checkpoint peaks at, beside the step's figure."""
    load = loading_plan(args.model, args.task, args.quantize, policy)
    parts = ", ".join(f"{k} {v / GiB:.2f}G" for k, v in load.as_dict().items() if k != "total" and v)
    into = f"into {args.quantize} " if args.quantize else ""
    return f"; loading the base {into}(zoo.hub.load, bfloat16 checkpoint): peak {load.total / GiB:.2f} GiB ({parts})"


def _distribution(args, configs, most, fused_clip, options):
    """The data-parallel lines: per-replica memory, the global batch, the bytes all-reduced and sent."""
    n, hosts = args.replicas, args.hosts
    print(f"{n} replicas on {hosts} host{'s' if hosts > 1 else ''}, per step (ring all-reduce; network: what each "
          f"host sends over its link; fused clip {fused_clip or 'none'}):")
    print(f"{'config':11s} {'per replica':>11s} {'global batch':>12s} {'all-reduced':>11s} {'sent/replica':>12s} "
          f"{'network/host':>12s} {'max global batch':>16s}")
    options = {k: v for k, v in options.items() if k != "replicas"}
    for config in configs:
        p = replicas.plan(args.model, args.batch_size, args.sequence_length, n, hosts, fused_clip,
                          checkpointing=config, **options)
        twice = "  (twice: the exact global clip's norm pass, then the update)" if (
            p.estimate.fused and fused_clip == "global") else ""
        print(f"{config:11s} {p.per_replica / GiB:10.2f}G {f'{p.global_batch} = {n}x{p.batch}':>12s} "
              f"{p.reduced / GiB:10.2f}G {p.sent / GiB:11.2f}G {p.network / GiB:11.2f}G "
              f"{f'{n * most[config]} = {n}x{most[config]}':>16s}{twice}")


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
    p.add_argument("--packing", action="store_true",
                   help="rows packed with whole examples (zoo train --recipe sft --packing): per-row positions")
    p.add_argument("--preference", action="store_true",
                   help="a DPO / SimPO step (zoo train --recipe dpo): --batch-size counts pairs, two rows each")
    p.add_argument("--grpo", type=int, default=None, metavar="G",
                   help="a GRPO step (zoo train --recipe grpo) with G completions per prompt: --batch-size counts "
                   "prompts, --sequence-length is prompt + completion")
    p.add_argument("--completion-length", type=int, default=None,
                   help="with --grpo: the completion's tokens (--max-completion-length)")
    p.add_argument("--loss-chunk", type=int, default=None,
                   help="causal LM: positions per chunk of the loss, as a recipe's loss_chunk (default: the loss's "
                   "choice; 0: whole logits)")
    p.add_argument("--replicas", type=int, default=1,
                   help="data-parallel replicas (devices); --batch-size is then the GLOBAL batch, split evenly")
    p.add_argument("--hosts", type=int, default=1, help="with --replicas: hosts the replicas spread over evenly")
    p.add_argument("--fused-clip", default="global", choices=["global", "per-block", "none"],
                   help="the fused update's clip: global (exact) all-reduces the gradients twice, per-block once")
    p.set_defaults(func=_plan)
