"""How much TensorFlow prints: nothing of its own by default.

TensorFlow writes info lines to the terminal as it loads (oneDNN notices, "Could not find cuda drivers", "rebuild
TensorFlow with the appropriate compiler flags", absl's "All log messages before absl::InitializeLog()"), some from
C++ before any setting of ours is read, and none a user must act on. The zoo silences them unless asked:

    ZOO_VERBOSE=0   quiet (the default): TensorFlow's C++ log off, its import lines swallowed (shown if the import
                    fails), its Python loggers at ERROR
    ZOO_VERBOSE=1   TensorFlow's warnings and errors (TF_CPP_MIN_LOG_LEVEL=1) and its import lines
    ZOO_VERBOSE=2   everything TensorFlow prints (TF_CPP_MIN_LOG_LEVEL=0)

`zoo --verbose [LEVEL]` does the same for one command. A TF_CPP_MIN_LOG_LEVEL the user set is kept. The zoo's own
warnings (Python's `warnings`) always show. This module imports nothing heavy: it runs before TensorFlow loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

ENV = "ZOO_VERBOSE"
LEVELS = {"0": "quiet", "1": "TensorFlow's warnings and errors", "2": "everything TensorFlow prints"}
TF_CPP_LEVEL = {"0": "3", "1": "1", "2": "0"}  # TF_CPP_MIN_LOG_LEVEL per level
_set_here = []  # the environment variables this module set (not the user)


def choices() -> str:
    return ", ".join(f"{k} ({v})" for k, v in LEVELS.items())


def problem() -> str | None:
    """What is wrong with $ZOO_VERBOSE, or None."""
    value = os.environ.get(ENV, "0").strip()
    if value in LEVELS:
        return None
    return f"{ENV}={os.environ[ENV]!r} is not a verbosity level; choose {choices()} (or unset it)."


def level() -> str:
    """The level in force: $ZOO_VERBOSE, or "0" (quiet) where it is unset or not a level."""
    return "0" if problem() else os.environ.get(ENV, "0").strip()


def check():
    """Raise ValueError naming the choices where $ZOO_VERBOSE is not a level (the CLI turns it into exit 2)."""
    message = problem()
    if message:
        raise ValueError(message)


def configure_tensorflow_env():
    """Before TensorFlow is imported: its C++ log level for our level, unless the user set one."""
    if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = TF_CPP_LEVEL[level()]
        _set_here.append("TF_CPP_MIN_LOG_LEVEL")


@contextlib.contextmanager
def quiet_import():
    """Around the first import of TensorFlow: at level 0, what its C++ side writes to the terminal (fd 2) goes to
    a scratch file, replayed if the import fails so that a broken install still explains itself."""
    if level() != "0":
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            scratch.seek(0)
            sys.stderr.write(scratch.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def set_python_loggers(new_level: str | None = None):
    """TensorFlow's and absl's Python loggers for a level: ERROR at 0 (their INFO/WARNING lines are TensorFlow's
    bookkeeping, e.g. tf.function retracing notices), WARNING at 1, INFO at 2."""
    import logging

    value = {"0": logging.ERROR, "1": logging.WARNING, "2": logging.INFO}[new_level or level()]
    logging.getLogger("tensorflow").setLevel(value)
    with contextlib.suppress(ImportError):
        from absl import logging as absl_logging

        absl_logging.set_verbosity(value)


def split_flag(argv: list) -> tuple:
    """(level or None, argv without it) for `--verbose` (level 2) or `--verbose=LEVEL`, wherever it stands before a
    `--`: taken out before argparse, which would read `zoo --verbose train` as the level "train"."""
    found, rest = None, list(argv)
    end = rest.index("--") if "--" in rest else len(rest)
    for token in [t for t in rest[:end] if t == "--verbose" or t.startswith("--verbose=")]:
        rest.remove(token)
        found = token.partition("=")[2] if "=" in token else "2"
        if found not in LEVELS:
            raise ValueError(f"--verbose={found!r} is not a verbosity level; choose {choices()}.")
    return found, rest


def restart_with(new_level: str, argv: list) -> None:
    """Run this command again from the start at `new_level` (TensorFlow reads its log settings once, as it loads):
    replaces the process; returns only where the level is already in force."""
    if new_level == os.environ.get(ENV):
        return
    env = {k: v for k, v in os.environ.items() if k not in _set_here}  # ours follow the new level
    env[ENV] = new_level
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "zoo.cli", *argv], env)
