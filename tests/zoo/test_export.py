"""Exports checked from outside: a fresh TensorFlow-only process, saved_model_cli,
TF Serving requests and the LiteRT interpreter, each against the Keras model."""

import collections
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import zoo
from zoo import export
from zoo.export import convert, tflite_file

TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=120, max_sequence_length=32)
FAMILIES = {
    "bert": lambda **kw: zoo.get("enc-base", task="classifier", num_classes=3, **dict(TINY, **kw)),
    "llama": lambda **kw: zoo.get("dec-base", num_kv_heads=2, **dict(TINY, **kw)),
}
OUTPUTS = {"bert": ["logits", "pooled_output", "sequence_output"], "llama": ["next_token_logits"]}
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "##s", "##ing", "a", "big", "red", "sun"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
TEXTS = ["the cat sat on the mat", "a big red dog ran far away", "suns"]
SEQ = 12


def batch_for(model, batch_size=3, length=SEQ, seed=1):
    return export.parity_batch(model, batch_size, length, seed=seed)


def keras_reference(model, batch):
    """What serving must return, computed with the plain Keras model."""
    if model.spec.is_decoder:
        logits = np.asarray(model(batch, training=False)["logits"])
        last = np.maximum(batch["padding_mask"].sum(axis=1) - 1, 0)
        return {"next_token_logits": logits[np.arange(len(last)), last]}
    out = {k: np.asarray(v) for k, v in model.backbone(batch, training=False).items()}
    out["logits"] = np.asarray(model(batch, training=False)["logits"])
    return out


def assert_close(reference, outputs, atol):
    assert sorted(outputs) == sorted(reference)
    for name, ref in reference.items():
        np.testing.assert_allclose(outputs[name], ref, atol=atol, rtol=0, err_msg=name)


def signature_defs(path):
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    return saved.meta_graphs[0].signature_def, saved.meta_graphs[0].graph_def


def predict_request(name, signature, arrays):
    """A TF Serving PredictRequest for one signature, checked against its SignatureDef."""
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "zoo"
    request.model_spec.signature_name = name
    for key, value in arrays.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    assert sorted(request.inputs) == sorted(signature.inputs)
    for key, info in signature.inputs.items():
        assert request.inputs[key].dtype == info.dtype, key
        assert len(request.inputs[key].tensor_shape.dim) == len(info.tensor_shape.dim), key
    return predict_pb2.PredictRequest.FromString(request.SerializeToString())  # the wire round trip


FRESH_PROCESS = textwrap.dedent("""
    import contextlib, io, json, sys, numpy as np, tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
    report = {}
    for family, path in PATHS.items():
        loaded = tf.saved_model.load(path)
        results = {}
        for name, inputs in np.load(f"{TMP}/{family}-inputs.npz", allow_pickle=False).items():
            signature, _, key = name.partition("/")
            results.setdefault(signature, {})[key] = inputs
        out = {}
        for signature, inputs in results.items():
            for key, value in loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()}).items():
                out[signature + "/" + key] = value.numpy()
        too_long = {k: tf.ones([1, LIMIT + 1], tf.int32) for k in results["serving_default"]}
        try:
            loaded.signatures["serving_default"](**too_long)
            error = ""
        except tf.errors.InvalidArgumentError as e:
            error = e.message
        np.savez(f"{TMP}/{family}-outputs.npz", **out)
        report[family] = {"error": error}
    imported = any(m.split(".")[0] in ("zoo", "keras_hub") for m in sys.modules)
    # `saved_model_cli show --all DIR` for each export: the console script's main, here rather than in a
    # process of its own per export (each would import TensorFlow again)
    from tensorflow.python.tools import saved_model_cli
    for family, path in PATHS.items():
        sys.argv, shown = ["saved_model_cli", "show", "--dir", path, "--all"], io.StringIO()
        with contextlib.redirect_stdout(shown):
            try:
                saved_model_cli.main()
            except SystemExit as done:
                assert not done.code, done.code
        report[family]["saved_model_cli"] = shown.getvalue()
    print(json.dumps({"zoo_imported": imported, "families": report}))
""")


@pytest.fixture(scope="module")
def tokenizer():
    from keras_hub.tokenizers import WordPieceTokenizer

    return WordPieceTokenizer(vocabulary=VOCAB, lowercase=True)


@pytest.fixture(scope="module")
def served_families(tmp_path_factory, tokenizer):
    """Per family: a tiny model, its SavedModel, TF Serving requests for every signature, and what
    one fresh TensorFlow-only process (for both families: each process imports TensorFlow anew)
    returned for them, with `saved_model_cli show --all` of the export."""
    tmp, served, paths = tmp_path_factory.mktemp("served"), {}, {}
    for family in sorted(FAMILIES):
        keras.utils.set_random_seed(0)
        model = FAMILIES[family]()
        # generate=False: the decoder's generate signatures are tested in test_export_generate.py (~1 min to trace)
        path = export.saved_model(model, tmp / family, sequence_length=SEQ + 4, tokenizer=tokenizer, generate=False)
        signatures, _ = signature_defs(path)
        batch = batch_for(model)
        arrays = {"serving_default": batch, export.TEXT_SIGNATURE: {"text": np.array(TEXTS, dtype=object)}}
        requests = {name: predict_request(name, signatures[name], arrays[name]) for name in arrays}
        flat = {f"{name}/{key}": tf.make_ndarray(tensor)
                for name, r in requests.items() for key, tensor in r.inputs.items()}
        flat = {k: v.astype(bytes) if v.dtype == object else v for k, v in flat.items()}  # strings, without pickle
        np.savez(tmp / f"{family}-inputs.npz", **flat)
        paths[family] = str(path)
        served[family] = {"family": family, "model": model, "path": path, "batch": batch, "signatures": signatures,
                          "requests": requests}
    script = f"import json\nPATHS, TMP, LIMIT = {paths!r}, {str(tmp)!r}, {SEQ + 4}\n" + FRESH_PROCESS
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("PYTHONPATH", None)  # the fresh process must not see the project
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp,
                           timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    info = json.loads(fresh.stdout.strip().splitlines()[-1])
    for family, entry in served.items():
        outputs = collections.defaultdict(dict)
        for name, value in np.load(tmp / f"{family}-outputs.npz").items():
            signature, _, key = name.partition("/")
            outputs[signature][key] = value
        entry.update(outputs=outputs, saved_model_cli=info["families"][family].pop("saved_model_cli"),
                     info={"zoo_imported": info["zoo_imported"], **info["families"][family]})
    return served


@pytest.fixture(params=sorted(FAMILIES))
def served(request, served_families):
    """One family's entry of `served_families`."""
    return served_families[request.param]


def test_fresh_tensorflow_process_matches_keras(served):
    assert not served["info"]["zoo_imported"]
    assert_close(keras_reference(served["model"], served["batch"]), served["outputs"]["serving_default"], atol=1e-5)


def test_text_signature_tokenizes_in_the_graph(served, tokenizer):
    model = served["model"]
    ids = [[2] + list(np.asarray(tokenizer(t))) for t in TEXTS] if not model.spec.is_decoder else \
        [list(np.asarray(tokenizer(t))) for t in TEXTS]
    length = SEQ + 4
    token_ids = np.zeros((len(TEXTS), length), np.int32)
    for row, seq in enumerate(ids):
        seq = seq + ([3] if not model.spec.is_decoder else [])
        token_ids[row, :len(seq)] = seq
    batch = {"token_ids": token_ids, "padding_mask": (token_ids != 0).astype(np.int32),
             "segment_ids": np.zeros_like(token_ids)}
    batch = {k: batch[k] for k in model.input}
    assert np.asarray(tokenizer("suns")).tolist() == [VOCAB.index("sun"), VOCAB.index("##s")]
    assert_close(keras_reference(model, batch), served["outputs"][export.TEXT_SIGNATURE], atol=1e-5)


def test_too_long_input_is_refused_at_serving_time(served):
    assert f"exceeds the exported length of {SEQ + 4} tokens" in served["info"]["error"]


def test_signatures_and_requests(served):
    signatures = served["signatures"]
    assert {"serving_default", export.TEXT_SIGNATURE} <= set(signatures)
    serving = signatures["serving_default"]
    assert sorted(serving.inputs) == sorted(served["model"].input)
    assert sorted(serving.outputs) == OUTPUTS[served["family"]]
    assert serving.method_name == "tensorflow/serving/predict"
    assert signatures[export.TEXT_SIGNATURE].inputs["text"].dtype == tf.string.as_datatype_enum
    assert served["requests"]["serving_default"].model_spec.signature_name == "serving_default"


def test_weights_are_stored_once(served):
    weights = sum(p.stat().st_size for p in (served["path"] / "variables").iterdir())
    params = served["model"].count_params() * 4
    assert params <= weights < 1.1 * params + 50_000


def test_saved_model_cli_lists_signatures(served):
    text = served["saved_model_cli"]  # `saved_model_cli show --all`, run by the fresh process
    assert "signature_def['serving_default']" in text and "signature_def['text']" in text
    for name in served["model"].input:
        assert f"inputs['{name}'] tensor_info:\n        dtype: DT_INT32\n        shape: (-1, -1)" in text
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in text
    hidden, vocab = TINY["hidden_dim"], TINY["vocab_size"]
    expected = {"bert": {"sequence_output": f"(-1, -1, {hidden})", "pooled_output": f"(-1, {hidden})",
                         "logits": "(-1, 3)"},
                "llama": {"next_token_logits": f"(-1, {vocab})"}}[served["family"]]
    for name, shape in expected.items():
        assert f"outputs['{name}'] tensor_info:\n        dtype: DT_FLOAT\n        shape: {shape}" in text


# Each family in float32 (its serving graph, exact to 1e-5), and each quantization once: the converter's
# float16 and int8 options apply to the whole graph alike whatever the family (the int8 decoder files of
# test_export_litert.py and test_export_stand_in.py quantize decoders again).
@pytest.mark.parametrize("family, quantize, tolerance", [
    ("bert", None, 1e-5), ("llama", None, 1e-5), ("bert", "float16", 5e-3), ("llama", "int8", 5e-2)])
def test_tflite_parity(family, quantize, tolerance, tmp_path):
    keras.utils.set_random_seed(0)
    model = FAMILIES[family]()
    report = export.tflite(model, tmp_path / "m.tflite", quantize=quantize, batch_size=2, sequence_length=SEQ)
    assert report.quantize == (quantize or "float32") and report.size_bytes == (tmp_path / "m.tflite").stat().st_size
    assert sorted(report.outputs) == OUTPUTS[family]
    assert report.max_rel <= tolerance, str(report)
    # Independently of the report: run the file on another batch and compare with Keras.
    batch = batch_for(model, batch_size=2, seed=7)
    reference = keras_reference(model, batch)
    got = export.run_tflite(tmp_path / "m.tflite", batch)
    for name, ref in reference.items():
        assert np.max(np.abs(got[name] - ref)) <= tolerance * np.max(np.abs(ref)), name
    if quantize is None:
        assert_close(reference, got, atol=1e-5)
    else:  # quantization really changed the numbers (the check above is not vacuous)
        assert report.max_abs > 1e-6


def test_masked_lm_exports_with_mask_positions(tmp_path, tokenizer):
    keras.utils.set_random_seed(0)
    model = zoo.get("enc-base", task="masked_lm", **TINY)
    report = export.tflite(model, tmp_path / "mlm.tflite", batch_size=2, sequence_length=SEQ)
    assert sorted(report.outputs) == ["logits", "sequence_output"] and report.max_rel <= 1e-5
    batch = batch_for(model, batch_size=2, seed=3)
    got = export.run_tflite(tmp_path / "mlm.tflite", batch)
    np.testing.assert_allclose(got["logits"], model(batch)["logits"], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="mask_positions"):
        export.saved_model(model, tmp_path / "sm", tokenizer=tokenizer)
    assert [p.name for p in tmp_path.iterdir()] == ["mlm.tflite"]


def test_new_families_export_to_tflite(tmp_path, tokenizer):
    """Issue 23's layers (scaled embeddings, (1 + w) and Q/K norms, GeGLU, a window shorter than the rows)
    convert and run in LiteRT as in Keras (a ModernBERT classifier passed too: left out for time); ModernBERT's
    text signature packs [CLS] text [SEP] and no segments."""
    keras.utils.set_random_seed(0)
    model = zoo.get("gemma3-1b", **TINY, num_kv_heads=1, head_dim=16, layer_kinds=("local", "global"),
                    sliding_window=5)
    report = export.tflite(model, tmp_path / "m.tflite", batch_size=2, sequence_length=SEQ)
    assert report.max_rel <= 1e-5, str(report)
    encoder = zoo.get("modernbert-base", task="classifier", num_classes=3, **TINY)
    packed = export.text_packer(encoder, tokenizer, SEQ)(tf.constant(["the cat"]))
    assert sorted(packed) == ["padding_mask", "token_ids"]
    assert list(packed["token_ids"][0, :4].numpy()) == [VOCAB.index(t) for t in ("[CLS]", "the", "cat", "[SEP]")]


def op_types(path):
    _, graph = signature_defs(path)
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return collections.Counter(n.op for n in nodes), graph.SerializeToString()


def test_checkpointed_model_exports_the_same_graph(tmp_path):
    """A model built with `full`, then switched to `selective`, exports the inference
    graph of a model without recomputation: the same ops, no recompute wrapper, the
    same outputs."""
    keras.utils.set_random_seed(0)
    one_block = dict(num_layers=1)  # the recompute wrapper is per block: one shows it, in half the tracing
    plain = FAMILIES["bert"](**one_block)
    checkpointed = FAMILIES["bert"](checkpointing="full", **one_block)
    checkpointed.set_weights(plain.get_weights())
    a = export.saved_model(plain, tmp_path / "plain")
    ops_a, _ = op_types(a)
    batch = batch_for(plain)
    out_a = tf.saved_model.load(str(a)).signatures["serving_default"](**batch)
    for policy in ("full", "selective"):
        assert checkpointed.set_checkpointing(policy) == checkpointed.checkpointing == policy
        b = export.saved_model(checkpointed, tmp_path / policy)
        ops_b, graph_b = op_types(b)
        assert ops_a == ops_b, policy
        assert b"recompute" not in graph_b.lower(), policy
        out_b = tf.saved_model.load(str(b)).signatures["serving_default"](**batch)
        for name in out_a:
            np.testing.assert_array_equal(out_a[name].numpy(), out_b[name].numpy(), err_msg=f"{policy}: {name}")


# Bad input ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoder():
    """One block: these tests are about files, options and the CLI, which no block count changes, and each
    of their exports traces (and converts) every block."""
    keras.utils.set_random_seed(0)
    return FAMILIES["bert"](num_layers=1)


def test_existing_path_is_not_overwritten(encoder, tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("earlier export")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export.saved_model(encoder, target)
    (tmp_path / "m.tflite").write_bytes(b"earlier")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export.tflite(encoder, tmp_path / "m.tflite")
    assert (target / "keep.txt").read_text() == "earlier export"
    assert (tmp_path / "m.tflite").read_bytes() == b"earlier"
    export.saved_model(encoder, target, overwrite=True)
    assert not (target / "keep.txt").exists() and (target / "saved_model.pb").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tflite", "model"]


def test_interrupted_export_leaves_the_earlier_one(encoder, tmp_path, monkeypatch):
    target = tmp_path / "model"
    (target / "variables").mkdir(parents=True)
    (target / "saved_model.pb").write_bytes(b"earlier export")
    (target / "variables" / "variables.index").write_bytes(b"earlier weights")
    before = sorted((p.relative_to(target), p.read_bytes()) for p in target.rglob("*") if p.is_file())

    def crash(archive, export_dir, **kwargs):  # dies half-way through writing
        os.makedirs(export_dir)
        open(os.path.join(export_dir, "saved_model.pb"), "wb").write(b"half")
        raise KeyboardInterrupt

    # The writer of the archive class export uses (TensorFlow's). Not tf.saved_model.save: the
    # first export in a process sets that attribute again, undoing the patch (the test then
    # passed only when another export had run before it).
    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", crash)
    with pytest.raises(KeyboardInterrupt):
        export.saved_model(encoder, target, overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        export.saved_model(encoder, tmp_path / "new")
    assert sorted((p.relative_to(target), p.read_bytes()) for p in target.rglob("*") if p.is_file()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]

    # TFLite: the new file is written, then its parity check dies; the earlier file stays.
    earlier = tmp_path / "m.tflite"
    earlier.write_bytes(b"earlier tflite")

    def check_dies(path, inputs):
        assert Path(path).read_bytes() == b"new flatbuffer" and Path(path) != earlier  # a temporary sibling
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "convert", lambda endpoints, quantize: b"new flatbuffer")
    monkeypatch.setattr(tflite_file, "run_tflite", check_dies)
    for path, overwrite in ((earlier, True), (tmp_path / "new.tflite", False)):
        with pytest.raises(KeyboardInterrupt):
            export.tflite(encoder, path, overwrite=overwrite, sequence_length=8)
    assert earlier.read_bytes() == b"earlier tflite"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tflite", "model"]


def test_bad_models_and_options(encoder, tmp_path):
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="never built"):
        export.saved_model(unbuilt, tmp_path / "a")
    with pytest.raises(ValueError, match="not a zoo model"):
        export.tflite(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), tmp_path / "a.tflite")
    with pytest.raises(ValueError, match="not a zoo model"):
        export.saved_model(keras.layers.Dense(2), tmp_path / "a")
    with pytest.raises(ValueError, match="Unknown quantization 'int4'"):
        export.tflite(encoder, tmp_path / "a.tflite", quantize="int4")
    with pytest.raises(ValueError, match="must end in .tflite"):
        export.tflite(encoder, tmp_path / "a.lite")
    with pytest.raises(ValueError, match="outside this model's range 1..32"):
        export.saved_model(encoder, tmp_path / "a", sequence_length=33)
    assert list(tmp_path.iterdir()) == []


def test_cli_saved_model_vocabulary_lowercase_overwrite(encoder, tmp_path, capsys):
    """`zoo export model.keras --format saved_model --vocabulary vocab.txt --lowercase`:
    the `text` signature lower-cases before WordPiece, so "THE Cat SAT" serves as
    "the cat sat" does, and as its token ids do. Exported again with --overwrite and
    without --lowercase, upper-case words become [UNK]. --quantize is refused for a
    SavedModel, and an existing export is kept unless --overwrite."""
    from zoo.cli import main

    importlib.import_module("tensorflow_text")  # registers the tokenizer ops the text signature loads
    encoder.save(tmp_path / "tiny.keras")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    out = tmp_path / "sm"
    base = ["export", str(tmp_path / "tiny.keras"), "--format", "saved_model", "-o", str(out), "--sequence-length", "8"]

    assert main(base + ["--quantize", "int8"]) == 2
    assert "does not apply to --format saved_model" in capsys.readouterr().err and not out.exists()
    assert main(base + ["--vocabulary", str(vocab), "--lowercase"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    ids = np.zeros((1, 8), np.int32)
    ids[0, :5] = [VOCAB.index(t) for t in ("[CLS]", "the", "cat", "sat", "[SEP]")]
    by_ids = {"token_ids": ids, "padding_mask": (ids != 0).astype(np.int32), "segment_ids": np.zeros_like(ids)}

    def serve(texts):
        loaded = tf.saved_model.load(str(out))
        text = loaded.signatures[export.TEXT_SIGNATURE](text=tf.constant(texts))
        return {k: v.numpy() for k, v in text.items()}, loaded.signatures["serving_default"](**by_ids)

    text, reference = serve(["THE Cat SAT", "the cat sat"])
    for name, value in reference.items():
        np.testing.assert_allclose(text[name][0], value.numpy()[0], atol=1e-5, err_msg=name)
        np.testing.assert_allclose(text[name][1], value.numpy()[0], atol=1e-5, err_msg=name)

    assert main(base + ["--vocabulary", str(vocab)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(base + ["--vocabulary", str(vocab), "--overwrite"]) == 0  # now without --lowercase
    text, _ = serve(["THE Cat SAT", "the cat sat"])
    assert np.abs(text["logits"][0] - text["logits"][1]).max() > 1e-4  # [UNK] [UNK] [UNK] is another input
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sm", "tiny.keras", "vocab.txt"]


def test_cli_exports_a_saved_keras_file(encoder, tmp_path, capsys):
    from zoo.cli import main

    encoder.save(tmp_path / "tiny.keras")
    out = tmp_path / "tiny.tflite"
    args = ["export", str(tmp_path / "tiny.keras"), "--format", "tflite", "--quantize", "int8",
            "--sequence-length", "8", "-o", str(out)]
    # A fresh process: the .keras file must load without the test having imported zoo's models.
    done = subprocess.run([sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(int8," in done.stdout and "max rel" in done.stdout and out.stat().st_size > 0
    assert main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["export", "no-such-model", "--format", "saved_model"]) == 2
    assert "neither a registered model" in capsys.readouterr().err
