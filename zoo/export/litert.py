"""On-device generation: a .tflite file with `prefill` and `decode` signatures that carry
the key/value cache as explicit inputs and outputs, and the loop that runs it with
ai_edge_litert's signature runners.

    prefill  token_ids [B, P], index [], length [], cache_0..cache_{L-1} [B, 2, T, KV, D]
             -> logits [B, vocab] at position index + length - 1, the updated caches
    decode   token_ids [B, 1], index [], the caches -> logits [B, vocab], the caches

P (the prefill length), T (the cache length) and B are fixed at export, as TFLite wants;
both signatures are `call_with_cache` (the decoder's one cached forward pass) on the
plain attention core, built-in ops only. A prompt shorter than P is right-padded (the
padded positions' keys are overwritten by the decode steps before any query sees
them); a longer one is prefilled in chunks of P. Weights can be int8 (float activations;
made as zoo.export.convert says).

    zoo.export.tflite_generator(model, "dec-base.tflite", quantize="int8", prefill_length=64)
    zoo.export.LiteRTGenerator("dec-base.tflite").generate([[1, 2, 3]], max_new_tokens=16)  # greedy
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from zoo import generation
from zoo.export.convert import check_quantize, resolve_int8_mode, write_flatbuffer
from zoo.export.size import check_flatbuffer
from zoo.files import atomic_path, check_target

SIGNATURES = ("prefill", "decode")


@dataclass
class LiteRTExport:
    path: str
    quantize: str
    size_bytes: int
    estimated_bytes: int
    batch_size: int
    prefill_length: int
    cache_length: int
    int8_mode: str = None  # how an int8 file was made (zoo.export.convert)


def cache_names(model) -> list[str]:
    return [f"cache_{i}" for i in range(model.spec.num_layers)]


def _specs(model, batch_size, length, cache_length) -> dict:
    spec = model.spec
    dtype = tf.as_dtype(model.backbone.token_embedding.compute_dtype)
    cache = [batch_size, 2, cache_length, spec.num_kv_heads, spec.head_dim]
    specs = {"token_ids": tf.TensorSpec([batch_size, length], tf.int32, name="token_ids"),
             "index": tf.TensorSpec([], tf.int32, name="index")}
    if length > 1:
        specs["length"] = tf.TensorSpec([], tf.int32, name="length")
    return {**specs, **{name: tf.TensorSpec(cache, dtype, name=name) for name in cache_names(model)}}


def step_function(model):
    """One signature's body: `call_with_cache` at positions index.., the logits of the last real
    position only (the LM head runs on one position, not the whole chunk)."""
    names = cache_names(model)

    def step(inputs):
        caches = tuple(inputs[name] for name in names)
        _, hidden, caches = model.call_with_cache(inputs["token_ids"], caches, inputs["index"])
        last = inputs["length"] - 1 if "length" in inputs else 0
        logits = model.lm_logits(tf.gather(hidden, last, axis=1))
        return {"logits": tf.cast(logits, tf.float32), **dict(zip(names, caches))}

    return step


def check_lengths(model, prefill_length, cache_length, batch_size):
    limit = model.spec.max_sequence_length
    for name, value in (("prefill_length", prefill_length), ("cache_length", cache_length)):
        if not 0 < value <= limit:
            raise ValueError(f"{name}={value} is outside this model's range 1..{limit} positions; choose at most "
                             f"{limit}.")
    if prefill_length > cache_length:
        raise ValueError(f"prefill_length={prefill_length} is longer than cache_length={cache_length}: a prefill "
                         "chunk must fit the cache. Raise cache_length or lower prefill_length.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")


def generator_endpoints(model, batch_size, prefill_length, cache_length) -> dict:
    """The file's two signatures at their fixed shapes, both the same step function."""
    step = step_function(model)
    return {"prefill": (step, _specs(model, batch_size, prefill_length, cache_length)),
            "decode": (step, _specs(model, batch_size, 1, cache_length))}


def tflite_generator(model, path, quantize=None, prefill_length=128, cache_length=None, batch_size=1,
                     overwrite=False, int8_mode="auto") -> LiteRTExport:
    """Write a decoder as a .tflite file with `prefill` and `decode` signatures (see the module).

    Args:
        model: a zoo decoder language model.
        path: the .tflite file, written atomically.
        quantize: None (float32), "float16" or "int8" (int8 weights, float activations).
        prefill_length: positions per prefill call (P); longer prompts take several calls.
        cache_length: positions the cache holds (T): prompt plus new tokens; default
            min(model maximum, 1024).
        batch_size: rows per call (B); rows of one batch share their positions.
        overwrite: replace an existing file.
        int8_mode: "auto", "dynamic_range" or "stand_in", as `zoo.export.tflite`.

    Returns:
        A `LiteRTExport` (the file's size and the size estimated before converting).

    Example:
    >>> tflite_generator(zoo.get("dec-base"), "dec-base-int8.tflite", quantize="int8", prefill_length=128)
    """
    if getattr(model, "task", None) != "causal_lm":
        raise ValueError(f"prefill/decode signatures need a decoder language model (task 'causal_lm'); "
                         f"got {getattr(model, 'task', None)!r}. Export zoo.get('dec-...').")
    check_quantize(quantize, int8_mode)
    if Path(path).suffix != ".tflite":
        raise ValueError(f"A TFLite file name must end in .tflite, got {str(path)!r}.")
    cache_length = cache_length or min(model.spec.max_sequence_length, 1024)
    check_lengths(model, prefill_length, cache_length, batch_size)
    estimate = check_flatbuffer(model, quantize)  # the 2 GB limit, before any conversion work
    check_target(path, overwrite)
    mode = resolve_int8_mode(model, quantize, int8_mode)
    shape = {"batch_size": batch_size, "prefill_length": prefill_length, "cache_length": cache_length}
    with atomic_path(path, overwrite) as tmp:
        write_flatbuffer(model, generator_endpoints, shape, tmp, quantize, mode)
        size = tmp.stat().st_size
    return LiteRTExport(str(path), quantize or "float32", size, estimate, batch_size, prefill_length, cache_length,
                        mode)


class LiteRTGenerator:
    """Greedy generation with a prefill/decode .tflite file, through ai_edge_litert."""

    def __init__(self, path, num_threads=None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=num_threads)
        signatures = self.interpreter.get_signature_list()
        if sorted(signatures) != sorted(SIGNATURES):
            raise ValueError(f"{path} has signatures {sorted(signatures)}, not prefill and decode; write it with "
                             "zoo.export.tflite_generator.")
        self.prefill = self.interpreter.get_signature_runner("prefill")
        self.decode = self.interpreter.get_signature_runner("decode")
        inputs = self.prefill.get_input_details()
        self.batch_size, self.prefill_length = (int(n) for n in inputs["token_ids"]["shape"])
        self.caches = {name: (tuple(int(n) for n in d["shape"]), d["dtype"]) for name, d in inputs.items()
                       if name.startswith("cache_")}
        self.cache_length = next(iter(self.caches.values()))[0][2]

    def empty_cache(self) -> dict:
        return {name: np.zeros(shape, dtype) for name, (shape, dtype) in self.caches.items()}

    def generate(self, prompt, max_new_tokens, stop_token_ids=None) -> np.ndarray:
        """Greedy continuation of `prompt` (token ids: [P] or rows of equal length, as many rows
        as the file's batch): int32 [B, len + max_new_tokens], zeros after a stop token."""
        rows = np.asarray(prompt, np.int32)
        rows = rows[None] if rows.ndim == 1 else rows
        batch, length = rows.shape
        if batch != self.batch_size:
            raise ValueError(f"This file takes {self.batch_size} prompt row(s) per call, got {batch}; export with "
                             f"batch_size={batch}.")
        if length + max_new_tokens > self.cache_length:
            raise ValueError(f"The prompt ({length} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the file's "
                             f"cache of {self.cache_length} positions; export with a larger cache_length.")
        caches = self.empty_cache()
        for start in self.chunks(length):
            chunk = rows[:, start:start + self.prefill_length]
            padded = np.zeros((batch, self.prefill_length), np.int32)
            padded[:, :chunk.shape[1]] = chunk
            out = self.prefill(token_ids=padded, index=np.int32(start), length=np.int32(chunk.shape[1]), **caches)
            caches = {name: out[name] for name in caches}
        tokens = [np.argmax(out["logits"], axis=-1).astype(np.int32)]
        for position in range(length, length + max_new_tokens - 1):
            out = self.decode(token_ids=tokens[-1][:, None], index=np.int32(position), **caches)
            caches = {name: out[name] for name in caches}
            tokens.append(np.argmax(out["logits"], axis=-1).astype(np.int32))
        result = np.concatenate([rows, np.stack(tokens, axis=1)], axis=1)
        result, _ = generation.trim(result, np.full([batch], length, np.int32), max_new_tokens,
                                    np.asarray(list(stop_token_ids or ()), np.int32))
        return np.asarray(result)

    def chunks(self, length) -> list[int]:
        """Where each prefill call starts. A prompt shorter than P is one padded call; a longer one
        is full chunks of P, the last ending at the prompt's end (it recomputes a few positions
        rather than writing padding that could run past the cache)."""
        size = self.prefill_length
        if length <= size:
            return [0]
        starts = list(range(0, length - size + 1, size))
        return starts if starts[-1] + size == length else starts + [length - size]
