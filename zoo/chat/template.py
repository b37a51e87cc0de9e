"""A checkpoint's own chat template, rendered as transformers renders it.

transformers compiles `chat_template` with jinja2's ImmutableSandboxedEnvironment (trim_blocks,
lstrip_blocks, loop controls, a `{% generation %}` tag), a `tojson` that keeps non-ASCII text, and
the globals `raise_exception` and `strftime_now`; it renders with `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...). This module
does the same, so a conversation reads exactly as the checkpoint was trained to read it.

Assistant spans (what the loss is taken on) come from the template's `{% generation %}` blocks where
it has them, as transformers' `return_assistant_tokens_mask` does; otherwise (a checkpoint's own template,
unedited) from markers: the conversation is rendered once more with a unique marker in each message's text,
the markers say where each message landed, and an assistant turn runs from the end of the assistant header
(the generation prompt) through its end-of-turn token, whatever the template does to earlier turns
(`_MarkedRender`). Messages are normalized as transformers normalizes them (`normalize_messages`).

Where a template is found (`ChatTemplate.find`): `chat_template.jinja`, `chat_template.json` or
`tokenizer_config.json`'s `chat_template` in a Hugging Face folder, and a GGUF file's
`tokenizer.chat_template`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from datetime import datetime
from pathlib import Path

from zoo.reading import read_json

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
_WHITESPACE = " \t\r\n"


class ChatTemplateError(ValueError):
    """A template that is missing, cannot be compiled, or refuses a conversation (raise_exception)."""


def _environment():
    """transformers' environment: sandboxed, trim_blocks + lstrip_blocks, loop controls, the
    generation tag, its tojson filter and its globals."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTracker(Extension):
        """`{% generation %}...{% endgeneration %}`: records the character span of what the block
        rendered, while a render asks for spans (`tracking`)."""

        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(track_generation=self.tracking)
            self._blocks, self._spans = None, None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation(self, context, caller):
            text = caller()
            if self._spans is not None:
                start = len("".join(self._blocks))
                self._spans.append((start, start + len(text)))
            return text

        @contextlib.contextmanager
        def tracking(self, blocks, spans):
            self._blocks, self._spans = blocks, spans
            try:
                yield
            finally:
                self._blocks, self._spans = None, None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _token_text(value):
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with.

    Example:
    >>> template = ChatTemplate.find("smollm2/")
    >>> template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM...<|im_start|>assistant\\n'
    """

    def __init__(self, source: str, special_tokens: dict | None = None, origin: str = "a chat template"):
        import jinja2

        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(f"{origin} is empty: a chat template is a jinja string.")
        self.source, self.origin = source, origin
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._turn_shapes = {}  # (assistant header, end-of-turn tokens) by tools, keyword arguments, special tokens
        env = _environment()
        try:
            self._compiled = env.from_string(source)
            self._generation_tags = _has_generation_block(env, source)
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"{origin} does not compile as jinja (line {error.lineno}: {error.message}); "
                                    "fix it or pass another with --chat-template FILE.") from None

    # ------------------------------------------------------------------ finding one
    @classmethod
    def find(cls, path, override=None) -> ChatTemplate:
        """The template of a Hugging Face folder or GGUF file; `override` (a .jinja file, or a
        folder / tokenizer_config.json / .gguf holding one) replaces the folder's own."""
        path = Path(path)
        template = cls.from_file(override, special_tokens=cls._special_tokens(path)) if override else cls._own(path)
        if template is None:
            raise ChatTemplateError(
                f"{path} has no chat template (looked for {TEMPLATE_FILE}, chat_template.json and "
                f"{CONFIG_FILE}'s chat_template{', and the GGUF tokenizer.chat_template' * path.is_file()}); "
                "pass one with --chat-template FILE (a .jinja file), or train on plain `text` rows.")
        return template

    @classmethod
    def of(cls, path) -> ChatTemplate | None:
        """The folder's (or GGUF file's) own template, or None when it has none (a base model)."""
        return cls._own(Path(path))

    @classmethod
    def from_file(cls, path, special_tokens=None) -> ChatTemplate:
        """A template from a .jinja file (or anything `find` reads)."""
        path = Path(path)
        if path.is_dir() or path.suffix in (".json", ".gguf"):
            found = cls._own(path)
            if found is None:
                raise ChatTemplateError(f"{path} holds no chat template.")
            if special_tokens:
                found.special_tokens = {**special_tokens, **found.special_tokens}
            return found
        if not path.is_file():
            raise ChatTemplateError(f"Chat template file {str(path)!r} does not exist; pass a .jinja file.")
        return cls(path.read_text(encoding="utf-8"), special_tokens, origin=str(path))

    @classmethod
    def _own(cls, path: Path) -> ChatTemplate | None:
        if path.suffix == ".gguf":
            return cls._from_gguf(path)
        folder = path if path.is_dir() else path.parent
        specials = cls._special_tokens(folder)
        if (folder / TEMPLATE_FILE).is_file():
            return cls((folder / TEMPLATE_FILE).read_text(encoding="utf-8"), specials, str(folder / TEMPLATE_FILE))
        for name in ("chat_template.json", CONFIG_FILE):
            if (folder / name).is_file():
                source = read_json(folder / name).get("chat_template")
                if isinstance(source, list):  # named templates: transformers renders "default"
                    source = {t.get("name"): t.get("template") for t in source}.get("default")
                if source:
                    return cls(source, specials, f"{folder / name}'s chat_template")
        return None

    @staticmethod
    def _special_tokens(path: Path) -> dict:
        config = path if path.name == CONFIG_FILE else path / CONFIG_FILE
        settings = read_json(config, missing={})
        return {name: _token_text(settings.get(name)) for name in SPECIAL_TOKENS if settings.get(name)}

    @classmethod
    def _from_gguf(cls, path: Path) -> ChatTemplate | None:
        import gguf

        from zoo.hub.gguf import tokenizer_config

        settings = tokenizer_config(gguf.GGUFReader(str(path)))
        source = settings.pop("chat_template", None)
        return cls(source, settings, f"{path}'s tokenizer.chat_template") if source else None

    def save(self, folder):
        """Write the template beside a tokenizer, as transformers saves it: `chat_template.jinja`, and
        the special tokens it reads in tokenizer_config.json (other settings kept)."""
        folder = Path(folder)
        (folder / TEMPLATE_FILE).write_text(self.source, encoding="utf-8")
        config = folder / CONFIG_FILE
        settings = read_json(config, missing={})
        settings.pop("chat_template", None)  # the .jinja file is the one template
        config.write_text(json.dumps({**settings, **self.special_tokens}, indent=2, ensure_ascii=False) + "\n",
                          encoding="utf-8")

    # ------------------------------------------------------------------ rendering
    @property
    def has_generation_tags(self) -> bool:
        """Whether the template marks assistant text with `{% generation %}` blocks."""
        return self._generation_tags

    def render(self, messages, add_generation_prompt=False, tools=None, **template_kwargs) -> str:
        """The conversation as text, exactly as transformers' `apply_chat_template(tokenize=False)`.

        Args:
            tools: JSON schemas of the tools the template may describe.
            **template_kwargs: the template's own variables (`enable_thinking`, `date_string`, ...), as
                transformers passes `apply_chat_template`'s extra keyword arguments (TRL's `chat_template_kwargs`).
        """
        return self._render(normalize_messages(messages), add_generation_prompt, tools, template_kwargs, None)

    def _render(self, messages, add_generation_prompt, tools, template_kwargs, spans):
        import jinja2

        variables = {**self.special_tokens, **template_kwargs}  # kwargs overwrite special tokens, as transformers
        variables.update(messages=messages, tools=tools, documents=variables.get("documents"),
                         add_generation_prompt=add_generation_prompt)
        try:
            if spans is None:
                return self._compiled.render(**variables)
            blocks = []
            with self._compiled.environment.track_generation(blocks, spans):
                for block in self._compiled.generate(**variables):
                    blocks.append(block)
            return "".join(blocks)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"The chat template ({self.origin}) refused the conversation: {error}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:  # what transformers lets out
            raise ChatTemplateError(f"The chat template ({self.origin}) failed on the conversation "
                                    f"({type(error).__name__}: {error}).") from None

    def render_with_spans(self, messages, add_generation_prompt=False, tools=None, control_tokens=(),
                          **template_kwargs) -> tuple[str, list]:
        """(text, [(start, end), ...]): the conversation and the character spans of its assistant turns.

        A template with `{% generation %}` tags gives its tags' spans, as transformers does. Any other
        template (a checkpoint's own, as shipped) is rendered once more with unique markers in every
        message's text (`_MarkedRender`): where the markers land says where each message is, whatever
        the template does to earlier turns. An assistant turn's span then runs from the end of the
        template's assistant header (its generation prompt) through its end-of-turn token: the reasoning,
        text and tool calls the template keeps, never the header, the system prompt or BOS, nor the
        separator after the end-of-turn token. `control_tokens`: the tokenizer's special tokens (the
        template's own special tokens are always known), which tell turns apart.
        """
        messages = normalize_messages(messages)
        if self.has_generation_tags:
            spans = []
            return self._render(messages, add_generation_prompt, tools, template_kwargs, spans), spans
        text = self._render(messages, add_generation_prompt, tools, template_kwargs, None)
        turns = self._assistant_turns(messages, text, add_generation_prompt, tools, control_tokens, template_kwargs)
        return text, [span for _, span in turns]

    def _assistant_turns(self, messages, text, add_generation_prompt, tools, control_tokens, template_kwargs):
        """[(message index, (start, end)), ...] of the assistant messages the template renders (`_MarkedRender`)."""
        if not any(m.get("role") == "assistant" for m in messages):
            return []
        render = _MarkedRender(self, messages, add_generation_prompt, tools, template_kwargs, text)
        specials = self._control_tokens(control_tokens)
        header, ends = self._turn_shape(tools, template_kwargs, specials)
        turns = []
        for i, message in enumerate(messages):
            if message.get("role") == "assistant":
                span = render.span(i, header, ends, specials)
                if span is not None and span[1] > span[0]:
                    turns.append((i, span))
        return turns

    def prompt_and_completion(self, prompt, completion, tools=None, control_tokens=(),
                              **template_kwargs) -> tuple[str, list[tuple[int, int]]]:
        """A conversational prompt/completion pair: (text, [the completion's span]), what SFT's prompt/completion
        rows and DPO's chosen and rejected answers train. The span runs from the end of the prompt's generation
        prompt through the end-of-turn token of the completion's last turn: `render_with_spans`'s turn, never the
        separator after it (ChatML's and Gemma's newline, Phi-3.5's `\n<|endoftext|>`). A template that rewrites
        the prompt once answered (DeepSeek-R1 prefills `<think>\n` the answered turn lacks) gives the
        completion's own assistant turns."""
        messages = normalize_messages(list(prompt) + list(completion))
        before = self.render(prompt, add_generation_prompt=True, tools=tools, **template_kwargs)
        text = self._render(messages, False, tools, template_kwargs, None)
        if not text.startswith(before):
            turns = self._assistant_turns(messages, text, False, tools, control_tokens, template_kwargs)
            return text, [span for i, span in turns if i >= len(prompt)]
        end = self._last_turn_end(messages, text, tools, control_tokens, template_kwargs)
        end = len(text.rstrip(_WHITESPACE)) if end is None else end
        return text, [(len(before), end)] if end > len(before) else []

    def _last_turn_end(self, messages, text, tools, control_tokens, template_kwargs) -> int | None:
        """Where the conversation's last message ends its turn (after its end-of-turn token), when it is an
        assistant turn the template renders; None otherwise."""
        if messages[-1].get("role") != "assistant":
            return None
        if self.has_generation_tags:
            spans = []
            self._render(messages, False, tools, template_kwargs, spans)
            return spans[-1][1] if spans else None
        turns = self._assistant_turns(messages, text, False, tools, control_tokens, template_kwargs)
        return turns[-1][1][1] if turns and turns[-1][0] == len(messages) - 1 else None

    # ------------------------------------------------------------------ what a turn looks like
    def turn_ends(self, control_tokens=(), tools=None, **template_kwargs) -> tuple[str, ...]:
        """The end-of-turn token the template writes after an answer (<|im_end|>, <|eot_id|>, <end_of_turn>,
        </s>, <|end|>) and the eos token: what generation stops at, and where a trained turn ends."""
        return self._turn_shape(tools, template_kwargs, self._control_tokens(control_tokens))[1]

    def _turn_shape(self, tools, template_kwargs, specials):
        """(assistant header, end-of-turn tokens), probed once per tools, keyword arguments and special tokens."""
        key = json.dumps([tools, template_kwargs, specials], sort_keys=True, default=str)
        if key not in self._turn_shapes:
            self._turn_shapes[key] = (self._assistant_header(tools, template_kwargs, specials),
                                      self._turn_ends(tools, template_kwargs, specials))
        return self._turn_shapes[key]

    def _control_tokens(self, extra) -> tuple[str, ...]:
        """Special tokens, longest first (so that a token is never matched by a shorter one inside it)."""
        tokens = {t for t in (*self.special_tokens.values(), *extra) if isinstance(t, str) and t}
        return tuple(sorted(tokens, key=len, reverse=True))

    def _probe(self, messages, add_generation_prompt, tools, template_kwargs):
        try:
            return self._render(messages, add_generation_prompt, tools, template_kwargs, None)
        except ChatTemplateError:
            return None

    def _assistant_header(self, tools, template_kwargs, specials) -> str:
        """What opens an assistant turn: the template's generation prompt after a user turn; for a template
        without one (phi-4, Mistral), what it writes between a user's turn end and an answer, when that is
        more than whitespace ("" otherwise: the turn then starts at the end of the turn before)."""
        user = [{"role": "user", "content": _PROBE}]
        without = self._probe(user, False, tools, template_kwargs)
        with_prompt = self._probe(user, True, tools, template_kwargs)
        if without is not None and with_prompt is not None:  # (Phi-3.5 ends a conversation with eos instead)
            prompt = with_prompt[len(os.path.commonprefix([with_prompt, without])):]
            if prompt.strip():
                return prompt
        text = self._probe(user + [{"role": "assistant", "content": _PROBE}], False, tools, template_kwargs)
        if text is None or text.count(_PROBE) != 2:
            return ""
        between = text[text.index(_PROBE) + len(_PROBE):text.rindex(_PROBE)]
        turn_end = _first_of(between, specials)
        header = between[turn_end[1]:] if turn_end else ""
        return header if header.strip() else ""

    def _turn_ends(self, tools, template_kwargs, specials) -> tuple[str, ...]:
        """The end-of-turn token (the first special token after an answer, else the text up to the first
        whitespace) and the eos token."""
        ends = []
        text = self._probe([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}], False, tools,
                           template_kwargs)
        if text is not None and _PROBE in text:
            after = text[text.rindex(_PROBE) + len(_PROBE):]
            found = _first_of(after, specials)
            if found is not None:
                ends.append(after[found[0]:found[1]])
            elif after.strip():
                ends.append(after.split()[0])
        eos = self.special_tokens.get("eos_token")
        if eos and eos not in ends:
            ends.append(eos)
        return tuple(ends)


_PROBE = "\u2063zoo-probe\u2063"  # a message text no template changes, to see what a template writes around one
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"  # private-use characters: no template or tokenizer gives them meaning
_MARK = re.compile("\ue000([0-9]+)\ue001")


def _first_of(text, needles, start=0, stop=None):
    """(start, end) of the earliest occurrence of any needle in text[start:stop] (at a tie, the first listed:
    special tokens come longest first), or None."""
    if not needles:
        return None
    found = _alternation(tuple(needles)).search(text, start, len(text) if stop is None else stop)
    return found.span() if found else None


@functools.lru_cache(maxsize=64)
def _alternation(needles):
    return re.compile("|".join(re.escape(n) for n in needles))


class _MarkedRender:
    """Where each message landed in a rendered conversation.

    The conversation is rendered again with a unique marker in each of its texts (content, text parts,
    reasoning, tool-call names); the markers are found and stripped, and the stripped text must equal the
    conversation rendered plainly, so that the positions hold for the real text. Templates trim, split and
    test their inputs, so markers go where such edits leave them alone: around the text, else inside its
    outer whitespace, else after it only, else only on assistant messages, on non-empty texts, without
    tool-call names; the first way that renders the same text is used.
    """

    # (where a marker goes, mark empty texts, mark tool-call names, mark every role, mark list parts)
    WAYS = (("around", True, True, True, True), ("inside", True, True, True, True), ("after", True, True, True, True),
            ("inside", False, True, True, True), ("after", False, True, True, True),
            ("inside", False, False, True, True), ("after", False, False, True, True),
            ("inside", False, False, False, True), ("after", False, False, False, True),
            ("inside", False, False, True, False), ("inside", False, False, False, False))

    def __init__(self, template, messages, add_generation_prompt, tools, template_kwargs, text):
        self.text, self.messages = text, messages
        for way in self.WAYS:
            owners = []  # the message index of each marker
            marked = [self._marked(m, i, owners, *way) for i, m in enumerate(messages)]
            try:
                rendered = template._render(marked, add_generation_prompt, tools, template_kwargs, None)
            except ChatTemplateError:
                continue
            positions, stripped = self._strip(rendered, owners)
            if stripped == text:
                self.positions = positions  # (position in text, message index), in text order
                return
        index = self._culprit(template, messages, add_generation_prompt, tools, template_kwargs)
        searched = messages[index].get("content") if index is not None else None
        raise ChatTemplateError(
            f"The chat template ({template.origin}) transforms the text of message {index} ({searched!r:.60}) beyond "
            f"recognition: searched for it with unique markers ({_MARK_OPEN!r}N{_MARK_CLOSE!r} around, inside the "
            "outer whitespace of, or after each content, reasoning and tool-call name), and no rendering reads as the "
            "plain one once they are removed, so its assistant tokens cannot be found and nothing is trained on a "
            "guess. Add {% generation %} tags around each assistant turn, or pass another template with "
            "--chat-template FILE.")

    @staticmethod
    def _strip(rendered, owners):
        """([(position in the stripped text, message index) of each marker], the text without markers)."""
        positions, pieces, length, at = [], [], 0, 0
        for match in _MARK.finditer(rendered):
            pieces.append(rendered[at:match.start()])
            length += match.start() - at
            at = match.end()
            positions.append((length, owners[int(match.group(1))]))
        pieces.append(rendered[at:])
        return positions, "".join(pieces)

    def _culprit(self, template, messages, add_generation_prompt, tools, template_kwargs):
        """The first message whose markers alone do not survive rendering (what the error names)."""
        for index, message in enumerate(messages):
            owners = []
            marked = [self._marked(m, i, owners, "inside", False, False, True, True) if i == index else m
                      for i, m in enumerate(messages)]
            try:
                rendered = template._render(marked, add_generation_prompt, tools, template_kwargs, None)
            except ChatTemplateError:
                return index
            if self._strip(rendered, owners)[1] != self.text:
                return index
        return None

    def _marked(self, message, index, owners, where, empty, names, every_role, parts):
        if not (every_role or message.get("role") == "assistant"):
            return message

        def mark(value):
            if not isinstance(value, str) or (not value and not empty):
                return value
            ids = []
            for _ in range(2):
                owners.append(index)
                ids.append(f"{_MARK_OPEN}{len(owners) - 1}{_MARK_CLOSE}")
            if where == "around":
                return ids[0] + value + ids[1]
            core = value.strip()
            lead, trail = value[:len(value) - len(value.lstrip())], value[len(value.rstrip()):] if core else ""
            return lead + (ids[0] if where == "inside" else "") + core + ids[1] + trail

        marked = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            marked["content"] = content if not parts else [
                {**part, "text": mark(part["text"])} if isinstance(part, dict) and "text" in part else part
                for part in content]
        else:
            marked["content"] = mark(content)
        if content is None:
            del marked["content"]
        for key in _REASONING_FIELDS:
            if key in message:
                marked[key] = mark(message[key])
        if names and isinstance(message.get("tool_calls"), list):
            marked["tool_calls"] = [self._marked_call(call, mark) for call in message["tool_calls"]]
        return marked

    @staticmethod
    def _marked_call(call, mark):
        if not isinstance(call, dict):
            return call
        if isinstance(call.get("function"), dict) and "name" in call["function"]:
            return {**call, "function": {**call["function"], "name": mark(call["function"]["name"])}}
        return {**call, "name": mark(call["name"])} if "name" in call else call

    def span(self, index, header, ends, specials):
        """(start, end) of assistant message `index`'s turn: from the end of the assistant header before its
        first marker to the end of the end-of-turn token after its last; None when the template left it out."""
        own = [at for at, owner in self.positions if owner == index]
        if not own:
            return self._unmarked_span(index, header, ends, specials)
        first, last = min(own), max(own)
        low = max((at for at, owner in self.positions if owner != index and at <= first), default=0)
        high = min((at for at, owner in self.positions if owner != index and at >= last), default=len(self.text))
        return self._start(low, first, header, specials), self._end(last, high, ends, specials)

    def _unmarked_span(self, index, header, ends, specials):
        """An assistant message that left no marker (an empty answer whose template tests the text, content
        parts the template prints as a list): its turn between the messages before and after it, found by its
        header; None when there is none there (the template left the message out)."""
        low = max((at for at, owner in self.positions if owner < index), default=0)
        high = min((at for at, owner in self.positions if owner > index), default=len(self.text))
        if any(owner == index - 1 for _, owner in self.positions):  # the message before: its turn ends first
            turn_end = _first_of(self.text, specials, low, high)
            low = turn_end[1] if turn_end else low
        if header and self.text.find(header, low, high) < 0:
            return None
        start = self._start(low, high, header, specials)
        return start, self._end(start, high, ends, specials)

    def _start(self, low, first, header, specials):
        """After the last assistant header (or its longest leading part: a template may prefill more in
        the generation prompt than in a past turn, e.g. `<think>\\n`) in text[low:first]; without one,
        after the first special token there (the end of the turn before)."""
        opening = _first_of(header, specials)
        shortest = opening[1] if opening else len(header)
        for length in range(len(header), max(shortest, 1) - 1, -1):
            at = self.text.rfind(header[:length], low, first)
            if at >= 0:
                return at + length
        turn_end = _first_of(self.text, specials, low, first)
        return turn_end[1] if turn_end else low

    def _end(self, last, high, ends, specials):
        """Through the end-of-turn token after the turn's last marker, not the separator after it. Where the
        turn ends otherwise (Llama 3.1's <|eom_id|> after a built-in tool call): through the first special
        token that only whitespace separates from the next special token or the end, else the first one."""
        found = _first_of(self.text, ends, last, high)
        at, first = last, None
        while found is None and (token := _first_of(self.text, specials, at, high)) is not None:
            first = first or token
            rest = self.text[token[1]:high].lstrip(_WHITESPACE)
            if not rest or any(rest.startswith(t) for t in specials):
                found = token
            at = token[1]
        found = found or first
        return found[1] if found else last


def _has_generation_block(env, source: str) -> bool:
    """Whether the parsed template calls the generation tag (comments and strings that merely
    mention it do not count)."""
    from jinja2 import nodes

    return any(node.name == "_generation" for node in env.parse(source).find_all(nodes.ExtensionAttribute))


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names of a message's reasoning


def normalize_messages(messages) -> list[dict]:
    """The messages as transformers hands them to the template: keys whose value is None dropped (APIs write
    `"tool_calls": None`), and a `thinking` or `reasoning` field copied to `reasoning_content` (and
    `thinking`), the name templates read. Roles and contents are the template's business (Llama 3.1 reads the
    `ipython` role and mapping contents; an assistant message may carry `tool_calls` and no `content`)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError(f"A conversation is a non-empty list of messages, got {type(messages).__name__}.")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"Message {i} is not a {{'role': ..., 'content': ...}} dict: {message!r:.80}.")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out
