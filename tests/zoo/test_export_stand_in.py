"""int8_mode="stand_in" (zoo.export.stand_in) on the families whose graphs the converter folds
differently: each file equals the converter's own dynamic-range file operator for operator.
(The Llama case, with the auto route and an interrupted export: test_export_litert.py.)

Norm scales and vectors are drawn around 1 rather than left at 1: a norm of all ones is removed by
the converter and then nothing is folded, which would hide the folds these tests are about."""

import numpy as np
import pytest

import zoo
from tests.common import TINY, TINY_DEC, same_graph_and_weights
from zoo import export
from zoo.export import stand_in


def spread(model):
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(1.0, 0.1, w.shape).astype(w.dtype) if w.ndim == 1
                       else rng.normal(0.0, 0.02, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


GENERATOR = dict(quantize="int8", prefill_length=8, cache_length=24)
# One block: every fold these tests follow is in each block (and the final norm and head), and a converted block
# is most of a file's conversion time; one block's files still compare 300-800 operators.
ONE_BLOCK, ONE_BLOCK_DEC = dict(TINY, num_layers=1), dict(TINY_DEC, num_layers=1)


@pytest.fixture(scope="module")
def decoder_files(tmp_path_factory):
    """decoder_files(name): the decoder's model, its file in each int8 mode, and the bytes the converter returned
    for its stand-in graph (before the real weights went in), made once per name."""
    made = {}

    def make(name):
        if name not in made:
            model, folder, converted = spread(zoo.get(name, **ONE_BLOCK_DEC)), tmp_path_factory.mktemp(name), []
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(stand_in, "write_weights", lambda flatbuffer, stand_ins: stand_in_writer(
                    flatbuffer, stand_ins, converted))
                files = {mode: export.tflite_generator(model, folder / f"{mode}.tflite", int8_mode=mode, **GENERATOR)
                         for mode in ("dynamic_range", "stand_in")}
            made[name] = model, files, converted[0]
        return made[name]

    return make


WRITE_WEIGHTS = stand_in.write_weights


def stand_in_writer(flatbuffer, stand_ins, converted):
    converted.append(flatbuffer)
    return WRITE_WEIGHTS(flatbuffer, stand_ins)


@pytest.mark.parametrize("name", ["gemma3-1b", "qwen2.5-0.5b"])
def test_decoders_with_folded_one_plus_norms_and_biases(name, decoder_files):
    """Gemma 3: (1 + scale) norms folded into the projections, q/k norms, sandwich norms, a tied
    embedding scaled after the lookup; Qwen2.5: projection biases."""
    _, files, _ = decoder_files(name)
    assert same_graph_and_weights(files["dynamic_range"].path, files["stand_in"].path) > 100
    runs = [export.LiteRTGenerator(f.path).generate([[5, 9, 33, 7]], 8) for f in files.values()]
    np.testing.assert_array_equal(*runs)


def test_an_encoders_serving_graph_and_bert_refused_with_the_fix(tmp_path):
    """ModernBERT's serving graph converts equal; BERT's learned positions are sliced to the
    exported length, which stand_in does not follow: refused, naming dynamic_range."""
    modernbert = spread(zoo.get("modernbert-base", task="classifier", num_classes=3, **ONE_BLOCK))
    reports = {mode: export.tflite(modernbert, tmp_path / f"{mode}.tflite", quantize="int8", sequence_length=16,
                                   int8_mode=mode) for mode in ("dynamic_range", "stand_in")}
    assert same_graph_and_weights(reports["dynamic_range"].path, reports["stand_in"].path) > 50
    assert reports["stand_in"].max_rel == reports["dynamic_range"].max_rel
    bert = zoo.get("enc-base", task="classifier", num_classes=3, **TINY)
    with pytest.raises(ValueError, match=r"position_embedding/embeddings \(512, 64\).*int8_mode='dynamic_range'"):
        export.tflite(bert, tmp_path / "bert.tflite", quantize="int8", sequence_length=16, int8_mode="stand_in")
    assert not (tmp_path / "bert.tflite").exists()


def test_a_weight_it_cannot_read_back_is_refused_not_left_a_stand_in(tmp_path, monkeypatch, decoder_files):
    """Without the tables' (1 + scale) entries, Gemma's folded norms are unreadable (as they were
    before stand_in followed them): the export is refused, naming the weights and the fix, and
    nothing is written. The converter's answer for this graph is the one it gave the export above."""
    from zoo.export import convert

    gemma, _, converted = decoder_files("gemma3-1b")

    def without_one_plus(flatbuffer, stand_ins):
        for table in (stand_ins.by_value, stand_ins.by_scale):
            for key in [key for key, placed in table.items() if placed[2]]:
                del table[key]
        return WRITE_WEIGHTS(flatbuffer, stand_ins)

    monkeypatch.setattr(convert, "convert", lambda endpoints, quantize: converted)
    monkeypatch.setattr(stand_in, "write_weights", without_one_plus)
    with pytest.raises(ValueError, match=r"kernel \(and \d+ more\) is not in the converted file.*dynamic_range"):
        export.tflite_generator(gemma, tmp_path / "g.tflite", int8_mode="stand_in", **GENERATOR)
    assert list(tmp_path.iterdir()) == []
