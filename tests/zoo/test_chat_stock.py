"""Stock chat templates, as twelve public instruct checkpoints ship them, against transformers: for every
conversation, `zoo.chat.encode_chat` gives transformers' text and ids, and the assistant mask transformers
computes from the template's tagged twin (tests/fixtures/chat/stock, made by tools/make_stock_chat_fixtures.py);
a conversation transformers refuses is refused too. No template is edited: spans come from markers.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from zoo.chat import ChatTemplate, ChatTemplateError, ChatTokenizer, encode_chat

STOCK = Path(__file__).parent.parent / "fixtures" / "chat" / "stock"
NAMES = sorted(p.stem for p in STOCK.glob("*.json") if p.name != "tokenizer.json")


def fixture(name):
    return json.loads((STOCK / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer():
    return ChatTokenizer.from_folder(STOCK)


def stock_template(data):
    return ChatTemplate((STOCK / data["template_file"]).read_text(encoding="utf-8"), data["special_tokens"],
                        origin=data["template_file"])


def test_every_stock_template_has_a_fixture():
    assert len(NAMES) == 11  # + smollm2's own GGUF template in test_chat_template.py


@pytest.mark.parametrize("name", NAMES)
def test_stock_template_equals_transformers(name, tokenizer):
    data = fixture(name)
    template = stock_template(data)
    differing = []
    for case in data["cases"]:
        encoded = encode_chat(template, tokenizer, case["messages"], tools=case["tools"],
                              add_generation_prompt=case["add_generation_prompt"], **case["template_kwargs"])
        if encoded.text != case["text"] or encoded.ids.tolist() != case["input_ids"]:
            differing.append((case["name"], "text/ids"))
        elif "assistant_masks" in case and encoded.mask.tolist() != case["assistant_masks"]:
            differing.append((case["name"], encoded.show_mask(tokenizer), "want",
                              encoded.show_mask(tokenizer, case["assistant_masks"])))
    assert not differing, differing
    assert sum("assistant_masks" in c for c in data["cases"]) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_what_transformers_refuses_is_refused(name, tokenizer):
    data = fixture(name)
    template = stock_template(data)
    for case in data["errors"]:
        with pytest.raises(ChatTemplateError):
            encode_chat(template, tokenizer, case["messages"], tools=case["tools"],
                        add_generation_prompt=case["add_generation_prompt"], **case["template_kwargs"])


@pytest.mark.parametrize("name", NAMES)
def test_tagged_twin_gives_the_same_spans(name, tokenizer):
    """The twin's own {% generation %} tags (transformers' mechanism) through zoo's renderer: the same masks."""
    data = fixture(name)
    twin = ChatTemplate(data["template_with_generation"], data["special_tokens"])
    for case in data["cases"]:
        if "assistant_masks" in case:
            encoded = encode_chat(twin, tokenizer, case["messages"], tools=case["tools"],
                                  add_generation_prompt=case["add_generation_prompt"], **case["template_kwargs"])
            np.testing.assert_array_equal(encoded.mask, case["assistant_masks"], err_msg=case["name"])


def test_a_completion_whose_prompt_is_rewritten_trains_its_own_turn_only(tokenizer):
    """DeepSeek-R1's generation prompt prefills `<think>\\n`, which the answered turn lacks: the prompt is not a
    prefix of the whole, and the completion's span comes from markers: transformers' mask of its last turn."""
    data = fixture("deepseek-r1-distill-llama-8b")
    (case,) = [c for c in data["cases"] if c["name"] == "multi_turn"]
    template = stock_template(data)
    *prompt, completion = case["messages"]
    assert not template.render(case["messages"]).startswith(template.render(prompt, add_generation_prompt=True))
    text, spans = template.prompt_and_completion(prompt, [completion], control_tokens=tokenizer.control_tokens)
    (encoded,) = tokenizer.encode([text], [spans])
    want = np.asarray(case["assistant_masks"])
    last_turn_start = np.flatnonzero(np.diff(want) == 1)[-1] + 1
    want[:last_turn_start] = 0
    assert text == case["text"] and encoded.mask.tolist() == want.tolist()


def test_a_serving_tokenizer_that_splits_unlike_training_is_refused(tokenizer, tmp_path):
    """keras-hub's BytePairTokenizer (a SavedModel's in-graph tokenizer) on the same vocabulary and merges splits
    whitespace unlike `tokenizers`: many fixture texts get other ids, so a chat export with it is refused."""
    import keras_hub

    import zoo
    from tests.common import TINY_DEC
    from zoo.chat import Chat

    saved = json.loads((STOCK / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {**saved["model"]["vocab"], **{t["content"]: t["id"] for t in saved["added_tokens"]}}
    merges = [" ".join(m) if isinstance(m, list) else m for m in saved["model"]["merges"]]
    graph_tokenizer = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=vocab, merges=merges, unsplittable_tokens=[t["content"] for t in saved["added_tokens"]])
    cases = [c for name in NAMES for c in fixture(name)["cases"]]
    differing = sum([int(i) for i in graph_tokenizer(c["text"])] != c["input_ids"] for c in cases)
    assert differing > len(cases) // 4, (differing, len(cases))
    for name in NAMES:
        chat = Chat(stock_template(fixture(name)), tokenizer)
        assert "tokenizes as" in chat.serving_mismatch(graph_tokenizer), name
        assert chat.serving_mismatch(lambda text: tokenizer.encode([text], [None])[0].ids) is None, name
    model = zoo.get("dec-base", **{**TINY_DEC, "vocab_size": len(vocab)})
    with pytest.raises(ValueError, match="unlike the chat model was trained.*Export without tokenizer="):
        zoo.export.saved_model(model, tmp_path / "1", tokenizer=graph_tokenizer, chat=chat)
    assert not (tmp_path / "1").exists()


def test_generation_prompts_take_template_kwargs(tokenizer):
    """`Chat.prompt_ids` (generation's prompts, `generate(messages=..., chat_template_kwargs=...)`) renders with the
    template's keyword arguments: Qwen3 with thinking off prefills the empty <think> block, as transformers."""
    from zoo.chat import Chat

    data = fixture("qwen3")
    (case,) = [c for c in data["cases"] if c["name"] == "enable_thinking_false_prompt"]
    chat = Chat(stock_template(data), tokenizer)
    assert chat.prompt_ids(case["messages"], **case["template_kwargs"]).tolist() == case["input_ids"]
    assert chat.prompt_ids(case["messages"]).tolist() != case["input_ids"]


@pytest.mark.parametrize("name", NAMES)
def test_a_sampled_answer_is_the_sft_span(name, tokenizer):
    """GRPO (and generation) samples after `Chat.prompt_ids` and keeps the tokens through the first of
    `Chat.stop_ids` (zoo.grpo.sample's completion mask). That is the SFT span of the same answer: it starts where the
    generation prompt ends and its first stop token is its last token, so the separator after the end-of-turn token
    (ChatML's and Gemma's "\\n", Phi-3.5's "\\n<|endoftext|>") is neither sampled nor trained. DeepSeek-R1's
    generation prompt prefills `<think>\\n`, which its answered turns drop: there the sample is reasoning + answer."""
    from zoo.chat import Chat

    data = fixture(name)
    chat = Chat(stock_template(data), tokenizer)
    for case in (c for c in data["cases"] if c["name"] in ("single", "system", "multi_turn")):
        *prompt, _ = case["messages"]
        encoded = chat.encode(case["messages"])
        before = chat.template.render(prompt, add_generation_prompt=True)
        if name == "deepseek-r1-distill-llama-8b":
            assert not encoded.text.startswith(before) and before.endswith("<think>\n")
            continue
        start, end = encoded.spans[-1]
        assert start == len(before) and encoded.text.startswith(before), case["name"]
        last_turn = encoded.ids[(encoded.offsets[:, 0] < end) & (encoded.offsets[:, 1] > start)].tolist()
        stops = [i for i, token in enumerate(last_turn) if token in chat.stop_ids]
        assert stops == [len(last_turn) - 1], (case["name"], stops, len(last_turn))
