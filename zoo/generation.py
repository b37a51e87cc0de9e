"""Text generation for zoo decoders with a key/value cache.

    text = zoo.generation.generate(model, "The capital of France is", max_new_tokens=8)

The prompt runs through the blocks once and fills a [B, 2, T, KV, D] cache per
block (`DecoderCausalLM.call_with_cache`); every further token then costs one position.
The decode loop and the sampling are keras-hub's `Sampler` (greedy, top-k, top-p,
temperature),
compiled with `tf.function` once per (batch, prompt length, total length).
`use_cache=False` reruns the whole prefix for each token: the baseline the
benchmark compares against.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SAMPLERS = ("greedy", "top_k", "top_p", "temperature")


def make_sampler(sampler="greedy", seed=None, top_k=50, top_p=0.9, temperature=1.0):
    """A keras-hub sampler from a name: "greedy", "top_k"/"top-k", "top_p"/"top-p", or
    "temperature" (also "random": keras-hub's `RandomSampler`, a draw from the whole
    softmax(logits / temperature))."""
    import keras_hub

    if not isinstance(sampler, str):
        return sampler  # already a keras_hub.samplers.Sampler
    name = sampler.replace("-", "_")
    if name == "greedy":
        return keras_hub.samplers.GreedySampler()
    if name == "top_k":
        return keras_hub.samplers.TopKSampler(k=top_k, seed=seed, temperature=temperature)
    if name == "top_p":
        return keras_hub.samplers.TopPSampler(p=top_p, seed=seed, temperature=temperature)
    if name in ("temperature", "random"):
        return keras_hub.samplers.RandomSampler(seed=seed, temperature=temperature)
    raise ValueError(f"Unknown sampler {sampler!r}; known: {', '.join(SAMPLERS)} (or a keras_hub sampler).")


def _check_decoder(model):
    if getattr(model, "task", None) != "causal_lm":
        raise ValueError("generate() needs a decoder language model: zoo.get('dec-...', task='causal_lm').")


def _cached_decode(model, sampler):
    """A tf.function: (buffer [B, T], prompt mask [B, T], prompt length) -> filled buffer."""

    @tf.function(reduce_retracing=True, autograph=False)
    def run(buffer, mask, prompt_length):
        cache = model.init_cache(tf.shape(buffer)[0], tf.shape(buffer)[1])
        _, _, cache = model.call_with_cache(buffer[:, :prompt_length], cache, 0)  # prefill

        def next_logits(prompt, cache, index):
            logits, _, cache = model.call_with_cache(prompt[:, index - 1:index], cache, index - 1)
            return logits[:, -1], None, cache

        return sampler(next_logits, buffer, cache=cache, index=prompt_length, mask=mask)

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
    """Prompt (str, list of str, or token ids) -> int32 [B, P] and whether it was text."""
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
    lengths = {len(r) for r in rows}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"Prompts must be non-empty and of equal length in tokens, got lengths {sorted(lengths)}; "
                         "generate them one at a time or batch prompts of the same length.")
    return np.stack(rows).astype("int32"), text


def generate(model, prompt, max_new_tokens=32, sampler="greedy", seed=None, tokenizer=None, use_cache=True,
             stop_token_ids=None, compile=True, **sampler_args):
    """Continue `prompt` by `max_new_tokens` tokens.

    prompt: a string, a list of strings (of equal token length) or token ids [B, P].
    sampler: "greedy" | "top_k" | "top_p" | "temperature" (top_k=, top_p=, temperature=) or a
        keras-hub sampler; "temperature" (or "random") samples the whole softmax(logits / temperature).
    seed: fixes the draws of a random sampler (same seed, same text).
    compile: trace the loop with tf.function (once per shape; tens of seconds for a 30-layer
    model on CPU, then fast); False runs the same loop eagerly, quicker for a few tokens.
    Returns the full text(s) for text prompts, else int32 token ids [B, P + max_new_tokens].
    """
    _check_decoder(model)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    ids, text = _encode(prompt, tokenizer)
    batch, length = ids.shape
    total = length + int(max_new_tokens)
    if max_new_tokens < 1 or total > model.spec.max_sequence_length:
        raise ValueError(f"max_new_tokens must be >= 1 and prompt + new tokens ({total}) <= the model's "
                         f"{model.spec.max_sequence_length} positions.")
    buffer = np.zeros((batch, total), "int32")
    buffer[:, :length] = ids
    mask = np.zeros((batch, total), bool)
    mask[:, :length] = True
    run = _compiled(model, sampler, seed, use_cache, sampler_args)
    run = run if compile else run.python_function
    out = np.asarray(run(tf.constant(buffer), tf.constant(mask), tf.constant(length, tf.int32)))
    if stop_token_ids is not None:
        out = _cut_at_stop(out, length, stop_token_ids)
    if not text:
        return out
    texts = [_detokenize(tokenizer, row) for row in out]
    return texts[0] if isinstance(prompt, str) else texts


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


def _cut_at_stop(out, length, stop_token_ids):
    """Replace everything after the first generated stop token by the stop token's padding (0)."""
    out = out.copy()
    for row in out:
        hits = np.flatnonzero(np.isin(row[length:], stop_token_ids))
        if hits.size:
            row[length + hits[0] + 1:] = 0
    return out


def _detokenize(tokenizer, ids):
    value = tokenizer.detokenize(ids)
    value = np.asarray(value).item() if np.ndim(value) == 0 else value
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
