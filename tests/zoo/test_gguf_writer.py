"""GGUF out (`zoo.hub.gguf_writer`), checked against transformers' GGUF reader.

tests/fixtures/gguf holds two files zoo wrote (tools/make_gguf_fixtures.py) and what
transformers read from them: its logits on the llama-rope-parameters inputs and its
tokenization of a sentence. transformers maps llama.cpp's tensor names, un-permutes the
query/key rows and builds the tokenizer from the metadata with its own code, so:

- today's export of the same model must be the committed file (every metadata field,
  tensor type, shape and byte), and
- zoo's logits with the same quantized weights must equal transformers' on that file.

Where torch and transformers are installed, a fresh export is also loaded directly.
"""

import functools
import hashlib

import numpy as np
import pytest

import zoo
from tests.common import REPO, TINY_DEC
from zoo import hub
from zoo.hub import gguf_writer
from zoo.hub.tokenizers import byte_pair

gguf = pytest.importorskip("gguf")

ROOT = REPO / "tests" / "fixtures" / "gguf"
SOURCE = REPO / "tests" / "fixtures" / "hf" / "llama-rope-parameters"
FILES = {"llama-q8_0": ("q8_0", False), "llama-tied-f16": ("f16", True)}
TEXT = "The lazy fox reads the tiny file again."  # tools/make_gguf_fixtures.py TEXT


@pytest.fixture(scope="module")
def tokenizer():
    return byte_pair(ROOT / "tokenizer", unsplittable_tokens=["<|endoftext|>"])


@functools.cache
def fixture_model(key, tokenizer):
    """Loaded once per module; no test changes its weights."""
    quantize, tied = FILES[key]
    model = hub.load(SOURCE, tie_embeddings=True) if tied else hub.load(SOURCE)
    model.__dict__["tokenizer"] = tokenizer
    return model


def export(model, path, quantize):
    """As tools/make_gguf_fixtures.py writes the committed files."""
    return gguf_writer.write_gguf(model, path, quantize=quantize, bos_token_id=0, eos_token_id=0,
                                  name="keras-zoo tiny llama")


def describe(path) -> dict:
    """Every metadata field and tensor (type, shape, data digest) of a GGUF file."""
    reader = gguf.GGUFReader(str(path))
    out = {f"field {k}": repr(f.contents()) for k, f in reader.fields.items()}
    out.update({f"tensor {t.name}": (t.tensor_type.name, tuple(int(n) for n in t.shape),
                                     hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()) for t in reader.tensors})
    return out


def differences(a: dict, b: dict) -> list:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def logits(model, expected):
    x = {"token_ids": expected["input_ids"].astype("int32"), "padding_mask": expected["attention_mask"].astype("int32")}
    return np.asarray(model(x)["logits"])


def quantized_copy(model, path):
    """`model` with each weight rounded as the file stores it (quantize -> dequantize in the file's
    tensor type), in Hugging Face layout: llama.cpp's blocks run along rows, so the Q/K row
    permutation does not change which weights share a block."""
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    for entry in hub.weight_map(model):
        array = np.asarray(entry.variable.numpy(), np.float32)
        array = array.T if entry.transpose else array
        qtype = types[gguf_writer.gguf_name(entry.key)]
        rounded = gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(array), qtype), qtype)
        rounded = rounded.reshape(array.shape)
        entry.variable.assign(rounded.T if entry.transpose else rounded)
    return model


@pytest.mark.parametrize("key", FILES)
def test_the_export_is_the_file_transformers_read(key, tokenizer, tmp_path):
    """Today's export of the fixture model is the committed file, field for field and byte for byte
    in every tensor: so what transformers verified (the next test) is what zoo writes now."""
    path = export(fixture_model(key, tokenizer), tmp_path / f"{key}.gguf", FILES[key][0])
    diff = differences(describe(path), describe(ROOT / f"{key}.gguf"))
    assert not diff, f"the export differs from the file transformers read in {diff[:8]}; if intended, rerun " \
                     "tools/make_gguf_fixtures.py make and check"


@pytest.mark.parametrize("key", FILES)
def test_transformers_logits_on_the_file_equal_zoo_logits(key, tokenizer, tmp_path):
    """transformers' logits on the committed file equal zoo's with the same (quantized) weights to
    float32 precision, and zoo's float32 model to within the quantization's error."""
    expected = np.load(ROOT / "expected.npz", allow_pickle=False)
    theirs = expected[f"logits/{key}"]
    real = expected["attention_mask"].astype(bool)
    model = fixture_model(key, tokenizer)
    exact = logits(model, expected)
    same = logits(quantized_copy(model, ROOT / f"{key}.gguf"), expected)
    scale = float(np.abs(theirs[real]).max())
    assert float(np.abs(same - theirs)[real].max()) < 1e-4 * scale
    # The parity figure: zoo's float32 model against transformers on the quantized file. This is the
    # quantization's own error (the line above shows the layouts agree); the fixture's weights are
    # N(0, 0.2), so q8_0's per-block rounding moves the logits more than a trained model's would.
    relative = float(np.abs(exact - theirs)[real].max()) / scale
    rms = float(np.sqrt(np.mean((exact - theirs)[real] ** 2) / np.mean(theirs[real] ** 2)))
    print(f"{key}: zoo float32 vs transformers on the GGUF: max |diff| / max |logit| {relative:.2e}, rms {rms:.2e}")
    assert relative < {"q8_0": 5e-2, "f16": 5e-3}[FILES[key][0]]


def test_the_tokenizer_metadata_means_the_same_tokenizer_to_transformers(tokenizer):
    """transformers builds its tokenizer from the file's tokens, types and merges; it splits the
    sentence into the ids zoo's keras-hub tokenizer gives."""
    expected = np.load(ROOT / "expected.npz", allow_pickle=False)
    ours = np.asarray(tokenizer(TEXT)).tolist()
    for key in FILES:
        assert expected[f"text_ids/{key}"].tolist() == ours


def test_the_file_says_what_llama_cpp_reads(tokenizer):
    """The keys llama.cpp's llama loader requires, with the model's values; norms stay F32; the
    tokenizer is padded to the model's vocabulary with UNUSED [PADi] tokens."""
    reader = gguf.GGUFReader(str(ROOT / "llama-q8_0.gguf"))
    field = {k: f.contents() for k, f in reader.fields.items()}
    assert field["general.architecture"] == "llama" and field["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert (field["llama.block_count"], field["llama.embedding_length"], field["llama.attention.head_count"],
            field["llama.attention.head_count_kv"], field["llama.rope.dimension_count"]) == (2, 32, 4, 2, 8)
    assert field["llama.rope.freq_base"] == 500000.0 and field["tokenizer.ggml.model"] == "gpt2"
    tokens, types = field["tokenizer.ggml.tokens"], field["tokenizer.ggml.token_type"]
    assert len(tokens) == 128 and tokens[100] == "[PAD100]" and types[100] == gguf.TokenType.UNUSED
    assert tokens[0] == "<|endoftext|>" and types[0] == gguf.TokenType.CONTROL
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.attn_norm.weight"] == kinds["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert kinds["blk.0.attn_q.weight"] == kinds["output.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(str(ROOT / "llama-tied-f16.gguf")).tensors}


def test_a_missing_rope_permutation_is_caught(tokenizer, tmp_path, monkeypatch):
    """The comparison with the committed file fails on exactly the query/key tensors when the
    writer forgets llama.cpp's row permutation (what transformers' logits would expose)."""
    monkeypatch.setattr(gguf_writer, "permute", lambda weight, heads: weight)
    path = export(fixture_model("llama-q8_0", tokenizer), tmp_path / "bad.gguf", "q8_0")
    diff = differences(describe(path), describe(ROOT / "llama-q8_0.gguf"))
    assert diff == [f"tensor blk.{i}.attn_{p}.weight" for i in range(2) for p in ("k", "q")]


def test_llama3_rope_becomes_rope_freqs_as_transformers_computes_it(tokenizer, tmp_path):
    """A llama3-scaled model (tests/fixtures/hf/llama32) gets llama.cpp's rope_freqs tensor: the
    plain frequencies divided by it are transformers' scaled inverse frequencies."""
    model = hub.load(REPO / "tests" / "fixtures" / "hf" / "llama32")
    path = gguf_writer.write_gguf(model, tmp_path / "llama32.gguf", quantize="f32", tokenizer=tokenizer)
    reader = gguf.GGUFReader(str(path))
    factors = next(np.asarray(t.data) for t in reader.tensors if t.name == "rope_freqs.weight")
    dim, theta = model.spec.head_dim, model.spec.rope_theta
    plain = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    inv_freq = np.load(REPO / "tests" / "fixtures" / "hf" / "llama32" / "expected.npz")["inv_freq"]
    np.testing.assert_allclose(plain / factors, inv_freq, rtol=1e-5)
    assert {"output.weight"} & {t.name for t in reader.tensors} == set()  # llama32 is tied


def test_transformers_loads_a_fresh_export(tokenizer, tmp_path):
    """Directly, where torch and transformers are installed (not in keras-zoo's own venv)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = fixture_model("llama-q8_0", tokenizer)
    export(model, tmp_path / "fresh.gguf", "q8_0")
    expected = np.load(SOURCE / "expected.npz", allow_pickle=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="fresh.gguf", dtype=torch.float32)
    with torch.no_grad():
        out = theirs(input_ids=torch.tensor(expected["input_ids"]),
                     attention_mask=torch.tensor(expected["attention_mask"])).logits.numpy()
    real = expected["attention_mask"].astype(bool)
    ours = logits(quantized_copy(model, tmp_path / "fresh.gguf"), expected)
    assert float(np.abs(out - ours)[real].max()) < 1e-4 * float(np.abs(out[real]).max())


@pytest.mark.parametrize("case", ["encoder", "backbone", "no tokenizer", "quantize", "suffix", "big tokenizer",
                                  "keras-quantized"])
def test_bad_input_is_refused_with_the_fix(case, tokenizer, tmp_path):
    args = dict(model=fixture_model("llama-q8_0", tokenizer), path=tmp_path / "x.gguf", tokenizer=tokenizer)
    expect = {"encoder": "Llama-family decoders", "backbone": "task='causal_lm'",
              "no tokenizer": "carries its tokenizer", "quantize": "q8_0, f16, f32",
              "suffix": "must end in .gguf", "big tokenizer": "the model's vocabulary is",
              "keras-quantized": "Keras-quantized layers"}
    if case == "encoder":
        args["model"] = zoo.get("enc-base", **dict(TINY_DEC, num_layers=1, num_kv_heads=4))
    elif case == "backbone":
        args["model"] = zoo.get("dec-base", task="backbone", **dict(TINY_DEC, num_layers=1))
    elif case == "no tokenizer":
        args["model"], args["tokenizer"] = zoo.get("dec-base", **dict(TINY_DEC, num_layers=1)), None
    elif case == "quantize":
        args["quantize"] = "q4_k"
    elif case == "suffix":
        args["path"] = tmp_path / "x.bin"
    elif case == "keras-quantized":  # a QLoRA base: its int8 kernels are not weights llama.cpp reads
        args["model"] = zoo.get("dec-base", **dict(TINY_DEC, num_layers=1))  # not the shared fixture model
        zoo.quantization.quantize_base(args["model"], "int8")
    else:
        args["model"] = zoo.get("dec-base", **dict(TINY_DEC, num_layers=1, vocab_size=64))
    with pytest.raises(ValueError, match=expect[case]):
        gguf_writer.write_gguf(**args)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_the_earlier_file(tokenizer, tmp_path, monkeypatch):
    """Written to a temporary sibling and renamed: a failure half-way through the tensors leaves
    the earlier file as it was and nothing else."""
    model = fixture_model("llama-q8_0", tokenizer)
    path = export(model, tmp_path / "model.gguf", "q8_0")
    before = path.read_bytes()
    calls = []

    def failing(data, qtype):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk full")
        return quantize(data, qtype)

    quantize = gguf.quants.quantize
    monkeypatch.setattr(gguf.quants, "quantize", failing)
    with pytest.raises(OSError, match="disk full"):
        gguf_writer.write_gguf(model, path, quantize="f16", tokenizer=tokenizer, overwrite=True)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.gguf"]
