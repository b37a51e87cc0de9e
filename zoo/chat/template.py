"""A checkpoint's own chat template, rendered as transformers renders it.

transformers compiles `chat_template` with jinja2's ImmutableSandboxedEnvironment (trim_blocks,
lstrip_blocks, loop controls, a `{% generation %}` tag), a `tojson` that keeps non-ASCII text, and
the globals `raise_exception` and `strftime_now`; it renders with `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...). This module
does the same, so a conversation reads exactly as the checkpoint was trained to read it.

Assistant spans (what the loss is taken on) come from the template's `{% generation %}` blocks where
it has them, as transformers' `return_assistant_tokens_mask` does; otherwise from rendering
prefixes: an assistant message's span is what its turn adds after the generation prompt of the
conversation before it, without the whitespace that follows the end-of-turn token (TRL's training
templates leave that newline outside the tag too).

Where a template is found (`ChatTemplate.find`): `chat_template.jinja`, `chat_template.json` or
`tokenizer_config.json`'s `chat_template` in a Hugging Face folder, and a GGUF file's
`tokenizer.chat_template`.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from pathlib import Path

ROLES = ("system", "user", "assistant", "tool")
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
                source = json.loads((folder / name).read_text(encoding="utf-8")).get("chat_template")
                if isinstance(source, list):  # named templates: transformers renders "default"
                    source = {t.get("name"): t.get("template") for t in source}.get("default")
                if source:
                    return cls(source, specials, f"{folder / name}'s chat_template")
        return None

    @staticmethod
    def _special_tokens(path: Path) -> dict:
        config = path if path.name == CONFIG_FILE else path / CONFIG_FILE
        if not config.is_file():
            return {}
        settings = json.loads(config.read_text(encoding="utf-8"))
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
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        settings.pop("chat_template", None)  # the .jinja file is the one template
        config.write_text(json.dumps({**settings, **self.special_tokens}, indent=2, ensure_ascii=False) + "\n",
                          encoding="utf-8")

    # ------------------------------------------------------------------ rendering
    @property
    def has_generation_tags(self) -> bool:
        """Whether the template marks assistant text with `{% generation %}` blocks."""
        return self._generation_tags

    def render(self, messages, add_generation_prompt=False, tools=None) -> str:
        """The conversation as text, exactly as transformers' `apply_chat_template(tokenize=False)`;
        `tools`: JSON schemas of the tools the template may describe."""
        return self._render(messages, add_generation_prompt, tools, None)

    def _render(self, messages, add_generation_prompt, tools, spans):
        import jinja2

        check_messages(messages)
        variables = dict(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                         **self.special_tokens)
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

    def render_with_spans(self, messages, add_generation_prompt=False, tools=None) -> tuple[str, list]:
        """(text, [(start, end), ...]): the conversation and the character spans of its assistant
        messages, from the generation tags or, without them, from rendered prefixes."""
        if self.has_generation_tags:
            spans = []
            return self._render(messages, add_generation_prompt, tools, spans), spans
        text = self.render(messages, add_generation_prompt, tools)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True, tools=tools) if i else ""
            turn = self.render(messages[:i + 1], tools=tools)
            if not (turn.startswith(before) and text.startswith(turn)):
                raise ChatTemplateError(
                    f"The chat template ({self.origin}) does not render message {i} as an addition to the "
                    "conversation before it (it rewrites earlier turns, as templates that drop past reasoning "
                    "do), so its assistant tokens cannot be found by rendering prefixes. Add {% generation %} "
                    "tags around each assistant message in the template, or pass one with --chat-template FILE.")
            end = len(turn.rstrip(_WHITESPACE))
            if end > len(before):
                spans.append((len(before), end))
        return text, spans

    def prompt_and_completion(self, prompt, completion) -> tuple[str, list[tuple[int, int]]]:
        """A conversational prompt/completion pair: (text, [the completion's span]) as TRL takes it:
        the prompt rendered with its generation prompt, the completion is what the whole adds."""
        before = self.render(prompt, add_generation_prompt=True)
        text = self.render(list(prompt) + list(completion))
        if not text.startswith(before):
            raise ChatTemplateError(f"The chat template ({self.origin}) does not render the completion as an "
                                    "addition to the prompt with its generation prompt; use `messages` rows.")
        end = len(text.rstrip(_WHITESPACE))
        return text, [(len(before), end)] if end > len(before) else []


def _has_generation_block(env, source: str) -> bool:
    """Whether the parsed template calls the generation tag (comments and strings that merely
    mention it do not count)."""
    from jinja2 import nodes

    return any(node.name == "_generation" for node in env.parse(source).find_all(nodes.ExtensionAttribute))


def check_messages(messages):
    """A conversation is a list of {"role", "content"} with known roles; anything else is refused
    with what is wrong and where."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError(f"A conversation is a non-empty list of messages, got {type(messages).__name__}.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ChatTemplateError(f"Message {i} is not a {{'role': ..., 'content': ...}} dict: {message!r:.80}.")
        if message["role"] not in ROLES:
            raise ChatTemplateError(f"Message {i} has the unknown role {message['role']!r}; known roles: "
                                    f"{', '.join(ROLES)}.")
        if not isinstance(message["content"], (str, list)):
            raise ChatTemplateError(f"Message {i}'s content is a {type(message['content']).__name__}; it must be "
                                    "text, or a list of parts ({'type': 'text', 'text': ...}) as transformers takes.")
