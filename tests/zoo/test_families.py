"""Qwen2, Qwen3, Gemma 3 and ModernBERT (issue 23): parity with folders transformers 5 itself
wrote (tests/fixtures/hf, tools/make_hf_fixtures.py; windows shorter than the 40-token input, so
the local layers are local), in both config formats; the rotary frequencies per layer kind;
cached = uncached generation past the window; bit-exact round trips; the spec fields, and every
refusal of a config the zoo cannot honour."""

import json

import numpy as np
import pytest

import zoo
from tests.common import REPO
from tests.zoo.test_hub import assert_same_weights, fixture_inputs, inputs, legacy_copy, randomise
from zoo import hub, registry, shapes
from zoo.generation import generate

FIXTURES = REPO / "tests" / "fixtures" / "hf"
NEW = ["qwen2", "qwen2-legacy", "qwen3", "gemma3", "gemma3-legacy", "gemma3-linear", "modernbert", "modernbert-legacy"]
FAMILY = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3", "modernbert": "modernbert"}
# The windows transformers applies in each fixture, in the zoo's terms (|i - j| < window), and the layers'
# kinds: what the reader must get from each config format.
LAYOUT = {
    "qwen2": (("global", "local"), 8), "qwen2-legacy": (("global",), None), "qwen3": (("local", "global"), 8),
    "gemma3": (("local", "global"), 8), "gemma3-legacy": (("local", "global"), 6),
    "gemma3-linear": (("local", "global"), 8),  # Gemma 3 4B's RoPE: the global layers' scaled linearly
    "modernbert": (("global", "local", "local"), 5), "modernbert-legacy": (("global", "local"), 6),
}


@pytest.mark.parametrize("name", NEW)
def test_fixtures_match_transformers(name, loaded):
    """Logits and last hidden states (real positions) within 1e-5 of transformers' (float32;
    measured: 2.4e-6 to 1.1e-5 absolute on logits of magnitude ~5)."""
    model = loaded(name)
    assert model.spec.family == FAMILY[name.split("-")[0]]
    assert (model.spec.layer_kinds, model.spec.sliding_window) == LAYOUT[name]
    expected = np.load(FIXTURES / name / "expected.npz", allow_pickle=False)
    x = fixture_inputs(expected, model)
    real = expected["attention_mask"].astype(bool)
    logits = np.asarray(model(x)["logits"])
    hidden = np.asarray(model.backbone({k: v for k, v in x.items() if k != "mask_positions"})["sequence_output"])
    np.testing.assert_allclose(logits[real], expected["logits"][real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hidden[real], expected["hidden"][real], rtol=1e-5, atol=1e-5)
    print(f"{name}: max |logits - transformers| {np.abs(logits - expected['logits'])[real].max():.2e}")


@pytest.mark.parametrize("name", ["qwen2", "gemma3", "gemma3-legacy", "gemma3-linear", "modernbert",
                                  "modernbert-legacy"])
def test_rotary_frequencies_per_layer_kind_are_transformers(name, loaded):
    model = loaded(name)
    expected = np.load(FIXTURES / name / "expected.npz", allow_pickle=False)
    for i, block in enumerate(model.backbone.blocks):
        kind = "full_attention" if model.spec.layer_kind(i) == "global" else "sliding_attention"
        reference = expected[f"inv_freq_{kind}"] if f"inv_freq_{kind}" in expected else expected["inv_freq"]
        ours = np.asarray(block.attention.rotary._get_inverse_freq(model.spec.head_dim))
        np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["gemma3"])  # local and global layers; Qwen's decoding runs the same code
def test_cache_past_the_window_equals_transformers_and_uncached_generation(name, loaded):
    """The prompt (30 tokens) is longer than the window (8): the full-length cache is masked to
    each local layer's window, step by step, and greedy generation equals the uncached one."""
    model = loaded(name)
    expected = np.load(FIXTURES / name / "expected.npz", allow_pickle=False)
    ids = expected["input_ids"][:1].astype("int32")
    cache = model.init_cache(1, ids.shape[1])
    first, _, cache = model.call_with_cache(ids[:, :30], cache, 0)
    steps = [first]
    for i in range(30, ids.shape[1]):
        logits, _, cache = model.call_with_cache(ids[:, i:i + 1], cache, i)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), expected["logits"][:1], rtol=1e-5, atol=1e-5)
    prompt = ids[:, :12]  # already past the window: every new token's local layers see only the window's keys
    cached = generate(model, prompt, max_new_tokens=4, compile=False)
    np.testing.assert_array_equal(cached, generate(model, prompt, max_new_tokens=4, use_cache=False, compile=False))


# Two families' round trips here (time); Qwen's config round trip is test_registered_names_are_recognised_... and
# its tensors are Llama's names (test_hub); resave + check in tools/make_hf_fixtures.py reload every family's
# output in transformers (all eleven fixtures: no missing or unexpected tensor, logits equal).
CASES = [("gemma3-1b", "causal_lm", {}), ("modernbert-base", "masked_lm", {})]
TINY = dict(num_layers=3, hidden_dim=32, num_heads=4, intermediate_dim=48, vocab_size=64, max_sequence_length=64)


def tiny(name, task, **kw):
    s = zoo.spec(name)
    shape = dict(TINY, num_kv_heads=2 if s.num_kv_heads != s.num_heads else None,
                 head_dim=16 if s.head_dim != s.hidden_dim // s.num_heads else None,
                 sliding_window=4 if s.sliding_window else None)
    return zoo.get(name, task=task, **shape, **kw)


@pytest.mark.parametrize("name, task, kw", CASES, ids=str)
def test_round_trip_is_bit_exact(tmp_path, name, task, kw):
    model = randomise(tiny(name, task, **kw))
    hub.save(model, tmp_path / "out")
    loaded = hub.load(tmp_path / "out")
    assert type(loaded) is type(model) and loaded.task == task
    # layer_kinds is a pattern: a 3-layer copy of gemma3-1b's (local x 5, global) reads back as (local,)
    kinds = [[m.spec.layer_kind(i) for i in range(TINY["num_layers"])] for m in (model, loaded)]
    assert kinds[0] == kinds[1]
    assert loaded.spec.replace(description="", layer_kinds=model.spec.layer_kinds) == model.spec.replace(
        description="")
    assert_same_weights(model, loaded)
    x = inputs(model, length=9)
    for key, value in model(x).items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(loaded(x)[key]))


def test_registered_counts_are_transformers():
    """tools/hf_param_counts.py: each model built by transformers 5.24 (meta device) from its config."""
    counts = {("qwen2.5-0.5b", None): 494_032_768, ("qwen3-0.6b", None): 596_049_920,
              ("gemma3-1b", None): 999_885_952, ("modernbert-base", "masked_lm"): 149_655_232,
              ("modernbert-base", "backbone"): 149_014_272, ("modernbert-base", "classifier"): 149_606_402,
              ("modernbert-large", "masked_lm"): 395_881_664, ("modernbert-large", "backbone"): 394_781_696}
    assert {key: zoo.spec(key[0]).num_params(key[1]) for key in counts} == counts


def test_registered_names_are_recognised_and_keep_their_rhythm():
    for name in ("qwen2.5-0.5b", "qwen3-0.6b", "gemma3-1b", "modernbert-base", "modernbert-large"):
        spec = zoo.spec(name)
        task = "masked_lm" if name.startswith("modernbert") else "causal_lm"
        read, _, _ = hub.spec_from_config(hub.config_from_spec(spec, task))
        assert hub.match_registered(read) == name, name
    gemma = zoo.spec("gemma3-1b")
    assert [gemma.layer_window(i) for i in range(6)] == [512] * 5 + [None]
    assert [gemma.layer_rope_theta(i) for i in (0, 5)] == [10000.0, 1000000.0]
    config = hub.config_from_spec(gemma, "causal_lm")
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [5, 11, 17, 23]
    assert hub.config_from_spec(zoo.spec("modernbert-base"), "masked_lm")["local_attention"] == 128


def test_a_spec_saved_before_the_new_fields_rebuilds_the_same_model():
    """to_dict leaves out the fields at their family's values, so BERT and Llama specs serialise as
    they did, and a dict without them (an older .keras file) reads back the same spec."""
    for name in ("enc-base", "dec-1b"):
        spec = zoo.spec(name)
        old = {k: v for k, v in spec.to_dict().items()}
        assert not set(old) & {"activation", "norm", "layer_kinds", "qk_norm", "sliding_window"}
        assert registry.ModelSpec(**old) == spec
    gemma = zoo.spec("gemma3-1b")
    again = registry.ModelSpec(**json.loads(json.dumps(gemma.to_dict())))
    assert again == gemma and again.layer_kinds == gemma.layer_kinds
    assert zoo.spec("enc-base").replace(family="modernbert", classifier_pooling=None).norm_placement == "pre"
    assert zoo.spec("dec-base").replace(family="gemma3").norm_offset == 1.0


@pytest.mark.parametrize("change, message", [
    (dict(layer_kinds=("local", "global")), "local layers, which need a positive sliding_window"),
    (dict(sliding_window=8), "sliding_window=8 applies to local layers"),
    (dict(local_rope_theta=10.0), "local_rope_theta=10.0 applies to local layers"),
    (dict(layer_kinds=("global", "windowed"), sliding_window=4), "layer_kinds must be a non-empty pattern"),
    (dict(activation="relu"), "Unknown activation 'relu'"),
    (dict(norm_offset=0.5), "norm_offset=0.5"),
    (dict(norm="layer", norm_offset=1.0), "norm_offset=1.0"),
    (dict(norm_placement="post"), "decoder takes rotary positions, pre- or sandwich norms"),
    (dict(query_pre_attn_scalar=0), "query_pre_attn_scalar must be positive"),
])
def test_spec_refuses_what_the_layers_cannot_compute(change, message):
    with pytest.raises(ValueError, match=message):
        zoo.spec("qwen3-0.6b").replace(**change)


def test_modernbert_spec_refusals():
    with pytest.raises(ValueError, match="classifier_pooling='pooler' is BERT's"):
        zoo.spec("modernbert-base").replace(classifier_pooling="pooler")
    with pytest.raises(ValueError, match="first_attention_norm=False needs pre-norm blocks"):
        zoo.spec("enc-base").replace(first_attention_norm=False)


def _set(**values):
    return lambda config: config.update(values)


def _rope(kind, **values):
    return lambda config: config["rope_parameters"][kind].update(values)


@pytest.mark.parametrize("name, edit, message", [
    ("gemma3", _set(final_logit_softcapping=30.0), "final_logit_softcapping=30.0 is not supported"),
    ("gemma3", _set(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0 is not supported"),
    ("gemma3", _set(use_bidirectional_attention=True), "use_bidirectional_attention=True is not supported"),
    ("gemma3", _set(hidden_activation="gelu"), "hidden_activation='gelu' is not supported"),
    ("gemma3", _rope("sliding_attention", rope_type="linear", factor=8.0), r"rope_type='linear' \(sliding_attention"),
    ("gemma3", _rope("full_attention", rope_type="dynamic", factor=8.0), r"rope_type='dynamic' \(full_attention"),
    ("gemma3-legacy", _set(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_type='yarn'"),
    ("gemma3", _set(layer_types=["sliding_attention", "chunked_attention", "full_attention"]),
     r"layer_types \['chunked_attention'\] are not supported"),
    ("gemma3", _set(sliding_window=None), "sliding_attention layers but sliding_window is None"),
    ("qwen2", _set(use_sliding_window=False), "sliding_attention layers but the window"),
    ("qwen3", _set(attention_bias=True), "attention_bias=True is not supported"),
    ("qwen3", _set(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}),
     "rope_type='dynamic' is not supported"),
    ("modernbert", _set(mlp_bias=True), "mlp_bias=True is not supported"),
    ("modernbert", _set(classifier_activation="silu"), "classifier_activation='silu' is not supported"),
    ("modernbert", _set(decoder_bias=False), "decoder_bias=False is not supported"),
    ("modernbert-legacy", _set(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type='linear'"),
])
def test_configs_the_zoo_cannot_honour_are_refused_by_name(tmp_path, name, edit, message):
    with pytest.raises(ValueError, match=message):
        hub.load(legacy_copy(tmp_path, name, edit))


def test_an_unsupported_architecture_names_itself_and_the_supported_ones(tmp_path):
    for config in ({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"},
                   {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, {"model_type": "gemma2"}):
        (tmp_path / "config.json").write_text(json.dumps(config))
        name = (config.get("architectures") or [config["model_type"]])[0]
        with pytest.raises(ValueError, match=rf"Unsupported architecture.*{name}.*supported:.*Qwen2ForCausalLM.*"
                                             r"Qwen3ForCausalLM.*Gemma3ForCausalLM.*ModernBertForMaskedLM"):
            hub.load(tmp_path)


def test_model_type_alone_picks_the_family():
    config = json.loads((FIXTURES / "gemma3" / "config.json").read_text())
    config.pop("architectures")
    spec, task, _ = hub.spec_from_config(config)
    assert (spec.family, task) == ("gemma3", "causal_lm")


def test_shapes_follow_the_family_fields():
    """zoo.shapes counts what each field adds: a Q/K norm is two [head_dim] vectors, sandwich norms two
    more [hidden], ModernBERT's block 0 one norm fewer."""
    s = zoo.spec("qwen3-0.6b")
    d, h = s.head_dim, s.hidden_dim
    assert shapes.count(shapes.block_shapes(s)) - shapes.count(shapes.block_shapes(s.replace(qk_norm=False))) == 2 * d
    g = zoo.spec("gemma3-1b")
    assert shapes.count(shapes.block_shapes(g)) - shapes.count(shapes.block_shapes(g.replace(
        norm_placement="pre"))) == 2 * g.hidden_dim
    m = zoo.spec("modernbert-base")
    assert shapes.count(shapes.block_shapes(m)) - shapes.count(shapes.block_shapes(m, first=True)) == m.hidden_dim
    assert h == 1024


def test_gemma_sentencepiece_tokenizer_is_refused_not_misread(tmp_path):
    """Gemma's tokenizer.json is a BPE with byte fallback over '▁' pieces: read as byte-level BPE it would
    give other ids, so it is refused by name."""
    from zoo.hub.tokenizers import load_tokenizer

    model = {"type": "BPE", "byte_fallback": True, "vocab": {"▁a": 0, "<0x41>": 1}, "merges": []}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": model, "added_tokens": []}))
    with pytest.raises(ValueError, match="SentencePiece-style BPE"):
        load_tokenizer(tmp_path)
