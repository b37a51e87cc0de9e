"""`zoo generate MODEL "prompt" ...`: continue prompts, streaming the tokens as they come;
`zoo generate --tflite FILE --tokenizer FOLDER "prompt" ...`: greedy, with a prefill/decode .tflite file."""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from zoo.generation import SAMPLERS, detokenize, generate, stream, trim
from zoo.generation.sampling import check_options
from zoo.hub.tokenizers import END_OF_TEXT
from zoo.loading import TOKENIZER_DIR, load


def _stop_ids(tokenizer, args):
    """--stop tokens as ids; by default the tokenizer's end token, when it has one."""
    tokens = args.stop if args.stop is not None else [*END_OF_TEXT, "<|im_end|>"]  # and chat models' turn end
    vocabulary = set(tokenizer.get_vocabulary())
    if args.stop is not None:
        missing = [t for t in tokens if t not in vocabulary]
        if missing:
            raise ValueError(f"--stop token(s) {missing} are not in the tokenizer's vocabulary.")
    return [int(tokenizer.token_to_id(t)) for t in tokens if t in vocabulary] or None


def _tflite(args):
    """Greedy generation with zoo.export.LiteRTGenerator, one prompt per call, printed when done."""
    from zoo.export import LiteRTGenerator
    from zoo.hub import load_tokenizer

    if args.tokenizer is None:
        raise ValueError("--tflite needs --tokenizer FOLDER: a Hugging Face folder or a training run's folder "
                         "holding the model's tokenizer files.")
    if args.sampler != "greedy" or args.batch:
        raise ValueError("--tflite generates greedily, one prompt at a time; drop --sampler/--batch, or generate "
                         "from the model (zoo generate MODEL ...) or its SavedModel's `generate` signature.")
    folder = Path(args.tokenizer)
    tokenizer = load_tokenizer(folder / TOKENIZER_DIR if (folder / TOKENIZER_DIR).is_dir() else folder)
    if tokenizer is None:
        raise ValueError(f"{folder} holds no tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt "
                         "or vocab.txt).")
    runner = LiteRTGenerator(args.tflite)
    stop = _stop_ids(tokenizer, args)
    for prompt in [args.model, *args.prompt]:
        ids = np.asarray(tokenizer(prompt), np.int32).reshape(1, -1)
        rows, ends = trim(runner.generate(ids, args.max_new_tokens), np.int32([ids.shape[1]]), args.max_new_tokens,
                          np.int32(stop or []))  # where a stop token ends the text, as generate() cuts it
        print(detokenize(tokenizer, np.asarray(rows)[0, :int(ends[0])]))
    return 0


def _print_stream(tokens, decode):
    """Print decoded text as tokens arrive; waits for the rest of a split multi-byte character."""
    seen, shown = [], ""
    for token in tokens:
        seen.append(token)
        text = decode(seen)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    print()


def json_object(text):
    """argparse type of --chat-template-kwargs: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"takes a JSON object, got {text!r} ({error.msg}).") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"takes a JSON object (e.g. '{{\"enable_thinking\": false}}'), got {text!r}.")
    return value


def _chat(args, options):
    """`--chat QUESTION`: the question (after --system, if given) through the checkpoint's chat template,
    the answer streamed up to its end-of-turn token."""
    from zoo.chat import Chat

    if args.prompt or args.batch:
        raise ValueError("--chat takes one question (zoo generate RUN --chat \"question\"); drop the other prompts "
                         "and --batch.")
    chat = Chat.find(args.model, override=args.chat_template)
    model = load(args.model, task="causal_lm")
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.chat}]
    extra = {t: chat.tokenizer.token_id(t) for t in args.stop or []}
    unknown = [t for t, i in extra.items() if i is None]
    if unknown:
        raise ValueError(f"--stop token(s) {unknown} are not in the tokenizer's vocabulary.")
    options["stop_token_ids"] = chat.stop_ids + list(extra.values())
    ids = chat.prompt_ids(messages, **(args.chat_template_kwargs or {}))
    _print_stream(stream(model, ids, args.max_new_tokens, **options), chat.decode)
    return 0


def _generate(args):
    check_options(args.sampler, args.top_k, args.top_p, args.temperature)  # before anything is loaded
    if args.tflite:
        return _tflite(args)
    if args.chat is not None:
        options = {"sampler": args.sampler, "seed": args.seed}
        for name in ("top_k", "top_p", "temperature"):
            if getattr(args, name) is not None:
                options[name] = getattr(args, name)
        return _chat(args, options)
    if not args.prompt:
        raise ValueError("Give at least one prompt after the model: zoo generate MODEL \"prompt\".")
    model = load(args.model, task="causal_lm")
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"{args.model} has no tokenizer (a tokenizer/ folder or Hugging Face tokenizer files); "
                         "text prompts need one.")
    options = {"sampler": args.sampler, "seed": args.seed, "stop_token_ids": _stop_ids(model.tokenizer, args)}
    for name in ("top_k", "top_p", "temperature"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.batch:
        texts = generate(model, args.prompt, args.max_new_tokens, **options)
        print(json.dumps({"prompts": args.prompt, "outputs": texts}))
        return 0
    for prompt in args.prompt:
        print(prompt, end="", flush=True)
        _print_stream(stream(model, prompt, args.max_new_tokens, **options),
                      lambda tokens: detokenize(model.tokenizer, tokens))
    return 0


def register(subparsers):
    p = subparsers.add_parser("generate", help="continue prompts with a decoder, streaming tokens",
                              usage="zoo generate MODEL PROMPT [PROMPT ...] [options]\n"
                              "       zoo generate MODEL --chat QUESTION [--system TEXT] [options]\n"
                              "       zoo generate --tflite FILE --tokenizer FOLDER PROMPT [PROMPT ...] [options]")
    p.add_argument("model", help="a training run folder, a Hugging Face folder or repo id, or a .keras file "
                   "(with --tflite: the first prompt)")
    p.add_argument("prompt", nargs="*", help="one or more prompts")
    p.add_argument("--tflite", default=None, metavar="FILE",
                   help="generate greedily with a prefill/decode .tflite file (zoo export --format tflite --generate)")
    p.add_argument("--tokenizer", default=None, metavar="FOLDER",
                   help="--tflite: the Hugging Face or training run folder whose tokenizer the file's model uses")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--sampler", default="greedy", help=f"one of {', '.join(SAMPLERS)}")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="fixes a random sampler's draws")
    p.add_argument("--stop", action="append", default=None, metavar="TOKEN",
                   help="stop after this token (repeatable; default: the tokenizer's end-of-text token)")
    p.add_argument("--chat", metavar="QUESTION",
                   help="answer QUESTION through the checkpoint's chat template, stopping at its end-of-turn token")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--chat-template", metavar="FILE", help="with --chat: a .jinja template instead of the folder's")
    p.add_argument("--chat-template-kwargs", metavar="JSON", type=json_object,
                   help="with --chat: the template's keyword arguments, e.g. '{\"enable_thinking\": false}'")
    p.add_argument("--batch", action="store_true",
                   help="generate all prompts in one batch and print a JSON line instead of streaming")
    p.set_defaults(func=_generate)
