"""Chat templates against transformers: text, token ids and assistant masks equal what its
`apply_chat_template` computed (tests/fixtures/chat, made by tools/make_chat_fixtures.py).

For each template the masks are checked twice: through the template as the checkpoint ships it
(no generation tags: zoo finds the spans with markers) and through its tagged twin (zoo reads the
`{% generation %}` spans), both against transformers' masks from the tagged one. The stock templates of
eleven checkpoints are checked in test_chat_stock.py, and SmolLM2's, read from its real GGUF, in
test_hub_real.py (on the folder that module converts once).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from zoo.chat import ChatTemplate, ChatTemplateError, ChatTokenizer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "chat"
SMALL = ("qwen2.5", "llama3", "gemma")
UNSUPPORTED = {"continue_final_message"}  # transformers' option zoo does not take


def fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def small_tokenizer():
    return ChatTokenizer.from_folder(FIXTURES)


def check_template(data, tokenizer, template_source, tagged):
    template = ChatTemplate(template_source, data["special_tokens"])
    checked = 0
    for case in data["cases"]:
        if UNSUPPORTED & set(case) or (not tagged and "tools" in case):
            # A tool-call turn of Qwen's template starts "<|im_start|>assistant" + "\n<tool_call>": this file's
            # tagged twin trains the "\n", which zoo's spans leave in the generation prompt, where generation
            # starts (test_chat_stock.py's twins agree with zoo). The tags are checked.
            continue
        messages, prompt = case["messages"], case["add_generation_prompt"]
        text, found = template.render_with_spans(messages, prompt, tools=case.get("tools"))
        assert text == case["text"], case["name"]
        (encoded,) = tokenizer.encode([text], [found])
        assert encoded.ids.tolist() == case["input_ids"], case["name"]
        if "assistant_masks" in case:
            if tagged:  # the generation tag's own spans; markers find the same tokens, not always the same spans
                assert [list(s) for s in found] == case["assistant_spans"], case["name"]
            np.testing.assert_array_equal(encoded.mask, case["assistant_masks"], err_msg=case["name"])
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("tagged", [False, True], ids=["markers", "generation-tags"])
def test_ids_and_masks_equal_transformers(name, tagged, small_tokenizer):
    data = fixture(name)
    check_template(data, small_tokenizer, data["template_with_generation" if tagged else "template"], tagged)


def test_a_template_that_raises_is_a_clear_error():
    data = fixture("gemma")
    template = ChatTemplate(data["template"], data["special_tokens"])
    assert data["errors"]
    for case in data["errors"]:
        with pytest.raises(ChatTemplateError, match="refused the conversation: " + case["message"].replace(".", r"\.")):
            template.render(case["messages"], case["add_generation_prompt"])


def test_a_folder_without_a_template_is_refused_with_the_fix(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ChatTemplateError, match="--chat-template FILE"):
        ChatTemplate.find(tmp_path)


def test_bad_messages_are_refused_by_position():
    template = ChatTemplate(fixture("qwen2.5")["template"])
    with pytest.raises(ChatTemplateError, match="Message 0 is not"):
        template.render([{"text": "hi"}])
    with pytest.raises(ChatTemplateError, match="Message 1 is not"):
        template.render([{"role": "user", "content": "hi"}, "yo"])
    # what the template itself cannot take is its refusal, as in transformers
    with pytest.raises(ChatTemplateError, match="refused the conversation: .*content"):
        template.render([{"role": "user", "content": "hi"}, {"role": "assistant"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_a_template_that_garbles_the_text_is_refused_not_guessed():
    """A template that turns the answers around leaves no marker to find them by: refused, naming the message."""
    cutting = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | reverse if m.role == 'assistant' "
               "else m.content }}<|im_end|>\n{% endfor %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "a long answer"}]
    with pytest.raises(ChatTemplateError, match=r"message 1 \('a long answer'\) beyond recognition.*markers"):
        ChatTemplate(cutting).render_with_spans(messages)


def test_a_template_that_upper_cases_the_answer_still_has_its_turn_found():
    """Markers are private-use characters and digits, which `upper` leaves alone: the turn is found, and what
    is trained is the text the template renders."""
    shouting = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper if m.role == 'assistant' "
                "else m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "a long answer"}]
    text, spans = ChatTemplate(shouting).render_with_spans(messages, control_tokens=["<|im_start|>", "<|im_end|>"])
    assert [text[a:b] for a, b in spans] == ["A LONG ANSWER<|im_end|>"]


def test_none_valued_keys_and_reasoning_aliases_as_transformers():
    """transformers drops None-valued keys ("tool_calls": None) and reads `thinking` / `reasoning` as
    `reasoning_content`."""
    template = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.reasoning_content | default('-') }}:"
                            "{{ m.tool_calls is defined }}:{{ m.content }};{% endfor %}")
    text = template.render([{"role": "user", "content": "q", "tool_calls": None},
                            {"role": "assistant", "content": "a", "thinking": "t"},
                            {"role": "assistant", "content": "b", "reasoning": "r"}])
    assert text == "user:-:False:q;assistant:t:False:a;assistant:r:False:b;"


def test_template_keyword_arguments_reach_the_template():
    template = ChatTemplate("{{ greeting }} {{ messages[0].content }}{% if add_generation_prompt %}!{% endif %}")
    assert template.render([{"role": "user", "content": "you"}], True, greeting="hello") == "hello you!"


def test_saved_template_reads_back(tmp_path):
    data = fixture("llama3")
    ChatTemplate(data["template"], data["special_tokens"]).save(tmp_path)
    again = ChatTemplate.find(tmp_path)
    assert again.source == data["template"] and again.special_tokens == data["special_tokens"]
