"""The SavedModel `generate` and `generate_text` signatures (zoo.export.generate), run by a
fresh process in which keras, keras_hub and zoo cannot be imported, against
`zoo.generation.generate` in this one: greedy, seeded top-k / top-p / temperature, two
prompts of different lengths, an end token in one row, text in and out."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import zoo
from tests.common import REPO, TINY_DEC
from zoo import export, generation
from zoo.generation.sampling import SAMPLER_OPTIONS
from zoo.hub.tokenizers import byte_pair

PROMPTS = [[5, 9, 33, 7, 1, 60], [3, 4, 8]]
TEXTS = ["The lazy fox", "a tiny file is"]
NEW = 8
LIMIT = 40  # max_sequence_length of the tiny model
# request name -> (sampler, top_k, top_p, temperature, seed)
SETTINGS = {"greedy": ("greedy", 1, 1.0, 1.0, 0), "top_k": ("top_k", 5, 1.0, 1.0, 7),
            "top_p": ("top-p", 1, 0.8, 0.7, 3), "temperature": ("temperature", 1, 1.0, 1.3, 11)}

FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    blocked = ("keras", "keras_hub", "zoo", "tf_keras")
    for name in blocked:
        sys.modules[name] = None  # any import of these fails: the SavedModel must not need them
    import numpy as np, tensorflow as tf
    requests = {}
    for key, value in np.load(INPUTS, allow_pickle=False).items():
        signature, request, name = key.split("/")
        requests.setdefault((signature, request), {})[name] = value
    results, errors, imported = {}, {}, {}
    for signature, path in (("generate", IDS_PATH), ("generate_text", TEXT_PATH)):
        if signature == "generate_text":
            # tensorflow_text registers the tokenizer ops the text export holds, and imports tf.keras itself
            del sys.modules["keras"], sys.modules["tf_keras"]
            import tensorflow_text  # noqa: F401
        loaded = tf.saved_model.load(path)
        for (name, request), inputs in sorted(requests.items()):
            if name != signature:
                continue
            try:
                got = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
                results.update({f"{signature}/{request}/{k}": v.numpy().astype(bytes) if v.dtype == tf.string
                                else v.numpy() for k, v in got.items()})
            except tf.errors.InvalidArgumentError as e:
                errors[request] = e.message
        imported[signature] = sorted(m for m in sys.modules if sys.modules[m] is not None
                                     and m.split(".")[0] in blocked)
    np.savez(OUTPUTS, **results)
    print(json.dumps({"errors": errors, "imported": imported}))
""")
def settings(name, end=-1, new=NEW):
    sampler, k, p, t, seed = SETTINGS[name]
    return {"max_new_tokens": np.int32(new), "sampler": np.bytes_(sampler), "top_k": np.int32(k),
            "top_p": np.float32(p), "temperature": np.float32(t), "seed": np.int32(seed),
            "end_token_id": np.int32(end)}


def reference(model, prompts, name, stop_token_ids=None, tokenizer=None):
    """zoo.generation.generate, run eagerly (the compiled loop takes ~8 s to trace per sampler here,
    and test_generation_batch.py shows the eager loop equals the compiled one), once per request."""
    key = (name, str(prompts), tuple(stop_token_ids or ()), tokenizer is not None)
    if key not in REFERENCES:
        sampler, k, p, t, seed = SETTINGS[name]
        # the exported signature takes every setting and ignores what its sampler does not draw with
        takes = SAMPLER_OPTIONS[sampler.replace("-", "_")]
        options = {name: value for name, value in {"top_k": k, "top_p": p, "temperature": t}.items() if name in takes}
        REFERENCES[key] = generation.generate(model, prompts, NEW, sampler=sampler, seed=seed, compile=False,
                                              stop_token_ids=stop_token_ids, tokenizer=tokenizer, **options)
    return REFERENCES[key]


REFERENCES = {}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny decoder with a byte-level BPE tokenizer, its SavedModel, and what a TensorFlow-only
    process returned for each request."""
    keras.utils.set_random_seed(0)
    # one block and the plain attention core: tracing the loop is most of the export time, and the
    # chunked core's own loops double it (the core does not change what the signatures do; the
    # reference runs the same core)
    model = zoo.get("dec-base", **dict(TINY_DEC, num_layers=1, max_sequence_length=LIMIT))
    model.set_attention("plain")
    tokenizer = byte_pair(REPO / "tests" / "fixtures" / "gguf" / "tokenizer", unsplittable_tokens=["<|endoftext|>"])
    tmp = tmp_path_factory.mktemp("generate")
    ids_path = export.saved_model(model, tmp / "ids")
    text_path = export.saved_model(model, tmp / "text", tokenizer=tokenizer)
    ids = np.zeros((2, 6), np.int32)
    for i, row in enumerate(PROMPTS):
        ids[i, :len(row)] = row
    mask = (np.arange(6)[None] < np.array([[len(r)] for r in PROMPTS])).astype(np.int32)
    # an end token: the third new token of row 0 under seeded temperature sampling
    sampled = reference(model, PROMPTS, "temperature")
    end = int(sampled[0, len(PROMPTS[0]) + 2])
    requests = {f"generate/{name}": {"token_ids": ids, "padding_mask": mask, **settings(name)} for name in SETTINGS}
    requests["generate/end"] = {"token_ids": ids, "padding_mask": mask, **settings("temperature", end=end)}
    requests["generate/too_long"] = {"token_ids": ids, "padding_mask": mask, **settings("greedy", new=LIMIT)}
    requests["generate/no_new_tokens"] = {"token_ids": ids, "padding_mask": mask, **settings("greedy", new=-1)}
    requests["generate/left_padded"] = {"token_ids": ids, "padding_mask": mask[:, ::-1].copy(), **settings("greedy")}
    requests["generate/bad_sampler"] = {"token_ids": ids, "padding_mask": mask,
                                        **settings("greedy"), "sampler": np.bytes_("beam")}
    requests["generate_text/greedy"] = {"text": np.array(TEXTS, dtype=bytes), **settings("greedy")}
    requests["generate_text/top_k"] = {"text": np.array(TEXTS, dtype=bytes), **settings("top_k")}
    flat = {f"{request}/{k}": np.asarray(v) for request, inputs in requests.items() for k, v in inputs.items()}
    np.savez(tmp / "inputs.npz", **flat)
    script = (f"IDS_PATH, TEXT_PATH, INPUTS, OUTPUTS = {str(ids_path)!r}, {str(text_path)!r}, "
              f"{str(tmp / 'inputs.npz')!r}, {str(tmp / 'outputs.npz')!r}\n" + FRESH_PROCESS)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("PYTHONPATH", None)
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp,
                           timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    info = json.loads(fresh.stdout.strip().splitlines()[-1])
    return {"model": model, "tokenizer": tokenizer, "end": end, "sampled": sampled, "info": info,
            "outputs": dict(np.load(tmp / "outputs.npz", allow_pickle=False))}


def test_the_fresh_process_needed_neither_keras_nor_zoo(served):
    """The token-id export loaded and ran with keras, keras_hub and zoo unimportable; the text
    export needs tensorflow_text, which imports tf.keras itself, and still neither keras_hub nor zoo."""
    imported = served["info"]["imported"]
    assert imported["generate"] == []
    assert imported["generate_text"] and not [m for m in imported["generate_text"] if m.split(".")[0] != "keras"]


@pytest.mark.parametrize("name", SETTINGS)
def test_generate_equals_zoo_generation(served, name):
    """Greedy and seeded sampling, two prompts of different lengths: the same tokens as
    zoo.generation.generate, row i holding its prompt, its NEW new tokens, then zeros."""
    expected = reference(served["model"], PROMPTS, name)
    got = served["outputs"][f"generate/{name}/token_ids"]
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(served["outputs"][f"generate/{name}/lengths"], [len(p) + NEW for p in PROMPTS])
    if name != "greedy":  # a real draw: not greedy's tokens
        assert not np.array_equal(got, reference(served["model"], PROMPTS, "greedy"))


def test_an_end_token_ends_its_row_only(served):
    """Row 0 generates the end token as its third new token: it stops there, padded with 0; row 1,
    which does not generate it, runs its full NEW tokens, as in zoo.generation with stop_token_ids."""
    end, sampled = served["end"], served["sampled"]
    got = served["outputs"]["generate/end/token_ids"]
    expected = reference(served["model"], PROMPTS, "temperature", stop_token_ids=[end])
    np.testing.assert_array_equal(got, expected)
    lengths = served["outputs"]["generate/end/lengths"].tolist()
    assert lengths[0] == len(PROMPTS[0]) + 3 and got[0, lengths[0] - 1] == end and not got[0, lengths[0]:].any()
    if end not in sampled[1, len(PROMPTS[1]):len(PROMPTS[1]) + NEW]:
        assert lengths[1] == len(PROMPTS[1]) + NEW


@pytest.mark.parametrize("name", ["greedy", "top_k"])
def test_generate_text_equals_zoo_generation_on_text(served, name):
    """Strings in, strings out (the keras-hub tokenizer in the graph): the texts zoo.generation
    returns for text prompts."""
    expected = reference(served["model"], TEXTS, name, tokenizer=served["tokenizer"])
    got = [t.decode("utf-8") for t in served["outputs"][f"generate_text/{name}/text"]]
    assert got == expected


@pytest.mark.parametrize("request_name, message", [
    ("too_long", f"exceeds the {LIMIT} positions of this model"), ("left_padded", "must be right-padded"),
    ("no_new_tokens", "max_new_tokens must be >= 1"),
    ("bad_sampler", "Unknown sampler; use one of greedy, top_k, top_p, temperature")])
def test_bad_requests_get_an_error_naming_the_fix(served, request_name, message):
    assert message in served["info"]["errors"][request_name]


def test_an_encoder_has_no_generate_signature(tmp_path):
    encoder = zoo.get("enc-base", **dict(TINY_DEC, num_kv_heads=4))
    with pytest.raises(ValueError, match="generate signatures need a decoder language model"):
        export.saved_model(encoder, tmp_path / "model", generate=True)
    assert list(tmp_path.iterdir()) == []
