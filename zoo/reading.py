"""Reading the files users bring (config.json and other JSON, safetensors weights, tokenizer files, GGUF, JSONL and
CSV data), so that a file that cannot be parsed (truncated by an interrupted download or copy, edited by hand, not
UTF-8) is one line naming the file (and its line), what is wrong and the fix, never a library's traceback that names
no file. zoo.files is the writing side."""

from __future__ import annotations

import contextlib
import csv
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


def read_text(path) -> str:
    """A UTF-8 text file (a vocab.txt, merges.txt), a file that is not UTF-8 as `UnreadableFile`."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist.") from None
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}); {REFETCH}.") from None


def jsonl_records(path):
    """(line number, parsed value) of each non-blank line of a JSONL file; a line that is not JSON, or bytes that
    are not UTF-8, as `UnreadableFile` naming the line."""
    number = 0
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield number, json.loads(line)
    except json.JSONDecodeError as error:
        raise UnreadableFile(f"{path}, line {number}: not JSON ({error.msg}: column {error.colno}). Fix that line, "
                             f"or {REFETCH}.") from None
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"{path}, after line {number}: not UTF-8 text ({error.reason}); save the file as UTF-8, "
                             f"or {REFETCH}.") from None


@contextlib.contextmanager
def _csv_errors(path, line):
    """Bytes that are not UTF-8 or a malformed row (an unclosed quote) as `UnreadableFile`; `line()`: where."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"{path}, after line {line()}: not UTF-8 text ({error.reason}); save the file as UTF-8, "
                             f"or {REFETCH}.") from None
    except csv.Error as error:
        raise UnreadableFile(f"{path}, line {line()}: not a well-formed row ({error}). Fix that line, or "
                             f"{REFETCH}.") from None


def csv_header(path, delimiter=",") -> list[str]:
    """The header row of a CSV/TSV file ([] for an empty one), errors as `csv_rows`."""
    csv.field_size_limit(1 << 30)
    reader = None
    with _csv_errors(path, lambda: reader.line_num if reader else 0), open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=delimiter)
        return next(reader, [])


def csv_rows(path, delimiter=","):
    """(line number, row as a dict) of a CSV/TSV file with a header row (csv.DictReader); bytes that are not UTF-8
    or a malformed row as `UnreadableFile` naming the line."""
    csv.field_size_limit(1 << 30)
    reader = None
    with _csv_errors(path, lambda: reader.line_num if reader else 0), open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        for row in reader:
            yield reader.line_num, row


@contextlib.contextmanager
def parsed_by_library(path, kind):
    """Around a library that parses `path` as `kind` ("a SentencePiece model", "a GGUF file") and raises its own
    error types on a damaged file (sentencepiece's RuntimeError, gguf's ValueError or IndexError): one
    `UnreadableFile` naming the file."""
    try:
        yield
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist.") from None
    except Exception as error:  # noqa: BLE001 -- each parser has its own types; all mean "not a whole KIND"
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UnreadableFile(f"{path} is not readable as {kind} ({type(error).__name__}: {detail}); {REFETCH}.") \
            from None


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
