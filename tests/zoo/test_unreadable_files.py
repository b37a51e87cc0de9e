"""A file users bring that cannot be parsed is one line naming the file, what is wrong and the fix (zoo.reading), on
the Python API and through the command line, never a library's traceback that names no file (issue 48, class 3); a
GGUF file where a Hugging Face folder is read points at the converter (class 6)."""

import json
from pathlib import Path

import pytest

import zoo
import zoo.cli
from tests.common import TINY_DEC
from zoo.reading import UnreadableFile


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny decoder's config.json and a safetensors file: every check below comes before a model is built (the
    weights' headers are read first), so no weights need to fit it."""
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("hf") / "tiny"
    path.mkdir()
    config = zoo.hub.config_from_spec(zoo.spec("dec-base").replace(**TINY_DEC), "causal_lm")
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({"model.norm.weight": np.ones(TINY_DEC["hidden_dim"], "float32")}, str(path / "model.safetensors"))
    return path


def broken_copy(folder, tmp_path, name, damage):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    damage(copy / name)
    return copy


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def unquote_a_key(path):
    path.write_text(path.read_text().replace('"vocab_size"', "vocab_size", 1))


@pytest.mark.parametrize("name, damage, message", [
    ("config.json", unquote_a_key, r"is not valid JSON: Expecting property name enclosed in double quotes "
                                   r"at line \d+ column \d+. Fix that line, or download or copy it again"),
    ("model.safetensors", truncate, r"is not a whole safetensors file \(Error while deserializing "
                                    r"header: .*\); download or copy it again"),
])
def test_a_damaged_file_is_named_with_the_fix(folder, tmp_path, capsys, name, damage, message):
    copy = broken_copy(folder, tmp_path, name, damage)
    with pytest.raises(UnreadableFile, match=f"{copy / name} {message}"):
        zoo.hub.load(copy, tokenizer=False)
    assert zoo.cli.main(["generate", str(copy), "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zoo generate: error: ") and str(copy / name) in err and "Traceback" not in err, err


def test_a_shard_index_without_its_map_is_named(folder, tmp_path):
    copy = broken_copy(folder, tmp_path, "model.safetensors.index.json",
                       lambda path: path.write_text(json.dumps({"metadata": {}})))
    with pytest.raises(UnreadableFile, match="model.safetensors.index.json has no \"weight_map\""):
        zoo.hub.load(copy, tokenizer=False)


@pytest.fixture
def sharded(folder, tmp_path):
    """The tiny folder as two shards and their index, as Hugging Face writes a big checkpoint."""
    import numpy as np
    from safetensors.numpy import save_file

    copy = broken_copy(folder, tmp_path, "model.safetensors", lambda path: path.unlink())
    tensors = {"model.norm.weight": np.ones(TINY_DEC["hidden_dim"], "float32"),
               "model.embed_tokens.weight": np.zeros((8, TINY_DEC["hidden_dim"]), "float32")}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for (key, value), name in zip(tensors.items(), names):
        save_file({key: value}, str(copy / name))
    index = {"metadata": {}, "weight_map": dict(zip(tensors, names))}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    return copy


def test_a_missing_or_truncated_shard_is_named(sharded, capsys):
    """Issue 44's bad input: the shard itself is named, before any tensor is read (a missing one from the index)."""
    (sharded / "model-00002-of-00002.safetensors").rename(sharded / "elsewhere")
    with pytest.raises(FileNotFoundError, match=f"{sharded} lacks model-00002-of-00002.safetensors, which "
                                                r"model.safetensors.index.json names; download or copy the folder"):
        zoo.hub.load(sharded, tokenizer=False)
    assert zoo.cli.main(["generate", str(sharded), "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zoo generate: error: ") and "model-00002-of-00002.safetensors" in err, err
    (sharded / "elsewhere").rename(sharded / "model-00002-of-00002.safetensors")
    truncate(sharded / "model-00002-of-00002.safetensors")
    with pytest.raises(UnreadableFile, match=f"{sharded / 'model-00002-of-00002.safetensors'} is not a whole "
                                             "safetensors file"):
        zoo.hub.load(sharded, tokenizer=False)


def test_a_gguf_file_points_at_the_converter(tmp_path):
    gguf = tmp_path / "model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    fix = rf"is a GGUF file \(llama.cpp\); zoo reads Hugging Face folders. Convert it once: python -c 'import " \
          rf"zoo.hub; zoo.hub.convert_gguf\(\"{gguf}\", \"{tmp_path / 'model.Q4_0'}-hf\"\)'"
    for load in (zoo.load, zoo.hub.load):
        with pytest.raises(ValueError, match=fix):
            load(str(gguf))
    with pytest.raises(FileNotFoundError, match=f"has no config.json; it is not a Hugging Face model folder. .*{fix}"):
        zoo.hub.load(tmp_path)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def not_utf8(path):
    path.write_bytes(path.read_bytes()[:40] + b"\xff\xfe" + path.read_bytes()[40:])


@pytest.mark.parametrize("source, name, damage, message", [
    ("sentencepiece", "tokenizer.model", truncate, r"is not readable as a SentencePiece model \(.*\); download or "
                                                   r"copy it again"),
    ("gguf/tokenizer", "merges.txt", not_utf8, r"is not UTF-8 text \(invalid start byte at byte 40\); download or "
                                               r"copy it again"),
])
def test_a_damaged_tokenizer_file_is_named(tmp_path, source, name, damage, message):
    import shutil

    copy = tmp_path / "tokenizer"
    shutil.copytree(FIXTURES / source, copy)
    damage(copy / name)
    with pytest.raises(UnreadableFile, match=f"{copy / name} {message}"):
        zoo.hub.load_tokenizer(copy)


def test_a_truncated_gguf_file_is_named(tmp_path):
    gguf = tmp_path / "llama-q8_0.gguf"
    gguf.write_bytes((FIXTURES / "gguf" / "llama-q8_0.gguf").read_bytes()[:20_000])
    with pytest.raises(UnreadableFile, match=rf"{gguf} is not readable as a GGUF file \(.*\); download or copy it "
                                             r"again"):
        zoo.hub.convert_gguf(gguf, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
