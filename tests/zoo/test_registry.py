"""The registry, parameter counts and bad input to zoo.get."""

import numpy as np
import pytest

import zoo
from tests.common import TINY, TINY_DEC
from zoo import models as zoo_models
from zoo import registry, shapes

# docs/design-notes.md's reference parameter counts for the ladder.
REFERENCE = {
    "enc-mini": 22.7e6, "enc-base": 110e6, "enc-large": 335e6, "enc-1b": 0.98e9,
    "dec-base": 135e6, "dec-large": 362e6, "dec-1b": 1.10e9,
}


def test_ladder_is_registered():
    assert set(REFERENCE) <= set(zoo.names())


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_num_params_within_two_percent_of_reference(name):
    assert abs(zoo.spec(name).num_params() / REFERENCE[name] - 1) <= 0.02


def shrunk(name):
    """The overrides that shrink a registered shape to test size and keep its structure (tying, grouped-query
    heads, head_dim apart from hidden/heads, local layers)."""
    s = zoo.spec(name)
    kv = {"num_kv_heads": 2} if s.num_kv_heads != s.num_heads else {}
    kv |= {"head_dim": 32} if s.head_dim != s.hidden_dim // s.num_heads else {}
    kv |= {"sliding_window": 4} if s.sliding_window else {}
    return {**TINY, **kv}


def distinct_shrunk_shapes():
    """One registered name per distinct shrunk spec: names that differ only in size (enc-mini ... enc-1b,
    dec-base and dec-large, qwen3-0.6b and qwen3-4b, ...) shrink to the very same spec, so the same model and
    the same test; each name stands for the names listed in its case's id."""
    groups = {}
    for name in zoo.names():
        spec = zoo.spec(name).replace(**shrunk(name), description="")
        groups.setdefault(repr(sorted(spec.to_dict().items())), []).append(name)
    return [pytest.param(names[0], id="=".join(names)) for names in groups.values()]


@pytest.mark.parametrize("name", distinct_shrunk_shapes())
def test_shapes_equal_the_built_layers(name):
    """zoo.shapes (num_params and the planner read it) against the built variables, for every task of the
    family: the registered shape's structure, shrunk so the unit test stays small
    (benchmarks/param_counts.py builds the full-size ones). The backbone checked is the one inside the last
    head model: task="backbone" builds that very class from the same arguments (one build fewer)."""
    s = zoo.spec(name)
    assert set(shapes.tasks(s)) == set(zoo_models.TASKS[s.family])
    models = {}
    for task in shapes.tasks(s):
        if task != "backbone":
            models[task] = zoo.get(name, task=task, **shrunk(name), **classes(task))
    models["backbone"] = models[shapes.tasks(s)[-1]].backbone
    assert type(models["backbone"]) is zoo_models.TASKS[s.family]["backbone"]
    for task, model in models.items():
        assert shapes.variable_shapes(model.spec, task, **classes(task)) == [
            tuple(v.shape) for v in model.trainable_variables]
        assert model.count_params() == model.spec.num_params(task, **classes(task))
        assert_tags_name_the_hub_modules(model, shapes.variables(model.spec, task, **classes(task)))


def classes(task):
    return {"num_classes": 3} if task == "classifier" else {}


def assert_tags_name_the_hub_modules(model, tagged):
    """Each variable's tag (what LoRA targets and the quantized-bytes planner read) is the last part of
    the Hugging Face module that holds it in the family's weight map ("q_proj", ModernBERT's fused
    "Wqkv"), and an untagged variable is no Dense kernel. (An untied backbone keeps its LM head's
    reverse embedding, which Hugging Face's bare model, so the weight map, does not have.)"""
    from zoo.hub.families import family_of

    entries = {id(part): e for e in family_of(model).weight_map(model) for part in e.parts}
    assert len(tagged) == len(model.trainable_variables)
    for (tag, _), variable in zip(tagged, model.trainable_variables):
        if id(variable) not in entries and tag == "lm_head" and model.task == "backbone":
            continue
        entry = entries[id(variable)]
        if tag is None:
            assert entry.module is None and not entry.transpose, (entry.key, variable.path)
        elif tag != "embedding":
            assert entry.key.rsplit(".", 2)[-2] == tag, (entry.key, tag, variable.path)


def test_unknown_model_lists_known():
    with pytest.raises(ValueError, match="enc-base.*dec-1b|dec-1b.*enc-base"):
        zoo.get("enc-huge")


def test_unknown_policy_lists_known():
    with pytest.raises(ValueError, match="none, full, selective"):
        zoo.get("enc-base", checkpointing="sometimes", **TINY)


def test_unknown_task_and_dtype():
    with pytest.raises(ValueError, match="causal_lm"):
        zoo.get("enc-base", task="causal_lm", **TINY)
    with pytest.raises(ValueError, match="mixed_bfloat16"):
        zoo.get("enc-base", dtype="float8", **TINY)


@pytest.mark.parametrize(
    "overrides, numbers",
    [
        (dict(hidden_dim=100, num_heads=3), ("100", "3")),
        (dict(num_heads=9, num_kv_heads=2), ("9", "2")),
    ],
)
def test_shape_breaking_override_names_both_numbers(overrides, numbers, monkeypatch):
    built = []
    for family in zoo_models.TASKS.values():
        for task, cls in family.items():
            monkeypatch.setitem(family, task, lambda *a, **k: built.append(1))
    with pytest.raises(ValueError) as error:
        zoo.get("dec-base", **overrides)
    assert all(n in str(error.value) for n in numbers)
    assert not built, "the model must not be constructed when the spec is invalid"


def test_unknown_override_lists_fields():
    with pytest.raises(ValueError, match="hidden_dim"):
        zoo.get("enc-base", hidden_size=64)


@pytest.fixture(scope="module")
def encoder():
    """One tiny encoder for the tests that only call it."""
    return zoo.get("enc-base", **TINY, max_sequence_length=16)


@pytest.fixture(scope="module")
def decoder():
    """One tiny decoder (selective checkpointing, a policy its config must keep) for the tests that call,
    clone or save it."""
    return zoo.get("dec-base", checkpointing="selective", **TINY_DEC)


def test_too_long_input_says_both_lengths(encoder):
    x = {"token_ids": np.zeros((1, 20), "int32"), "segment_ids": np.zeros((1, 20), "int32"),
         "padding_mask": np.ones((1, 20), "int32")}
    with pytest.raises(ValueError, match="20.*16"):
        encoder(x)


def test_missing_input_is_named(decoder):
    with pytest.raises(ValueError, match="padding_mask"):
        decoder({"token_ids": np.zeros((1, 4), "int32")})


def test_register_refuses_silent_overwrite(monkeypatch):
    monkeypatch.setattr(registry._MODELS, "_items", dict(registry._MODELS._items))  # other tests see no test-dec-3
    custom = zoo.spec("dec-base").replace(num_layers=3)
    zoo.register("test-dec-3", custom)
    assert zoo.spec("test-dec-3").num_layers == 3
    with pytest.raises(ValueError, match="already registered"):
        zoo.register("test-dec-3", custom)


def test_config_round_trip_keeps_spec_and_policy(decoder):
    clone = type(decoder).from_config(decoder.get_config())
    assert clone.spec == decoder.spec and clone.checkpointing == "selective"
    assert clone.count_params() == decoder.count_params()


@pytest.mark.parametrize("name, task", [("enc-base", "masked_lm"), ("enc-base", "classifier"),
                                        ("dec-base", "causal_lm"), ("gemma3-1b", "causal_lm")])
def test_keras_format_round_trip_under_mixed_precision(name, task, tmp_path):
    import keras

    tiny = TINY_DEC if name.startswith("dec") else dict(TINY, head_dim=16) if name.startswith("gemma") else TINY
    model = zoo.get(name, task=task, checkpointing="full", dtype="mixed_bfloat16", **tiny)
    x = {k: np.ones((2, 8), "int32") for k in model.input}
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model) and loaded.checkpointing == "full"
    assert loaded.dtype_policy.name == "mixed_bfloat16"
    logits = model(x)["logits"]
    assert logits.dtype == "float32"  # softmax and loss stay in float32
    np.testing.assert_array_equal(logits, loaded(x)["logits"])


def test_import_zoo_is_enough_to_load_a_saved_model(decoder, tmp_path):
    import subprocess
    import sys

    path = tmp_path / "model.keras"
    decoder.save(path)
    code = f"import zoo, keras; print(type(keras.models.load_model({str(path)!r})).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "DecoderCausalLM", out.stderr[-2000:]


def test_encoders_default_segment_ids_to_zeros(encoder):
    """As Hugging Face defaults token_type_ids: a dict without segment_ids is one segment."""
    ids = np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, 8)).astype("int32")
    full = encoder({"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    short = encoder({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    np.testing.assert_array_equal(np.asarray(full["pooled_output"]), np.asarray(short["pooled_output"]))
    ones = encoder({"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.ones_like(ids)})
    assert not np.allclose(np.asarray(ones["pooled_output"]), np.asarray(short["pooled_output"]))
