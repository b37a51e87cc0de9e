"""TFLite prefill/decode files (zoo.export.litert) run by ai_edge_litert against Keras, and
the 2 GB flatbuffer check (zoo.export.size) that refuses an export before converting.

The model is transformers' tiny Llama of tests/fixtures/hf/llama-rope-parameters (grouped-
query attention), whose weights are spread enough that greedy decoding does not repeat one
token: equal tokens mean something."""

import functools

import numpy as np
import pytest

import zoo
from tests.common import REPO, TINY_DEC, same_graph_and_weights
from zoo import export, generation, hub
from zoo.export import convert, size, stand_in
from zoo.memory import budget

SOURCE = REPO / "tests" / "fixtures" / "hf" / "llama-rope-parameters"
PREFILL, CACHE, NEW = 8, 48, 16
SHORT = [[5, 9, 33, 7, 1], [40, 2, 77, 3, 100]]  # one padded prefill call
LONG = [list(range(3, 23)), list(range(60, 40, -1))]  # 20 tokens: two full chunks and a last one ending at its end


@pytest.fixture(scope="module")
def model():
    """The fixture Llama with two query channels of block 0 edited: one all zero, one under the converter's
    smallest int8 range (the channels test_stand_in_writes_the_converters_int8_file... must quantize as the
    converter does; the other tests read this model as any other)."""
    model = hub.load(SOURCE)
    kernel = model.backbone.blocks[0].attention.query_dense.kernel
    edited = kernel.numpy()
    edited[:, 0] = 0.0
    edited[:, 1] *= 2e-7 / np.abs(edited[:, 1]).max()
    kernel.assign(edited)
    return model


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    """float32 for two rows, int8 (the converter's dynamic range) for one."""
    tmp = tmp_path_factory.mktemp("litert")
    return {"float32": export.tflite_generator(model, tmp / "f32.tflite", prefill_length=PREFILL, cache_length=CACHE,
                                               batch_size=2),
            "int8": export.tflite_generator(model, tmp / "int8.tflite", quantize="int8", prefill_length=PREFILL,
                                            cache_length=CACHE, int8_mode="dynamic_range")}


@functools.cache
def _greedy(model, rows, stop):
    return generation.generate(model, [list(r) for r in rows], NEW, stop_token_ids=list(stop) or None, compile=False)


def keras_greedy(model, rows, stop=()):
    """Keras' greedy tokens (eager: tracing the loop would cost more than it saves), once per request."""
    return _greedy(model, tuple(map(tuple, rows)), tuple(stop))


def ops(path):
    from ai_edge_litert.interpreter import Interpreter

    return {op["op_name"] for op in Interpreter(model_path=str(path))._get_ops_details()}


def test_float32_generates_keras_greedy_tokens(model, files):
    """Exactly Keras' greedy tokens, two rows per call, for prompts shorter than the prefill length
    and prompts that take three prefill calls; a stop token cuts its row only; built-in ops only."""
    runner = export.LiteRTGenerator(files["float32"].path)
    assert (runner.batch_size, runner.prefill_length, runner.cache_length) == (2, PREFILL, CACHE)
    assert runner.chunks(len(LONG[0])) == [0, 8, 12]
    for prompts in (SHORT, LONG):
        got, expected = runner.generate(prompts, NEW), keras_greedy(model, prompts)
        np.testing.assert_array_equal(got, expected)
        assert len(set(got[0, len(prompts[0]):].tolist())) > 4  # not one repeated token
    new = [expected[row, len(LONG[row]):] for row in range(2)]
    # a token that row 0 generates first at `at` (before its last) and row 1 never: it cuts row 0 only
    at = next(i for i in range(1, NEW - 1) if new[0][i] not in new[1] and new[0][i] not in new[0][:i])
    stop = int(new[0][at])
    cut = runner.generate(LONG, NEW, stop_token_ids=[stop])
    np.testing.assert_array_equal(cut, keras_greedy(model, LONG, [stop]))
    assert not cut[0, len(LONG[0]) + at + 1:].any() and cut[1, -1] == expected[1, -1]
    with pytest.raises(ValueError, match="takes 2 prompt row"):
        runner.generate(SHORT[0], NEW)
    assert not {op for op in ops(files["float32"].path) if op.startswith("Flex") or op == "CUSTOM"}


def int8_agreement(model, path, how):
    """int8 greedy tokens follow Keras' for a while; the agreement is printed, the first token must agree."""
    runner = export.LiteRTGenerator(path)
    for prompts in (SHORT, LONG):
        got, expected = runner.generate(prompts[0], NEW)[0], keras_greedy(model, prompts)[0]
        got, expected = got[len(prompts[0]):], expected[len(prompts[0]):]
        same = got == expected
        first_difference = int(np.argmin(same)) if not same.all() else NEW
        print(f"int8 {how}, prompt of {len(prompts[0])}: {int(same.sum())}/{NEW} tokens equal, first "
              f"{first_difference} in a row")
        assert got[0] == expected[0]


def test_int8_agreement_with_keras(model, files):
    """int8 weights from the converter's dynamic-range quantization: a smaller file whose greedy
    tokens follow Keras' (the float32 file holds two rows' caches, not more weights)."""
    assert files["int8"].int8_mode == "dynamic_range"
    assert files["int8"].size_bytes < 0.7 * files["float32"].size_bytes
    int8_agreement(model, files["int8"].path, "dynamic_range")


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


def test_the_size_estimate_bounds_the_files(files):
    """Known before converting: each file is at most the estimate, and the estimate is at most its
    allowance for the graph (1 MiB) above the file (float16, 2 bytes a weight, was checked so once;
    converting it costs ~4 s, so the test keeps the float32 and int8 files it has)."""
    for quantize, result in files.items():
        assert result.size_bytes <= result.estimated_bytes <= result.size_bytes + size.OVERHEAD, quantize


def test_an_oversized_float_export_is_refused_before_converting(model, tmp_path, monkeypatch):
    """With the limit lowered between the model's int8 and float16 sizes: float32 and float16
    are refused, naming the size, the limit and the fix, without converting anything (int8 converts
    under that limit: test_stand_in_writes_the_converters_int8_file...)."""
    limit = (size.tflite_bytes(model, "int8") + size.tflite_bytes(model, "float16")) // 2
    monkeypatch.setattr(size, "FLATBUFFER_LIMIT", limit)

    def must_not_convert(endpoints, quantize):
        raise AssertionError(f"converted a {quantize} model over the limit")

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


def test_a_failed_conversion_leaves_nothing(model, tmp_path, monkeypatch):
    def crash(endpoints, quantize):
        raise RuntimeError("converter crashed")

    monkeypatch.setattr(convert, "convert", crash)
    with pytest.raises(RuntimeError, match="converter crashed"):
        export.tflite_generator(model, tmp_path / "g.tflite", prefill_length=PREFILL, cache_length=CACHE)
    assert list(tmp_path.iterdir()) == []


def test_stand_in_writes_the_converters_int8_file_and_auto_takes_it_when_memory_is_short(model, files, tmp_path,
                                                                                          monkeypatch, caplog):
    """int8_mode="auto" with less memory available than the converter's dynamic-range peak takes
    the stand_in route: its file equals the converter's own int8 file of the same model operator
    for operator, int8 bytes and scales included (channels that are all zero, or under the
    converter's smallest range, too: the model fixture's), generates the same tokens, fits the size
    estimate under a flatbuffer limit lowered below the float16 file, and leaves the model's weights
    as they were."""
    before = [v.numpy() for v in model.weights]
    direct = files["int8"]  # the converter's dynamic-range file of the same model and shapes
    monkeypatch.setattr(budget, "available_bytes", lambda: size.conversion_bytes(model, "int8", "dynamic_range") - 1)
    monkeypatch.setattr(size, "FLATBUFFER_LIMIT", (size.tflite_bytes(model, "int8")
                                                   + size.tflite_bytes(model, "float16")) // 2)
    result = export.tflite_generator(model, tmp_path / "stand_in.tflite", quantize="int8", prefill_length=PREFILL,
                                     cache_length=CACHE)
    assert result.int8_mode == "stand_in" and "int8_mode='stand_in'" in caplog.text
    assert same_graph_and_weights(direct.path, result.path) > 100
    assert result.size_bytes <= result.estimated_bytes <= size.FLATBUFFER_LIMIT
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(model.weights, before))
    np.testing.assert_array_equal(export.LiteRTGenerator(result.path).generate(LONG[0], NEW),
                                  export.LiteRTGenerator(direct.path).generate(LONG[0], NEW))


def test_an_interrupted_stand_in_export_leaves_nothing(model, tmp_path, monkeypatch):
    """Writing the real weights fails: the error is raised and no file is left. (What the converter
    returns is not read before the failure, so it is not converted here.)"""
    def crash(flatbuffer, stand_ins):
        raise RuntimeError("writing the weights failed")

    monkeypatch.setattr(convert, "convert", lambda endpoints, quantize: b"the converter's flatbuffer")
    monkeypatch.setattr(stand_in, "write_weights", crash)
    with pytest.raises(RuntimeError, match="writing the weights failed"):
        export.tflite_generator(model, tmp_path / "w8.tflite", quantize="int8", int8_mode="stand_in",
                                prefill_length=PREFILL, cache_length=CACHE)
    assert list(tmp_path.iterdir()) == []
