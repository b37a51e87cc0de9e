"""Text generation for zoo decoders with a key/value cache.

    text = zoo.generation.generate(model, "The capital of France is", max_new_tokens=8)

The prompt runs through the blocks once and fills a [B, 2, T, KV, D] cache per
block (`DecoderCausalLM.call_with_cache`); every further token then costs one position.
The decode loop and the sampling are keras-hub's `Sampler` (greedy, top-k, top-p,
temperature; zoo.generation.sampling), compiled with `tf.function` once per (batch,
prompt length, total length).
`use_cache=False` reruns the whole prefix for each token: the baseline the
benchmark compares against.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from zoo.generation.sampling import SAMPLERS, make_sampler


def _check_decoder(model):
    if getattr(model, "task", None) != "causal_lm":
        raise ValueError("generate() needs a decoder language model: zoo.get('dec-...', task='causal_lm').")


def cached_loop(model, sampler, buffer, mask, prompt_length, stop_token_ids=None):
    """(buffer [B, T], prompt mask [B, T], shortest prompt length) -> filled buffer: prefill the
    shortest prompt, then the sampler's loop over `call_with_cache`. Graph code, shared by
    `generate` (traced below) and the SavedModel `generate` signature (zoo.export.generate)."""
    cache = model.init_cache(tf.shape(buffer)[0], tf.shape(buffer)[1])
    _, _, cache = model.call_with_cache(buffer[:, :prompt_length], cache, 0)  # prefill

    def next_logits(prompt, cache, index):
        logits, _, cache = model.call_with_cache(prompt[:, index - 1:index], cache, index - 1)
        return logits[:, -1], None, cache

    return sampler(next_logits, buffer, cache=cache, index=prompt_length, mask=mask, stop_token_ids=stop_token_ids)


def _cached_decode(model, sampler):
    """A tf.function: (buffer [B, T], prompt mask [B, T], prompt length) -> filled buffer."""

    @tf.function(reduce_retracing=True, autograph=False)
    def run(buffer, mask, prompt_length):
        return cached_loop(model, sampler, buffer, mask, prompt_length)

    return run


def _uncached_decode(model, sampler):
    """The baseline: every token reruns the model on the whole prefix."""

    @tf.function(reduce_retracing=True, autograph=False)
    def run(buffer, mask, prompt_length):
        def next_logits(prompt, cache, index):
            tokens = prompt[:, :index]
            logits = model({"token_ids": tokens, "padding_mask": tf.ones_like(tokens)})["logits"]
            return logits[:, -1], None, cache

        return sampler(next_logits, buffer, index=prompt_length, mask=mask)

    return run


def _encode(prompt, tokenizer):
    """Prompt (str, list of str, or token ids) -> a list of int32 rows and whether it was text."""
    if isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], str)):
        if tokenizer is None:
            raise ValueError("A text prompt needs a tokenizer: load the model with zoo.hub.load "
                             "(it attaches one) or pass tokenizer=.")
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        rows = [np.asarray(tokenizer(t)).reshape(-1) for t in texts]
        text = True
    else:
        rows = [np.asarray(prompt).reshape(-1)] if np.ndim(prompt[0]) == 0 else [np.asarray(r) for r in prompt]
        text = False
    if any(len(r) == 0 for r in rows):
        raise ValueError("Prompts must be non-empty; got an empty prompt (no tokens).")
    return [r.astype("int32") for r in rows], text


def _check_length(model, longest, max_new_tokens):
    limit = model.spec.max_sequence_length
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    if longest >= limit:  # no room for even one new token: only a shorter prompt helps
        raise ValueError(f"The prompt is {longest} tokens, and the model has {limit} positions: no room for a new "
                         f"token. Shorten the prompt to at most {limit - 1} tokens (its last ones carry the context).")
    if longest + max_new_tokens > limit:
        raise ValueError(f"The prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) is "
                         f"{longest + max_new_tokens} positions, more than the model's {limit}; "
                         f"shorten the prompt or ask for at most {limit - longest} new tokens.")


def generate(model, prompt=None, max_new_tokens=32, sampler="greedy", seed=None, tokenizer=None, use_cache=True,
             stop_token_ids=None, compile=True, jit_compile=False, messages=None, chat=None, chat_template_kwargs=None,
             **sampler_args):
    """Continue each prompt by `max_new_tokens` tokens, or answer a conversation (`messages=`).

    Prompts of different lengths are batched as keras-hub does: right-padded in one
    buffer, with a mask that keeps each row's own prompt tokens; the loop starts at
    the shortest prompt, so every row sees exactly its own positions and greedy
    outputs equal each prompt generated alone.

    Args:
        model: a decoder language model (`zoo.get("dec-...")` or `zoo.hub.load`).
        prompt: a string, a list of strings, or token ids ([P] or a list of rows).
        max_new_tokens: how many tokens to add to each prompt.
        sampler: "greedy", "top_k" (top_k=), "top_p" (top_p=), "temperature" (or "random":
            samples the whole softmax(logits / temperature)), or a keras-hub `Sampler`.
        seed: fixes the draws of a random sampler (same seed, same text).
        tokenizer: for text prompts; default: the model's `tokenizer` attribute.
        use_cache: run each new token against a key/value cache (False reruns the prefix).
        stop_token_ids: token ids after which a row's generation is cut.
        compile: trace the loop with tf.function (once per shape; tens of seconds for a
            30-layer model on CPU, then fast); False runs the same loop eagerly.
        jit_compile: refused: XLA needs static shapes that the loop does not have.
        messages: instead of `prompt`, a conversation ([{"role", "content"}, ...]) or a list of
            them: each is rendered by the checkpoint's chat template with its generation prompt,
            and its answer stops at the template's end-of-turn token (or eos).
        chat: for `messages`, a `zoo.chat.Chat` (default: the model's `chat`, which zoo.load and
            zoo.hub.load attach when the checkpoint has a chat template).
        chat_template_kwargs: for `messages`, the template's keyword arguments (`{"enable_thinking": False}`).

    Returns:
        The full text(s) for text prompts; the answer(s) for `messages`, without the end-of-turn
        token; else int32 token ids [B, longest + max_new_tokens], where row i holds its prompt,
        its `max_new_tokens` new tokens, then zeros.

    Example:
    >>> generate(model, ["The capital of France is", "Once upon a"], max_new_tokens=8)
    >>> generate(model, messages=[{"role": "user", "content": "What is the capital of France?"}])
    """
    if messages is not None:
        return _answer(model, prompt, messages, chat, max_new_tokens, stop_token_ids,
                       (sampler, seed, use_cache, compile, jit_compile, sampler_args), chat_template_kwargs or {})
    if prompt is None:
        raise ValueError("generate() needs a prompt (text or token ids), or messages= (a conversation).")
    _check_decoder(model)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    rows, text = _encode(prompt, tokenizer)
    out, ends = generate_ids(model, rows, max_new_tokens, sampler, seed, use_cache, stop_token_ids, compile,
                              jit_compile, sampler_args)
    if not text:
        return out
    texts = [detokenize(tokenizer, row[:end]) for row, end in zip(out, ends)]
    return texts[0] if isinstance(prompt, str) else texts


def generate_ids(model, rows, max_new_tokens, sampler, seed, use_cache, stop_token_ids, compile, jit_compile,
                 sampler_args):
    """(tokens [B, T], ends [B]) of `generate` for prompts as int32 rows (lists of ids): what `generate` and
    zoo.grpo's sampling share, with every option explicit."""
    if jit_compile:
        raise ValueError("generate(jit_compile=True) is not supported: XLA needs static shapes, and the decode "
                         "loop's prompt length and cache index are dynamic. Use compile=True (a TF graph).")
    lengths = [len(r) for r in rows]
    max_new_tokens = int(max_new_tokens)
    _check_length(model, max(lengths), max_new_tokens)
    total = max(lengths) + max_new_tokens
    buffer = np.zeros((len(rows), total), "int32")
    mask = np.zeros((len(rows), total), bool)
    for i, row in enumerate(rows):
        buffer[i, :len(row)] = row
        mask[i, :len(row)] = True
    run = _compiled(model, sampler, seed, use_cache, sampler_args)
    run = run if compile else run.python_function
    out = run(tf.constant(buffer), tf.constant(mask), tf.constant(min(lengths), tf.int32))
    # a shorter prompt ran further, a stop token ends a row: pad with 0
    return tuple(np.array(t) for t in trim(out, tf.constant(lengths, tf.int32), max_new_tokens,
                                           tf.constant(list(stop_token_ids or ()), tf.int32)))


def _answer(model, prompt, messages, chat, max_new_tokens, stop_token_ids, options, template_kwargs):
    """`generate(messages=...)`: the conversations' prompts through the chat template, the answers
    decoded up to their end-of-turn token."""
    if prompt is not None:
        raise ValueError("generate() takes a prompt or messages=, not both.")
    chat = chat if chat is not None else getattr(model, "chat", None)
    if chat is None:
        raise ValueError("generate(messages=...) needs the checkpoint's chat template: load the model with "
                         "zoo.load / zoo.hub.load from a folder that has one (they attach it as model.chat), or pass "
                         "chat=zoo.chat.Chat.find(FOLDER).")
    _check_decoder(model)
    one = bool(messages) and isinstance(messages[0], dict)
    conversations = [messages] if one else list(messages)
    rows = [chat.prompt_ids(m, **template_kwargs) for m in conversations]
    stops = list(chat.stop_ids) + [int(t) for t in stop_token_ids or ()]
    sampler, seed, use_cache, compile, jit_compile, sampler_args = options
    out, ends = generate_ids(model, rows, max_new_tokens, sampler, seed, use_cache, stops, compile, jit_compile,
                              sampler_args)
    answers = [chat.decode(row[len(ids):end]) for row, ids, end in zip(out, rows, ends)]
    return answers[0] if one else answers


def stream(model, prompt, max_new_tokens=32, sampler="greedy", seed=None, tokenizer=None,
           stop_token_ids=None, **sampler_args):
    """Yield one prompt's new tokens as they are generated (what `zoo generate` prints).

    The same cache and sampler as `generate`, one position per compiled step, so greedy
    tokens equal `generate`'s.

    Args:
        model, prompt, max_new_tokens, sampler, seed, tokenizer, stop_token_ids: as `generate`,
            for a single prompt.
        **sampler_args: the sampler's options (top_k=, top_p=, temperature=).

    Yields:
        Each new token id (an int), stopping after a stop token.

    Example:
    >>> for token in stream(model, "Once upon a time", 16):
    ...     print(model.tokenizer.detokenize([token]), end="")
    """
    _check_decoder(model)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    rows, _ = _encode(prompt, tokenizer)
    if len(rows) != 1:
        raise ValueError(f"stream() takes one prompt, got {len(rows)}; use generate() for a batch.")
    (ids,) = rows
    _check_length(model, len(ids), int(max_new_tokens))
    sampler_obj = make_sampler(sampler, seed=seed, **sampler_args)
    total = len(ids) + int(max_new_tokens)
    step = _step_function(model)
    cache = model.init_cache(1, total)
    logits, cache = step(tf.constant(ids[None]), cache, tf.constant(0, tf.int32))
    stops = set(stop_token_ids or ())
    for index in range(len(ids), total):
        probabilities = sampler_obj.compute_probabilities(logits[:, -1])
        token = int(np.asarray(sampler_obj.get_next_token(probabilities)).reshape(-1)[0])
        yield token
        if token in stops or index + 1 == total:
            return
        logits, cache = step(tf.constant([[token]], tf.int32), cache, tf.constant(index, tf.int32))


def _step_function(model):
    """call_with_cache as one traced graph per input shape (cached on the model)."""
    fns = model.__dict__.setdefault("_zoo_generate", {})  # plain attribute: not tracked by Keras
    if "step" not in fns:

        @tf.function(reduce_retracing=True, autograph=False)
        def step(tokens, cache, index):
            logits, _, cache = model.call_with_cache(tokens, cache, index)
            return logits, cache

        fns["step"] = step
    return fns["step"]


def _compiled(model, sampler, seed, use_cache, sampler_args):
    """One traced decode function per model and sampler setting; a seed only resets the state."""
    key = (use_cache, sampler if not isinstance(sampler, str) else sampler.replace("-", "_"),
           tuple(sorted(sampler_args.items())))
    fns = model.__dict__.setdefault("_zoo_generate", {})  # plain attribute: not tracked by Keras
    if key not in fns:
        sampler_obj = make_sampler(sampler, seed=0, **sampler_args)
        fns[key] = (sampler_obj, (_cached_decode(model, sampler_obj) if use_cache
                                  else _uncached_decode(model, sampler_obj)))
    sampler_obj, run = fns[key]
    generator = getattr(sampler_obj, "seed_generator", None)
    if generator is not None:
        start = np.random.SeedSequence(seed).generate_state(1)[0] if seed is None else seed
        generator.state.assign(np.asarray([start, 0]).astype(generator.state.dtype))
    return run


def trim(tokens, lengths, max_new_tokens, stop_token_ids):
    """Each row of `tokens` [B, T] cut after its own `max_new_tokens` new tokens (it starts at
    `lengths` [B]) or just after its first generated stop token (`stop_token_ids` [N], maybe
    empty), zeros after: (tokens, ends [B]). Graph code, shared with the exported signatures."""
    positions = tf.range(tf.shape(tokens)[1])[None, :]
    first, last = lengths[:, None], lengths[:, None] + max_new_tokens
    stops = tf.reduce_any(tokens[:, :, None] == tf.cast(stop_token_ids, tokens.dtype)[None, None, :], axis=-1)
    stops = stops & (positions >= first) & (positions < last)
    ends = tf.minimum(tf.reduce_min(tf.where(stops, positions + 1, tf.shape(tokens)[1] + 1), axis=1), last[:, 0])
    return tf.where(positions < ends[:, None], tokens, tf.zeros_like(tokens)), ends


def detokenize(tokenizer, ids) -> str:
    """Token ids -> text, whichever form the keras-hub tokenizer returns (bytes or str)."""
    value = tokenizer.detokenize(np.asarray(ids, "int32"))
    value = np.asarray(value).item() if np.ndim(value) == 0 else value
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


__all__ = ["SAMPLERS", "cached_loop", "detokenize", "generate", "generate_ids", "make_sampler", "stream", "trim"]
