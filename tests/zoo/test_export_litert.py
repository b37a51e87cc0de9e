"""TFLite prefill/decode files (zoo.export.litert) run by ai_edge_litert against Keras, and
the 2 GB flatbuffer check (zoo.export.size) that refuses an export before converting.

The model is transformers' tiny Llama of tests/fixtures/hf/llama-rope-parameters (grouped-
query attention), whose weights are spread enough that greedy decoding does not repeat one
token: equal tokens mean something."""

import numpy as np
import pytest

import zoo
from tests.common import REPO, TINY_DEC
from zoo import export, generation, hub
from zoo.export import convert, size

SOURCE = REPO / "tests" / "fixtures" / "hf" / "llama-rope-parameters"
PREFILL, CACHE, NEW = 8, 48, 16
SHORT = [5, 9, 33, 7, 1]  # one padded prefill call
LONG = list(range(3, 23))  # 20 tokens: two full chunks and a last one ending at the prompt's end


@pytest.fixture(scope="module")
def model():
    return hub.load(SOURCE)


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("litert")
    return {q or "float32": export.tflite_generator(model, tmp / f"{q}.tflite", quantize=q,
                                                           prefill_length=PREFILL, cache_length=CACHE)
            for q in (None, "int8")}


def keras_greedy(model, prompt, new=NEW):
    return generation.generate(model, [prompt] if np.ndim(prompt[0]) == 0 else prompt, new, compile=False)


def ops(path):
    from ai_edge_litert.interpreter import Interpreter

    return {op["op_name"] for op in Interpreter(model_path=str(path))._get_ops_details()}


def test_float32_generates_keras_greedy_tokens(model, files):
    """Exactly Keras' greedy tokens, for a prompt shorter than the prefill length and one that
    takes three prefill calls; built-in ops only."""
    runner = export.LiteRTGenerator(files["float32"].path)
    assert (runner.batch_size, runner.prefill_length, runner.cache_length) == (1, PREFILL, CACHE)
    assert runner.chunks(len(LONG)) == [0, 8, 12]
    for prompt in (SHORT, LONG):
        got, expected = runner.generate(prompt, NEW), keras_greedy(model, prompt)
        np.testing.assert_array_equal(got, expected)
        assert len(set(got[0, len(prompt):].tolist())) > 4  # not one repeated token
    assert not {op for op in ops(files["float32"].path) if op.startswith("Flex") or op == "CUSTOM"}


def test_int8_agreement_with_keras(model, files):
    """int8 weights (the converter's dynamic-range quantization): a smaller file whose greedy
    tokens follow Keras' for a while; the agreement is reported, the first token must agree."""
    runner = export.LiteRTGenerator(files["int8"].path)
    assert files["int8"].size_bytes < 0.7 * files["float32"].size_bytes
    agreement = []
    for prompt in (SHORT, LONG):
        got, expected = runner.generate(prompt, NEW)[0, len(prompt):], keras_greedy(model, prompt)[0, len(prompt):]
        same = got == expected
        first_difference = int(np.argmin(same)) if not same.all() else NEW
        agreement.append(first_difference)
        print(f"int8, prompt of {len(prompt)}: {int(same.sum())}/{NEW} tokens equal, first {first_difference} in a row")
        assert got[0] == expected[0]


def test_batch_rows_and_stop_tokens(model, tmp_path):
    """A file exported for two rows generates both rows as Keras does; a stop token cuts its row."""
    result = export.tflite_generator(model, tmp_path / "b2.tflite", prefill_length=PREFILL, cache_length=CACHE,
                                            batch_size=2)
    runner = export.LiteRTGenerator(result.path)
    prompts = [SHORT, [40, 2, 77, 3, 100]]
    expected = keras_greedy(model, prompts)
    np.testing.assert_array_equal(runner.generate(prompts, NEW), expected)
    stop = int(expected[0, len(SHORT) + 3])
    np.testing.assert_array_equal(runner.generate(prompts, NEW, stop_token_ids=[stop]),
                                  generation.generate(model, prompts, NEW, stop_token_ids=[stop], compile=False))
    with pytest.raises(ValueError, match="takes 2 prompt row"):
        runner.generate(SHORT, NEW)


@pytest.mark.parametrize("case, message", [
    ("prefill above max", "prefill_length=300 is outside this model's range 1..256"),
    ("prefill above cache", "longer than cache_length"), ("encoder", "need a decoder language model"),
    ("too long for the cache", "exceeds the file's cache of 48 positions")])
def test_bad_input_is_refused_with_the_fix(case, message, model, files, tmp_path):
    with pytest.raises(ValueError, match=message):
        if case == "prefill above max":
            export.tflite_generator(model, tmp_path / "x.tflite", prefill_length=300, cache_length=256)
        elif case == "prefill above cache":
            export.tflite_generator(model, tmp_path / "x.tflite", prefill_length=32, cache_length=16)
        elif case == "encoder":
            export.tflite_generator(zoo.get("enc-base", **dict(TINY_DEC, num_kv_heads=4)), tmp_path / "x.tflite")
        else:
            export.LiteRTGenerator(files["float32"].path).generate(LONG, CACHE)
    assert list(tmp_path.iterdir()) == []


def test_the_size_estimate_bounds_the_files(model, files, tmp_path):
    """Known before converting: each file is at most the estimate, and the estimate is at most its
    allowance for the graph (1 MiB) above the file."""
    files = dict(files)
    files["float16"] = export.tflite_generator(model, tmp_path / "f16.tflite", quantize="float16",
                                                      prefill_length=PREFILL, cache_length=CACHE)
    for quantize, result in files.items():
        assert result.size_bytes <= result.estimated_bytes <= result.size_bytes + size.OVERHEAD, quantize


def test_an_oversized_float_export_is_refused_before_converting(model, tmp_path, monkeypatch):
    """With the limit lowered between the model's int8 and float16 sizes: float32 and float16
    are refused, naming the size, the limit and the fix, without converting anything; int8 converts."""
    limit = (size.tflite_bytes(model, "int8") + size.tflite_bytes(model, "float16")) // 2
    monkeypatch.setattr(size, "FLATBUFFER_LIMIT", limit)
    real = convert.convert

    def must_not_convert(endpoints, quantize):
        assert quantize == "int8", f"converted a {quantize} model over the limit"
        return real(endpoints, quantize)

    monkeypatch.setattr(convert, "convert", must_not_convert)
    for quantize in (None, "float16"):
        with pytest.raises(ValueError) as error:
            export.tflite(model, tmp_path / "m.tflite", quantize=quantize, sequence_length=8)
        message = str(error.value)
        assert f"{size.tflite_bytes(model, quantize) / 1e9:.2f} GB" in message
        assert f"at most {limit / 1e9:.2f} GB" in message and "quantize='int8'" in message and "SavedModel" in message
        with pytest.raises(ValueError, match="flatbuffer holds at most"):
            export.tflite_generator(model, tmp_path / "g.tflite", quantize=quantize, prefill_length=PREFILL,
                                           cache_length=CACHE)
    assert list(tmp_path.iterdir()) == []
    report = export.tflite(model, tmp_path / "m.tflite", quantize="int8", sequence_length=8)
    assert report.size_bytes <= limit


def test_a_failed_conversion_leaves_nothing(model, tmp_path, monkeypatch):
    def crash(endpoints, quantize):
        raise RuntimeError("converter crashed")

    monkeypatch.setattr(convert, "convert", crash)
    with pytest.raises(RuntimeError, match="converter crashed"):
        export.tflite_generator(model, tmp_path / "g.tflite", prefill_length=PREFILL, cache_length=CACHE)
    assert list(tmp_path.iterdir()) == []
