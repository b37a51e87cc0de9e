"""Reading the files users bring (config.json and other JSON, safetensors weights), so that a file that cannot be
parsed (truncated by an interrupted download or copy, edited by hand) is one line naming the file, what is wrong
and the fix, never a library's traceback that names no file. zoo.files is the writing side."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

REFETCH = "download or copy it again (an interrupted transfer leaves a truncated file)"


class UnreadableFile(ValueError):
    """A file that exists but cannot be parsed as the kind it must be."""


def read_json(path, missing=FileNotFoundError):
    """The parsed JSON file at `path`; `missing` is returned where the file is absent (by default that raises,
    naming the file)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing is FileNotFoundError:
            raise FileNotFoundError(f"{path} does not exist.") from None
        return missing
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}); {REFETCH}.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableFile(f"{path} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}. "
                             f"Fix that line, or {REFETCH}.") from None


@contextlib.contextmanager
def _safetensors_errors(path):
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as error:  # a header cut short or overwritten: safetensors checks it covers the file
        raise UnreadableFile(f"{path} is not a whole safetensors file ({error}); {REFETCH}.") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist.") from None


@contextlib.contextmanager
def open_safetensors(path):
    """safetensors' `safe_open(path, framework="numpy")`, a file it cannot parse as `UnreadableFile`."""
    from safetensors import safe_open

    with _safetensors_errors(path):
        handle = safe_open(path, framework="numpy")
    with handle as f:
        yield f


def load_safetensors(path) -> dict:
    """Every tensor of a safetensors file as numpy arrays (safetensors.numpy.load_file), errors as above."""
    from safetensors.numpy import load_file

    with _safetensors_errors(path):
        return load_file(path)
