"""`zoo plan MODEL`: a training step's estimated memory for each checkpointing policy."""

from zoo.memory import GiB, estimate
from zoo.recompute import POLICIES


def _plan(args):
    print(f"{args.model}: batch {args.batch_size} x sequence {args.sequence_length}, {args.precision}")
    print(f"{'policy':10s} {'weights':>9s} {'grads':>9s} {'adam':>9s} {'activ.':>9s} {'logits':>9s} {'total':>9s}")
    for policy in ([args.checkpointing] if args.checkpointing else POLICIES):
        e = estimate(args.model, args.batch_size, args.sequence_length, args.precision, policy)
        cells = " ".join(f"{v / GiB:8.2f}G" for v in e.as_dict().values())
        print(f"{policy:10s} {cells}")
    return 0


def register(subparsers):
    p = subparsers.add_parser("plan", help="estimate a training step's memory for each checkpointing policy")
    p.add_argument("model")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--precision", default="float32", choices=["float32", "mixed_bfloat16", "mixed_float16"])
    p.add_argument("--checkpointing", default=None)
    p.set_defaults(func=_plan)
