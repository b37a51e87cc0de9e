"""Quiet by default, loud when asked, and a bad level refused with the choices (zoo.verbosity).

The quiet default as a user meets it, a real `python -m zoo.cli list` with an empty stderr, is in
tests/zoo/test_memory.py::test_cli_runs_as_a_module; one real process here shows ZOO_VERBOSE bringing the lines back.
"""

import os
import subprocess
import sys

import pytest

import zoo.cli
from tests.common import REPO
from zoo import verbosity


def test_zoo_verbose_brings_tensorflows_lines_back():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", "import zoo"], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**env, "ZOO_VERBOSE": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "absl::InitializeLog" in done.stderr or "tensorflow" in done.stderr.lower(), done.stderr


@pytest.mark.parametrize("argv, level, rest", [
    (["list"], None, ["list"]),
    (["--verbose", "train", "dec-base"], "2", ["train", "dec-base"]),  # not read as the level "train"
    (["train", "dec-base", "--verbose=1"], "1", ["train", "dec-base"]),
    (["generate", "m", "--", "--verbose"], None, ["generate", "m", "--", "--verbose"]),  # after --: an argument
])
def test_the_flag_is_found_wherever_it_stands(argv, level, rest):
    assert verbosity.split_flag(argv) == (level, rest)


def test_an_unknown_level_names_the_choices(capsys, monkeypatch):
    assert zoo.cli.main(["--verbose=loud", "list"]) == 2
    err = capsys.readouterr().err
    assert "--verbose='loud' is not a verbosity level; choose 0 (quiet), 1 (" in err and "2 (everything" in err
    monkeypatch.setenv("ZOO_VERBOSE", "9")
    assert zoo.cli.main(["list"]) == 2
    assert "ZOO_VERBOSE='9' is not a verbosity level; choose 0 (quiet)" in capsys.readouterr().err


def test_the_command_line_flag_starts_the_command_again_at_that_level(monkeypatch):
    """TensorFlow reads its log settings once, as it loads: `zoo --verbose ...` runs the same command again in a
    process whose environment asks for them (and drops the quiet TF_CPP_MIN_LOG_LEVEL zoo set, not a user's)."""
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, args, env: calls.append((path, args, env)))
    monkeypatch.setattr(sys, "argv", ["zoo", "list", "--verbose"])
    monkeypatch.delenv("ZOO_VERBOSE", raising=False)
    monkeypatch.setattr(verbosity, "_set_here", ["TF_CPP_MIN_LOG_LEVEL"])
    assert zoo.cli.main() == 0  # execve stood in for: the command then runs here
    (path, args, env), = calls
    assert (path, args[1:]) == (sys.executable, ["-m", "zoo.cli", "list"])
    assert env["ZOO_VERBOSE"] == "2" and "TF_CPP_MIN_LOG_LEVEL" not in env


def test_a_failed_import_shows_what_was_silenced(capfd):
    """What the silenced import wrote to the terminal is dropped when it succeeds and shown when it fails, so a
    broken TensorFlow install still explains itself."""
    with verbosity.quiet_import():
        os.write(2, b"an info line of TensorFlow's\n")
    assert capfd.readouterr().err == ""
    with pytest.raises(ImportError), verbosity.quiet_import():
        os.write(2, b"libtensorflow_framework.so.2: cannot open shared object file\n")
        raise ImportError("no TensorFlow")
    assert "cannot open shared object file" in capfd.readouterr().err
