"""The `generate` and `generate_text` signatures of a decoder's SavedModel, so a TF Serving
client sends a prompt once and gets the continuation: the prompt is prefilled into a
key/value cache and keras-hub's sampler loop runs `call_with_cache` inside the graph
(`zoo.generation.cached_loop`), the sampler settings and a seed being inputs
(`zoo.generation.sampling.SettingsSampler`). Inputs and outputs: docs/export.md.
"""

from __future__ import annotations

import tensorflow as tf

from zoo import generation
from zoo.generation.sampling import SettingsSampler, sampler_id

GENERATE_SIGNATURE = "generate"
GENERATE_TEXT_SIGNATURE = "generate_text"


def settings_specs() -> dict:
    """The scalar inputs both signatures take besides the prompt."""
    return {
        "max_new_tokens": tf.TensorSpec([], tf.int32, name="max_new_tokens"),
        "sampler": tf.TensorSpec([], tf.string, name="sampler"),
        "top_k": tf.TensorSpec([], tf.int32, name="top_k"),
        "top_p": tf.TensorSpec([], tf.float32, name="top_p"),
        "temperature": tf.TensorSpec([], tf.float32, name="temperature"),
        "seed": tf.TensorSpec([], tf.int32, name="seed"),
        "end_token_id": tf.TensorSpec([], tf.int32, name="end_token_id"),
    }


def check_decoder(model):
    if getattr(model, "task", None) != "causal_lm":
        raise ValueError(f"generate signatures need a decoder language model (task 'causal_lm'); "
                         f"{getattr(model, 'name', model)!r} has task {getattr(model, 'task', None)!r}. Export "
                         "zoo.get('dec-...') or pass generate=False.")


def _checked(model, lengths, settings):
    """Serving-time errors that name the limit, instead of a failure deep in the loop."""
    limit = model.spec.max_sequence_length
    longest, new = tf.reduce_max(lengths), settings["max_new_tokens"]
    return [
        tf.debugging.assert_positive(tf.reduce_min(lengths), message="Every prompt needs at least one token "
                                     "(a padding_mask row of zeros is an empty prompt)."),
        tf.debugging.assert_positive(new, message="max_new_tokens must be >= 1."),
        tf.debugging.assert_less_equal(longest + new, limit, message=(
            f"The longest prompt plus max_new_tokens exceeds the {limit} positions of this model; shorten the prompt "
            "or ask for fewer new tokens.")),
        tf.debugging.assert_positive(settings["temperature"], message="temperature must be > 0."),
    ]


def generate_graph(model, token_ids, padding_mask, settings) -> dict:
    """The `generate` signature's body (see the module docstring)."""
    mask = tf.cast(padding_mask, tf.bool)
    lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    right_padded = tf.reduce_all(tf.equal(mask, tf.sequence_mask(lengths, tf.shape(mask)[1])))
    checks = _checked(model, lengths, settings) + [tf.debugging.Assert(right_padded, [
        "Prompts must be right-padded: each padding_mask row is 1s (the prompt) then 0s."])]
    with tf.control_dependencies(checks):  # everything below waits for the checks
        longest, new = tf.reduce_max(lengths), tf.identity(settings["max_new_tokens"])
    batch = tf.shape(token_ids)[0]
    pad = tf.zeros([batch, new], tf.int32)
    buffer = tf.concat([tf.where(mask, token_ids, 0)[:, :longest], pad], axis=1)
    prompt_mask = tf.concat([mask[:, :longest], tf.cast(pad, tf.bool)], axis=1)
    sampler = SettingsSampler(sampler_id(settings["sampler"]), settings["top_k"], settings["top_p"],
                              settings["temperature"], settings["seed"])
    end = settings["end_token_id"]
    out = generation.cached_loop(model, sampler, buffer, prompt_mask, tf.reduce_min(lengths), stop_token_ids=[end])
    tokens, ends = generation.trim(out, lengths, new, end[None])
    return {"token_ids": tokens, "lengths": ends}


def add_signatures(archive, model, tokenizer=None):
    """Add `generate` (and `generate_text` when there is a tokenizer) to a keras ExportArchive."""
    check_decoder(model)
    specs = settings_specs()

    def serve(inputs):
        return generate_graph(model, inputs["token_ids"], inputs["padding_mask"], inputs)

    prompt = {"token_ids": tf.TensorSpec([None, None], tf.int32, name="token_ids"),
              "padding_mask": tf.TensorSpec([None, None], tf.int32, name="padding_mask")}
    archive.add_endpoint(GENERATE_SIGNATURE, serve, input_signature=[{**prompt, **specs}])
    if tokenizer is None:
        return

    def serve_text(inputs):
        ragged = tf.cast(tokenizer(inputs["text"]), tf.int32)
        out = generate_graph(model, ragged.to_tensor(0), tf.sequence_mask(ragged.row_lengths(), dtype=tf.int32),
                             inputs)
        ids = tf.RaggedTensor.from_tensor(out["token_ids"], lengths=out["lengths"])
        return {"text": tokenizer.detokenize(ids), **out}

    archive.add_endpoint(GENERATE_TEXT_SIGNATURE, serve_text,
                         input_signature=[{"text": tf.TensorSpec([None], tf.string, name="text"), **specs}])
