"""`zoo` on the command line: list | info | plan | export | generate, plus the commands other
packages register under the `zoo.commands` entry-point group (recipes adds `train`).

Each command module exposes `register(subparsers)`, which adds its parser and
sets `func` to a callable taking the parsed args and returning an exit code.
The library modules (`zoo.memory`, `zoo.export`, ...) only define functions; the
argument parsing and printing live here.
"""

import argparse
import sys
from importlib.metadata import entry_points

from zoo.cli import catalog, export, generate, plan

COMMANDS = (catalog, plan, export, generate)


def build_parser():
    parser = argparse.ArgumentParser(prog="zoo", description="keras-zoo: memory-efficient Transformers")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
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
