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

from zoo import memory, verbosity
from zoo.cli import catalog, export, generate, plan

COMMANDS = (catalog, plan, export, generate)


def build_parser():
    parser = argparse.ArgumentParser(prog="zoo", description="keras-zoo: memory-efficient Transformers")
    # Never parsed here: verbosity.split_flag takes it out of the line first, wherever it stands.
    parser.add_argument("--verbose", metavar="=LEVEL", nargs="?",
                        help="TensorFlow's own log lines, which are off by default: --verbose alone is 2, "
                        f"--verbose=LEVEL picks one of {verbosity.choices()}; as ${verbosity.ENV}=LEVEL")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(subparsers)
    for entry in entry_points(group="zoo.commands"):
        entry.load()(subparsers)
    return parser


def main(argv=None):
    try:
        verbosity.check()
        level, rest = verbosity.split_flag(sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        print(f"zoo: error: {error}", file=sys.stderr)
        return 2
    if level is not None:
        if argv is None:  # TensorFlow reads its log level once, as it loads: start again at this one
            verbosity.restart_with(level, rest)
        verbosity.set_python_loggers(level)
    args = build_parser().parse_args(rest)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, memory.DoesNotFit) as error:
        print(f"zoo {args.command}: error: {error}", file=sys.stderr)
        return 2
