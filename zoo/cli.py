"""`zoo` on the command line: list | info | plan, plus commands other packages
register under the `zoo.commands` entry-point group (recipes adds `train`).

Each command module exposes `register(subparsers)`, which adds its parser and
sets `func` to a callable taking the parsed args and returning an exit code.
"""

import argparse
import json
import sys
from importlib.metadata import entry_points


def _list(args):
    import zoo

    for name in zoo.names():
        s = zoo.spec(name)
        print(f"{name:10s} {s.family:6s} {s.num_params() / 1e6:8.1f}M  {s.description}")
    return 0


def _info(args):
    import zoo

    s = zoo.spec(args.model)
    print(json.dumps({"name": args.model, **s.to_dict(), "num_params": s.num_params()}, indent=2))
    return 0


def _builtin(subparsers):
    p = subparsers.add_parser("list", help="registered models")
    p.set_defaults(func=_list)
    p = subparsers.add_parser("info", help="a model's spec and parameter count")
    p.add_argument("model")
    p.set_defaults(func=_info)


def build_parser():
    parser = argparse.ArgumentParser(prog="zoo", description="keras-zoo: memory-efficient Transformers")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _builtin(subparsers)
    from zoo import export, memory

    for module in (memory, export):
        module.register(subparsers)
    for entry in entry_points(group="zoo.commands"):
        entry.load()(subparsers)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"zoo {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
