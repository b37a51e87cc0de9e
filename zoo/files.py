"""Writing files and folders so that nothing is lost: a temporary sibling is
written, then renamed into place, and an earlier version survives until the new
one is complete. The one home of atomic writes: exports, Hugging Face folders,
training checkpoints and run files all use it."""

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path


def check_target(path, overwrite):
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (--overwrite) to replace it.")
    return path


@contextlib.contextmanager
def atomic_path(path, overwrite=False):
    """Yield a temporary sibling of `path` to write into; move it to `path` only on success."""
    path = check_target(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = path.with_name(f".{path.name}.tmp-{tag}{path.suffix}")
    old = path.with_name(f".{path.name}.old-{tag}")
    try:
        yield tmp
        if not tmp.is_dir():
            os.replace(tmp, path)  # a file replaces a file in one step
        else:  # a folder cannot replace a folder: move the earlier one aside until the new one is in place
            if path.exists():
                os.replace(path, old)
            try:
                os.replace(tmp, path)
            except OSError:
                if old.exists():
                    os.replace(old, path)
                raise
    finally:
        for leftover in (tmp, old):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            elif leftover.exists():
                leftover.unlink()


def write_json(path, payload):
    """`payload` as a JSON file at `path`, replacing any earlier one only once it is whole on disk."""
    with atomic_path(path, overwrite=True) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
