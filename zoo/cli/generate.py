"""`zoo generate MODEL "prompt" ...`: continue prompts, streaming the tokens as they come."""

import json
import sys

from zoo.generation import SAMPLERS, detokenize, generate, stream
from zoo.loading import load


def _stop_ids(model, args):
    """--stop tokens as ids; by default the tokenizer's end token, when it has one."""
    tokenizer = getattr(model, "tokenizer", None)
    tokens = args.stop if args.stop is not None else ["<|endoftext|>", "</s>", "<|im_end|>"]
    if tokenizer is None:
        return None
    vocabulary = set(tokenizer.get_vocabulary())
    if args.stop is not None:
        missing = [t for t in tokens if t not in vocabulary]
        if missing:
            raise ValueError(f"--stop token(s) {missing} are not in the tokenizer's vocabulary.")
    return [int(tokenizer.token_to_id(t)) for t in tokens if t in vocabulary] or None


def _generate(args):
    model = load(args.model, task="causal_lm")
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"{args.model} has no tokenizer (a tokenizer/ folder or Hugging Face tokenizer files); "
                         "text prompts need one.")
    options = {"sampler": args.sampler, "seed": args.seed, "stop_token_ids": _stop_ids(model, args)}
    for name in ("top_k", "top_p", "temperature"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.batch:
        texts = generate(model, args.prompt, args.max_new_tokens, **options)
        print(json.dumps({"prompts": args.prompt, "outputs": texts}))
        return 0
    for prompt in args.prompt:
        print(prompt, end="", flush=True)
        tokens, shown = [], ""
        for token in stream(model, prompt, args.max_new_tokens, **options):
            tokens.append(token)
            text = detokenize(model.tokenizer, tokens)
            if not text.endswith("\ufffd"):  # wait for the rest of a split multi-byte character
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
        print()
    return 0


def register(subparsers):
    p = subparsers.add_parser("generate", help="continue prompts with a decoder, streaming tokens")
    p.add_argument("model", help="a training run folder, a Hugging Face folder or repo id, or a .keras file")
    p.add_argument("prompt", nargs="+", help="one or more prompts")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--sampler", default="greedy", help=f"one of {', '.join(SAMPLERS)}")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="fixes a random sampler's draws")
    p.add_argument("--stop", action="append", default=None, metavar="TOKEN",
                   help="stop after this token (repeatable; default: the tokenizer's end-of-text token)")
    p.add_argument("--batch", action="store_true",
                   help="generate all prompts in one batch and print a JSON line instead of streaming")
    p.set_defaults(func=_generate)
