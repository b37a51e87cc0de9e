"""`zoo generate` end to end on a tiny Hugging Face folder with a byte-level BPE tokenizer."""

import json

import keras
import keras_hub
import pytest

import zoo
from zoo.generation import generate

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    vocabulary = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(LETTERS + "Ġ")}, "th": 28, "Ġt": 29}
    tokenizer = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=vocabulary, merges=["t h", "Ġ t"], unsplittable_tokens=["<|endoftext|>"])
    keras.utils.set_random_seed(3)
    model = zoo.get("dec-base", num_layers=2, hidden_dim=32, num_heads=4, num_kv_heads=2, intermediate_dim=64,
                    vocab_size=32, max_sequence_length=64)
    path = zoo.hub.save(model, tmp_path_factory.mktemp("hf") / "tiny", tokenizer=tokenizer)
    return path


@pytest.fixture(scope="module")
def model(folder):
    """The folder's model as `zoo generate` loads it, loaded once for the references."""
    return zoo.loading.load(str(folder))


def zoo_cli(capsys, *args):
    """`zoo ARGS` in this process (`python -m zoo.cli` itself: test_memory.test_cli_runs_as_a_module)."""
    from zoo.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    return out


def test_generate_streams_what_generate_returns(folder, model, capsys):
    """Streamed, and batched (the compiled loop, in the CLI), the texts `generate` returns (run eagerly here:
    test_generation_batch.py shows the eager loop equals the compiled one)."""
    prompts = ["the cat", "a dog sat"]
    expected = [generate(model, p, max_new_tokens=6, stop_token_ids=[0], compile=False) for p in prompts]
    streamed = zoo_cli(capsys, "generate", str(folder), *prompts, "--max-new-tokens", "6").splitlines()
    assert streamed == expected
    batched = json.loads(zoo_cli(capsys, "generate", str(folder), *prompts, "--max-new-tokens", "6", "--batch"))
    assert batched["outputs"] == expected


def test_generate_refuses_an_encoder(tmp_path, capsys):
    from zoo.cli import main

    path = zoo.hub.save(zoo.get("enc-mini", num_layers=1, hidden_dim=32, num_heads=4, intermediate_dim=32),
                        tmp_path / "bert")
    assert main(["generate", str(path), "hi"]) == 2
    assert "causal_lm" in capsys.readouterr().err


def test_tflite_export_and_generate(folder, model, tmp_path, capsys):
    """`zoo export --format tflite --generate` writes the prefill/decode file and `zoo generate
    --tflite` runs it: the texts `generate` returns (greedy, stopping at <|endoftext|>), in process."""
    from zoo.cli import main

    path = tmp_path / "tiny.tflite"
    assert main(["export", str(folder), "--format", "tflite", "--generate", "--prefill-length", "4",
                 "--cache-length", "24", "-o", str(path)]) == 0
    assert "prefill 4 and decode signatures, cache 24 positions" in capsys.readouterr().out
    prompts = ["the cat", "a dog sat"]
    assert main(["generate", "--tflite", str(path), "--tokenizer", str(folder), *prompts,
                 "--max-new-tokens", "6"]) == 0
    expected = [generate(model, p, max_new_tokens=6, stop_token_ids=[0], compile=False) for p in prompts]
    assert capsys.readouterr().out.splitlines() == expected


def test_gguf_export(folder, model, tmp_path, capsys):
    """`zoo export --format gguf`: the file zoo.hub.write_gguf writes, in the asked file type."""
    import gguf

    from zoo.cli import main

    for quantize, file_type in ((None, gguf.LlamaFileType.MOSTLY_Q8_0), ("f16", gguf.LlamaFileType.MOSTLY_F16)):
        path = tmp_path / f"{quantize}.gguf"
        assert main(["export", str(folder), "--format", "gguf", "-o", str(path)]
                    + (["--quantize", quantize] if quantize else [])) == 0
        assert f"wrote {path}" in capsys.readouterr().out
        field = gguf.GGUFReader(path).get_field("general.file_type")
        assert int(field.contents()) == file_type
        assert path.read_bytes() == zoo.hub.write_gguf(model, tmp_path / "lib.gguf", quantize or "q8_0", name="tiny",
                                                       overwrite=True).read_bytes()  # named after the folder


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory):
    return zoo.hub.save(zoo.get("enc-mini", num_layers=1, hidden_dim=32, num_heads=4, intermediate_dim=32,
                                vocab_size=64), tmp_path_factory.mktemp("bert") / "bert")


@pytest.mark.parametrize("args, message", [
    (["export", "FOLDER", "--format", "gguf", "--quantize", "int8"], "--quantize int8 does not apply to --format gguf"),
    (["export", "FOLDER", "--format", "saved_model", "--quantize", "int8"], "a SavedModel keeps the model's weights"),
    (["export", "FOLDER", "--format", "tflite", "--quantize", "q8_0"], "use one of float16, int8"),
    (["export", "FOLDER", "--format", "saved_model", "--generate"], "apply to --format tflite --generate only"),
    (["export", "FOLDER", "--format", "tflite", "--prefill-length", "8"], "apply to --format tflite --generate"),
    (["export", "FOLDER", "--format", "tflite", "--int8-mode", "stand_in"], "add --quantize int8"),
    (["export", "FOLDER", "--format", "gguf", "--vocabulary", "v.txt"], "--format saved_model only"),
    (["export", "FOLDER", "--format", "tflite", "--generate", "--prefill-length", "65"],
     "prefill_length=65 is outside this model's range 1..64"),
    (["export", "ENCODER", "--format", "gguf"], "GGUF export takes Llama-family decoders"),
    (["export", "ENCODER", "--format", "tflite", "--generate"], "need a decoder language model"),
    (["generate", "--tflite", "x.tflite", "hi"], "--tflite needs --tokenizer FOLDER"),
    (["generate", "--tflite", "x.tflite", "--tokenizer", "FOLDER", "--sampler", "top_k", "hi"], "greedily"),
    (["generate", "FOLDER"], "Give at least one prompt")])
def test_bad_command_lines_are_refused_with_the_fix(args, message, folder, encoder_folder, tmp_path, capsys):
    """Each refused before any conversion, exit 2, nothing written."""
    from zoo.cli import main

    args = [str(folder) if a == "FOLDER" else str(encoder_folder) if a == "ENCODER" else a for a in args]
    out = tmp_path / "out"
    suffix = ".gguf" if "gguf" in args else ".tflite" if "tflite" in args else ""
    export = ["-o", str(out / f"x{suffix}")] if args[0] == "export" else []
    assert main(args + export) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
