"""Stock chat templates of twelve public instruct checkpoints, rendered, tokenized and masked by Hugging Face
transformers itself, for zoo's parity tests (tests/zoo/test_chat_stock.py).

Reads tests/fixtures/chat/stock/*.jinja: each template verbatim as its source ships it (SOURCES names where each
came from). Writes, beside them:
  tokenizer.json  a small byte-level BPE (HF `tokenizers`, as tools/make_chat_fixtures.py builds it) holding every
                  template's special tokens as special added tokens and the tokens the checkpoints add as ordinary
                  text (<think>, <tool_call>, ...), so that ids and masks are computed on the templates' real tokens.
  <name>.json     per template: name, source, the .jinja file, special_tokens (what apply_chat_template passes as
                  variables), template_with_generation (its tagged twin: the stock template with
                  {% generation %} ... {% endgeneration %} around what the model writes in each assistant turn:
                  from the end of the assistant header (the generation prompt) through the end-of-turn token,
                  the separator after it left out; the script asserts that it renders byte-identical text to the
                  stock template on every case), cases and errors.
A case: name, messages, tools, template_kwargs, add_generation_prompt and transformers' outputs:
  text             apply_chat_template(..., tokenize=False)
  input_ids        apply_chat_template(..., tokenize=True, return_dict=False)
  assistant_masks  apply_chat_template(messages, chat_template=template_with_generation, tokenize=True,
                   return_dict=True, return_assistant_tokens_mask=True)["assistant_masks"] (cases with an
                   assistant message)
An error: the same inputs and what apply_chat_template raised (exception class and message), for the conversations
transformers refuses (a template's raise_exception, or a template that fails on the input).

    # a throwaway venv: transformers is not a keras-zoo dependency (no torch needed)
    python3 -m venv /tmp/ref-venv && /tmp/ref-venv/bin/pip install transformers==5.25.0 jinja2 tokenizers
    /tmp/ref-venv/bin/python tools/make_stock_chat_fixtures.py      # writes tests/fixtures/chat/stock/*.json
    # (made here with the 5.25.0 wheel unpacked in front of a 5.24.0 venv: PYTHONPATH=/tmp/tf525/x)
"""

import copy
import json
import os
import platform
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "chat" / "stock"
sys.path.insert(0, str(REPO))
from tools.make_chat_fixtures import (  # noqa: E402
    A1,
    A2,
    A_WS,
    GEMMA3_GEN,
    PARAGRAPHS,
    SYSTEM,
    U1,
    U2,
    U_WS,
    replace_once,
    smollm2_with_generation,
)

LLAMA_CPP = "ggml-org/llama.cpp models/templates/{} (vendored verbatim from the checkpoint's tokenizer_config.json; " \
            "read from the mirror ye-NX/llama.cpp at 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e)"
# name: (.jinja file, source, special tokens as the checkpoint's tokenizer_config.json sets them)
TEMPLATES = {
    "llama3.1-8b-instruct": ("meta-llama-Llama-3.1-8B-Instruct.jinja",
                             LLAMA_CPP.format("meta-llama-Llama-3.1-8B-Instruct.jinja"),
                             {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "llama3.2-3b-instruct": ("meta-llama-Llama-3.2-3B-Instruct.jinja",
                             LLAMA_CPP.format("meta-llama-Llama-3.2-3B-Instruct.jinja"),
                             {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "mistral-7b-instruct-v0.3": ("mistralai-Mistral-7B-Instruct-v0.3.jinja",
                                 "mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json chat_template (the revision "
                                 "that puts the system prompt in the last user turn), as quoted verbatim in a public "
                                 "repository's Python source found by code search (its jinja escapes \\n kept as "
                                 "written in the JSON)",
                                 {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "phi3.5-mini-instruct": ("microsoft-Phi-3.5-mini-instruct.jinja",
                             LLAMA_CPP.format("microsoft-Phi-3.5-mini-instruct.jinja"),
                             {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>",
                              "pad_token": "<|endoftext|>"}),
    "phi-4": ("microsoft-phi-4.jinja", "microsoft/phi-4 chat_template as llama.cpp's tests/test-chat-template.cpp "
              "quotes it (name \"phi-4\"), same mirror and commit",
              {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}),
    "deepseek-r1-distill-llama-8b": ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
                                     LLAMA_CPP.format("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"),
                                     {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", LLAMA_CPP.format("Qwen-Qwen3-0.6B.jinja") + "; every Qwen3 size (1.7B "
              "included) ships this template", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen2.5-instruct": ("Qwen-Qwen2.5-7B-Instruct.jinja", LLAMA_CPP.format("Qwen-Qwen2.5-7B-Instruct.jinja")
                         + "; Qwen2.5-3B-Instruct ships the same template",
                         {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "gemma-2b-it": ("google-gemma-2-2b-it.jinja", LLAMA_CPP.format("google-gemma-2-2b-it.jinja")
                    + "; the Gemma 1/2 instruct template: gemma-2b-it's, as a public Swift Jinja test suite "
                    "quotes it (test \"Google Gemma-2B-IT\"), renders the same text",
                    {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}),
    "gemma-3-1b-it": ("google-gemma-3-1b-it.jinja", "google/gemma-3-1b-it tokenizer_config.json chat_template, as "
                      "tools/make_chat_fixtures.py writes it out (GEMMA3); the same text a public repository quotes "
                      "verbatim (code search)", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
    "smollm2-135m-instruct": ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja",
                              "tests/fixtures/chat/smollm2.json's template: the GGUF metadata tokenizer.chat_template "
                              "of SmolLM2-135M-Instruct as transformers read it",
                              {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                               "pad_token": "<|im_end|>"}),
}

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<s>", "</s>", "<unk>", "[INST]",
           "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
           "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
           "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
           "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
           "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<bos>", "<eos>", "<pad>", "<start_of_turn>",
           "<end_of_turn>", "<start_of_image>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # not special

# ---------------------------------------------------------------------------------------------- conversations
# The earlier fixtures' conversations (U1, A1, SYSTEM, U2, A2, U_WS, A_WS), and these cases' own below.
EMPTY = {"role": "assistant", "content": ""}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Zürich"}},
                   "required": ["city"]}}}
U_TOOL = {"role": "user", "content": "What is the weather in Zürich?"}
CALL = {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
TOOL_RESULT = {"role": "tool", "name": "get_weather", "tool_call_id": "call00001",
               "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
A_TOOL = {"role": "assistant", "content": "It is 21 degrees and clear in Zürich."}
THOUGHT = "The user asks for a capital. France's capital is Paris."
THOUGHT2 = "The Seine is the river of Paris."


def reasoning(key, answer, thought):
    return {"role": "assistant", "content": answer["content"], key: thought}


# (name, messages, tools, template kwargs, add_generation_prompt); every template gets every case
CASES = [
    ("single", [U1, A1], None, {}, False),
    ("system", [SYSTEM, U1, A1], None, {}, False),
    ("multi_turn", [U1, A1, U2, A2], None, {}, False),
    ("system_multi_turn", [SYSTEM, U1, A1, U2, A2], None, {}, False),
    ("assistant_first", [A1, U1, A2], None, {}, False),
    ("empty_answer", [U1, EMPTY], None, {}, False),
    ("empty_answer_mid", [U1, EMPTY, U2, A2], None, {}, False),
    ("unicode_whitespace", [U_WS, A_WS], None, {}, False),
    ("generation_prompt", [U1, A1, U2], None, {}, True),
    ("tool_calls_none", [U1, {**A1, "tool_calls": None}], None, {}, False),
    ("tools_no_call", [U1, A1], [WEATHER_TOOL], {}, False),
    ("tool_call_empty_content", [U_TOOL, {"role": "assistant", "content": "", "tool_calls": [CALL]}, TOOL_RESULT,
                                 A_TOOL], [WEATHER_TOOL], {}, False),
    ("tool_call_no_content", [U_TOOL, {"role": "assistant", "tool_calls": [CALL]}, TOOL_RESULT, A_TOOL],
     [WEATHER_TOOL], {}, False),
    ("reasoning_content", [U1, reasoning("reasoning_content", A1, THOUGHT)], None, {}, False),
    ("thinking", [U1, reasoning("thinking", A1, THOUGHT)], None, {}, False),
    ("reasoning_multi_turn", [U1, reasoning("reasoning", A1, THOUGHT), U2, reasoning("thinking", A2, THOUGHT2)],
     None, {}, False),
    ("think_in_content", [U1, {"role": "assistant", "content": f"<think>\n{THOUGHT}\n</think>\n\n{A1['content']}"},
                          U2, A2], None, {}, False),
    ("enable_thinking_false", [U1, A1, U2, A2], None, {"enable_thinking": False}, False),
    ("enable_thinking_false_prompt", [U1, A1, U2], None, {"enable_thinking": False}, True),
    ("date_string", [SYSTEM, U1, A1], None, {"date_string": "06 Dec 2026"}, False),
    ("tools_in_system", [U_TOOL, {"role": "assistant", "tool_calls": [CALL]}, TOOL_RESULT, A_TOOL], [WEATHER_TOOL],
     {"tools_in_user_message": False}, False),
    ("builtin_tools_ipython", [U_TOOL, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "weather Zürich"}}}]},
        {"role": "ipython", "content": "21 degrees, clear"}, A_TOOL], None,
     {"builtin_tools": ["brave_search", "wolfram_alpha"]}, False),
    ("tool_response_as_user_text", [
        U_TOOL, {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
        {"role": "user", "content": "<tool_response>\n{\"temperature\": 21}\n</tool_response>"},
        reasoning("reasoning_content", A_TOOL, "21 degrees is warm.")], None, {}, False),
    ("list_content", [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]}], None, {}, False),
]


# ------------------------------------------------------------------------------------------------ tagged twins
def llama3_twin(stock):
    """Llama 3.1 / 3.2: the assistant's text + <|eot_id|>; a tool call (JSON or <|python_tag|> call) + <|eot_id|>
    or <|eom_id|>."""
    plain = ("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim "
             "+ '<|eot_id|>' }}")
    tagged = replace_once(stock, plain, (
        "{%- if message.role == 'assistant' %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
        "{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}{%- else %}" + plain
        + "{%- endif %}"))
    header = "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    call = "{%- set tool_call = message.tool_calls[0].function %}"
    tagged = replace_once(tagged, call, call + "\n        " + header + "{%- generation %}")
    tagged = tagged.replace("            " + header + "\n", "").replace("        " + header + "\n        {{- '{\"name",
                                                                      "        {{- '{\"name")
    assert tagged.count(header) == 1, "the tool-call header is written once, before the tag"
    end = "{%- elif message.role == \"tool\" or message.role == \"ipython\" %}"
    return replace_once(tagged, end, "{%- endgeneration %}\n    " + end)


QWEN_TOOL_CALLS = """        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}"""


def qwen25_twin(stock):
    """Qwen2.5: after '<|im_start|>assistant\\n', the text, tool calls and <|im_end|>."""
    start = stock.index('    {%- if (message.role == "user")')
    end = stock.index('    {%- elif message.role == "tool" %}')
    branch = """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if message.content or not message.tool_calls %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
""" + QWEN_TOOL_CALLS + """
        {%- endif %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
"""
    return stock[:start] + branch + stock[end:]


def qwen3_twin(stock):
    """Qwen3: after '<|im_start|>assistant\\n', the <think> block where the template keeps it, the text, tool calls
    and <|im_end|>; with enable_thinking=False the empty <think> block the generation prompt prefills stays out."""
    start = stock.index('        {%- if loop.index0 > ns.last_query_index %}')
    end = stock.index("        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}")
    branch = """        {%- set head = '<|im_start|>' + message.role + '\\n' %}
        {%- set body = '' + content %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {%- set think = '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' %}
                {%- if enable_thinking is defined and enable_thinking is false and think == '<think>\\n\\n</think>\\n\\n' %}
                    {%- set head = head + think %}
                    {%- set body = content.lstrip('\\n') %}
                {%- else %}
                    {%- set body = think + content.lstrip('\\n') %}
                {%- endif %}
            {%- endif %}
        {%- endif %}
        {{- head }}
        {%- generation %}
        {{- body }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
"""  # noqa: E501
    return stock[:start] + branch + stock[end + len("        {{- '<|im_end|>\\n' }}\n"):]


def mistral_twin(stock):
    """Mistral v0.3: everything after [/INST]: ' ' + text + </s>, or [TOOL_CALLS] [...] + </s>."""
    calls, assistant = '        {{- "[TOOL_CALLS] [" }}', '    {%- elif message["role"] == "assistant" %}'
    tagged = replace_once(stock, calls, "        {%- generation %}\n" + calls)
    tagged = replace_once(tagged, "        {%- endfor %}\n" + assistant,
                          "        {%- endfor %}\n        {%- endgeneration %}\n" + assistant)
    return replace_once(tagged, '        {{- " " + message["content"]|trim + eos_token}}',
                        '        {%- generation %}{{- " " + message["content"]|trim + eos_token}}{%- endgeneration %}')


def phi35_twin(stock):
    return replace_once(stock, "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}",
                        "{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}"
                        "{{ '\n' }}")


def phi4_twin(stock):
    """phi-4: the user's turn writes the assistant header; the answer is the text + <|im_end|>."""
    return replace_once(stock, "{{message['content'] + '<|im_end|>'}}",
                        "{% generation %}{{message['content'] + '<|im_end|>'}}{% endgeneration %}")


def deepseek_twin(stock):
    """DeepSeek-R1: after <｜Assistant｜> (or the tool outputs' end), the text after </think> and the eos."""
    tagged = replace_once(stock, "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}",
                          "{{'<｜Assistant｜>'}}{% generation %}{{content + '<｜end▁of▁sentence｜>'}}"
                          "{% endgeneration %}")
    return replace_once(tagged, "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}",
                        "{% generation %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
                        "{% endgeneration %}")


def gemma2_twin(stock):
    turn = "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    return replace_once(stock, turn, (
        "{% if role == 'model' %}{{ '<start_of_turn>' + role + '\n' }}{% generation %}{{ message['content'] | trim "
        "+ '<end_of_turn>' }}{% endgeneration %}{{ '\n' }}{% else %}" + turn + "{% endif %}"))


TWINS = {"llama3.1-8b-instruct": llama3_twin, "llama3.2-3b-instruct": llama3_twin, "qwen2.5-instruct": qwen25_twin,
         "qwen3": qwen3_twin, "mistral-7b-instruct-v0.3": mistral_twin, "phi3.5-mini-instruct": phi35_twin,
         "phi-4": phi4_twin, "deepseek-r1-distill-llama-8b": deepseek_twin, "gemma-2b-it": gemma2_twin,
         "gemma-3-1b-it": lambda stock: GEMMA3_GEN, "smollm2-135m-instruct": smollm2_with_generation}


# ---------------------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = list(PARAGRAPHS) + ["\n\n ".join(PARAGRAPHS)]
    for _, messages, _, _, _ in CASES:
        texts += [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"]]
    tok.train_from_iterator(texts * 20, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok.save(str(path))
    return tok


# ----------------------------------------------------------------------------------------------------- record
def versions():
    import jinja2
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}


def dumps(doc) -> str:
    """JSON with each list of numbers (ids, masks) on one line."""
    text = json.dumps(doc, ensure_ascii=False, indent=1)
    return re.sub(r"\[(\s*-?\d+,)*\s*-?\d+\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(0)[1:-1].split(",")) + "]", text) + "\n"


def record(tok, name, messages, tools, kwargs, add_generation_prompt, template, tagged):
    """What transformers computes for one conversation (or what it raised), with both templates."""
    inputs = {"name": name, "messages": messages, "tools": tools, "template_kwargs": kwargs,
              "add_generation_prompt": add_generation_prompt}
    kw = dict(tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
    try:
        text = tok.apply_chat_template(copy.deepcopy(messages), chat_template=template, tokenize=False, **kw)
    except Exception as e:  # noqa: BLE001 - the point is to record whatever transformers raised
        for t in (tagged,):
            try:
                tok.apply_chat_template(copy.deepcopy(messages), chat_template=t, tokenize=False, **kw)
            except Exception:  # noqa: BLE001, S110
                pass
            else:
                raise AssertionError(f"{name}: the tagged twin renders what the stock template refuses") from e
        return None, {**inputs, "exception": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)}
    ids = tok.apply_chat_template(copy.deepcopy(messages), chat_template=template, tokenize=True, return_dict=False,
                                  **kw)
    assert tok.apply_chat_template(copy.deepcopy(messages), chat_template=tagged, tokenize=False, **kw) == text, name
    assert tok(text, add_special_tokens=False)["input_ids"] == ids, name
    case = {**inputs, "text": text, "input_ids": ids}
    if any(m["role"] == "assistant" for m in messages):
        out = tok.apply_chat_template(copy.deepcopy(messages), chat_template=tagged, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True, **kw)
        assert list(out["input_ids"]) == ids, name
        case["assistant_masks"] = list(out["assistant_masks"])
    return case, None


def main():
    from transformers import PreTrainedTokenizerFast

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    train_tokenizer(ROOT / "tokenizer.json")
    totals = {}
    for name, (file, source, special) in TEMPLATES.items():
        template = (ROOT / file).read_text(encoding="utf-8")
        tagged = TWINS[name](template)
        assert "generation" in tagged and tagged != template, name
        tok = PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "tokenizer.json"), **special)
        cases, errors = [], []
        for case_name, messages, tools, kwargs, prompt in CASES:
            if "strftime_now" in template and "date_string" not in kwargs:  # today's date would change the text
                kwargs = {**kwargs, "date_string": "26 Jul 2024"}
            done, error = record(tok, case_name, messages, tools, kwargs, prompt, template, tagged)
            (cases if done else errors).append(done or error)
        doc = {"name": name, "source": source, "template_file": file, "versions": versions(),
               "special_tokens": dict(tok.special_tokens_map), "tokenizer": "tokenizer.json",
               "template_with_generation": tagged, "cases": cases, "errors": errors}
        (ROOT / f"{name}.json").write_text(dumps(doc), encoding="utf-8")
        totals[name] = (len(cases), len(errors))
        print(f"{name}: {len(cases)} cases rendered, {len(errors)} refused by transformers "
              f"({', '.join(e['name'] for e in errors)})")
    print(f"{sum(c for c, _ in totals.values())} rendered, {sum(e for _, e in totals.values())} refused")


if __name__ == "__main__":
    main()
