"""Real pretrained weights (../shared/ASSETS.md): all-MiniLM-L6-v2 (Hugging Face
safetensors) and SmolLM2-135M (GGUF, dequantised and written as a Hugging Face
folder), checked against keras-hub's own Hugging Face loaders; the converted folder's
chat template and tokenizer against transformers' (here, where the folder is converted
once: the conversion is most of this module's time).

keras-hub reads the folder `convert_gguf` wrote, so a conversion error would be on
both sides of that comparison: the Q/K row order is checked on its own, by applying
llama.cpp's documented permutation to the converted tensors and getting the GGUF's
tensors back bit for bit.

keras-hub's `BertBackbone` uses the tanh approximation of GELU while the
checkpoint (`hidden_act: "gelu"`) and Hugging Face use the exact erf form: 2.7e-3
apart on MiniLM's hidden states. The reference therefore gets erf GELU swapped
in (everything else, weight mapping included, is keras-hub's own); the test also
shows the stock model's gap so the reason stays visible.
"""

import os
from pathlib import Path

import keras_hub
import numpy as np
import pytest
from safetensors import safe_open

import zoo
from tests.common import exact_gelu, llama_cpp_permute
from zoo import hub
from zoo.chat import ChatTemplate, ChatTokenizer
from zoo.generation import generate

pytestmark = pytest.mark.slow  # real assets: deselect with -m "not slow"


@pytest.fixture(scope="session")
def assets(asset):
    return {name: asset(name) for name in ("minilm", "smollm2")}


@pytest.fixture(scope="module")
def minilm(assets):
    return zoo.get("enc-mini", weights=assets["minilm"])


@pytest.fixture(scope="session")
def smollm2_folder(assets, tmp_path_factory):
    return hub.convert_gguf(assets["smollm2"], tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M")


@pytest.fixture(scope="module")
def smollm2(smollm2_folder):
    return zoo.get("dec-base", weights=str(smollm2_folder))


SENTENCES = ["A man is playing a guitar.", "Someone is strumming a guitar.", "The stock market fell sharply today."]


def encode(model, texts):
    """[CLS] ids [SEP], right-padded, as BERT inputs."""
    rows = [[101, *np.asarray(model.tokenizer(t)).tolist(), 102] for t in texts]
    length = max(map(len, rows))
    ids = np.zeros((len(rows), length), "int32")
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return {"token_ids": ids, "padding_mask": (ids != 0).astype("int32"), "segment_ids": np.zeros_like(ids)}


def test_minilm_tokenizer_is_bert_uncased(minilm):
    assert isinstance(minilm.tokenizer, keras_hub.models.BertTokenizer)
    assert np.asarray(minilm.tokenizer("The quick brown fox")).tolist() == [1996, 4248, 2829, 4419]


def test_minilm_matches_keras_hub(minilm, assets):
    x = encode(minilm, SENTENCES)
    ours = minilm(x)
    real = x["padding_mask"].astype(bool)
    stock = keras_hub.models.BertBackbone.from_preset(assets["minilm"])
    gap = np.abs(np.asarray(ours["sequence_output"]) - np.asarray(stock(x)["sequence_output"]))[real].max()
    assert 1e-4 < gap < 1e-2  # the tanh-GELU approximation, not a mapping error
    reference = exact_gelu(stock)(x)
    np.testing.assert_allclose(np.asarray(ours["sequence_output"])[real],
                               np.asarray(reference["sequence_output"])[real], atol=1e-4, rtol=0)
    np.testing.assert_allclose(ours["pooled_output"], reference["pooled_output"], atol=1e-4, rtol=0)


def test_minilm_embeddings_rank_paraphrases_closer(minilm):
    x = encode(minilm, SENTENCES)
    hidden = np.asarray(minilm(x)["sequence_output"])
    mask = x["padding_mask"][..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)  # sentence-transformers mean pooling
    pooled /= np.linalg.norm(pooled, axis=-1, keepdims=True)
    paraphrase, unrelated = pooled[0] @ pooled[1], pooled[0] @ pooled[2]
    assert paraphrase > 0.7 and unrelated < 0.3, (paraphrase, unrelated)


def test_minilm_saves_the_original_tensors(minilm, assets, tmp_path):
    """Saving reproduces the published file tensor for tensor (names, shapes, bits)."""
    folder = hub.save(minilm, tmp_path / "minilm")
    with safe_open(Path(assets["minilm"]) / "model.safetensors", framework="numpy") as original, \
            safe_open(folder / "model.safetensors", framework="numpy") as saved:
        expected = set(original.keys()) - {"embeddings.position_ids"}
        assert set(saved.keys()) == expected
        for key in expected:
            np.testing.assert_array_equal(saved.get_tensor(key), original.get_tensor(key), err_msg=key)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert (folder / "vocab.txt").read_text() == (Path(assets["minilm"]) / "vocab.txt").read_text()


def test_smollm2_matches_keras_hub(smollm2, smollm2_folder):
    assert smollm2.spec.description == zoo.spec("dec-base").description  # recognised as the dec-base shape
    ids = np.asarray(smollm2.tokenizer("The capital of France is Paris, and the capital of Italy is"))[None]
    x = {"token_ids": ids.astype("int32"), "padding_mask": np.ones_like(ids, "int32")}
    reference = keras_hub.models.Llama3Backbone.from_preset(str(smollm2_folder), layer_norm_epsilon=1e-5)
    expected = np.asarray(reference.token_embedding(reference(x), reverse=True))
    np.testing.assert_allclose(np.asarray(smollm2(x)["logits"]), expected, atol=1e-3, rtol=0)


def test_smollm2_greedy_continues_with_paris(smollm2):
    # " Paris" is one token (7042) of SmolLM2's vocabulary: one greedy step shows it; untraced, as one step is cheaper
    text = generate(smollm2, "The capital of France is", max_new_tokens=1, compile=False)
    assert text == "The capital of France is Paris", text


def test_smollm2_query_key_rows_are_llama_cpps_permuted_back(assets, smollm2_folder):
    """Every layer's q_proj/k_proj, permuted as llama.cpp's converter permutes Hugging Face
    weights, equals the dequantised GGUF tensor read directly with `gguf` (SmolLM2: 9 query
    heads, 3 KV heads)."""
    import gguf

    reader = gguf.GGUFReader(assets["smollm2"])
    heads = reader.fields["llama.attention.head_count"].contents()
    kv_heads = reader.fields["llama.attention.head_count_kv"].contents()
    assert (heads, kv_heads) == (9, 3)
    gguf_tensors = {t.name: t for t in reader.tensors}
    checked = 0
    with safe_open(smollm2_folder / "model.safetensors", framework="numpy") as converted:
        for layer in range(30):
            for part, proj, n in (("attn_q", "q_proj", heads), ("attn_k", "k_proj", kv_heads)):
                tensor = gguf_tensors[f"blk.{layer}.{part}.weight"]
                original = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
                ours = converted.get_tensor(f"model.layers.{layer}.self_attn.{proj}.weight")
                np.testing.assert_array_equal(llama_cpp_permute(ours, n), original, err_msg=f"{layer} {proj}")
                assert not np.array_equal(ours, original)  # the permutation is not the identity here
                checked += 1
    assert checked == 60


def test_smollm2_chat_template_and_tokenizer_equal_transformers(assets, smollm2_folder):
    """The real SmolLM2-135M-Instruct GGUF, converted by zoo: the chat template zoo reads from the folder
    and from the GGUF is the one transformers read, and the folder's tokenizer gives transformers' text,
    ids and assistant masks (tests/fixtures/chat/smollm2.json) through the template as shipped (markers)
    and through its tagged twin (generation tags)."""
    from tests.zoo.test_chat_template import check_template, fixture

    data = fixture("smollm2")
    from_folder = ChatTemplate.find(smollm2_folder)
    assert from_folder.source == data["template"] == ChatTemplate.find(assets["smollm2"]).source
    assert from_folder.special_tokens == data["special_tokens"]
    tokenizer = ChatTokenizer.from_folder(smollm2_folder)
    for tagged in (False, True):
        check_template(data, tokenizer, data["template_with_generation" if tagged else "template"], tagged)
