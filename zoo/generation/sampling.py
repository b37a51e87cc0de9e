"""keras-hub's samplers by name (`make_sampler`, what `zoo.generation.generate` draws with),
and `SettingsSampler`: one whose settings are tensors, for an exported `generate` signature
that takes the sampler, k, p, the temperature and a seed as inputs. Its draws are
stateless, [seed, draw number], which is what a keras-hub sampler built with
`SeedGenerator(seed)` draws in turn; so a seeded `generate` and the exported graph draw
the same tokens (docs/design-notes.md, "Generation in exports").
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import keras
import keras_hub
import tensorflow as tf

SAMPLERS = ("greedy", "top_k", "top_p", "temperature")
SAMPLER_IDS = {name: i for i, name in enumerate(SAMPLERS)}


# The options each sampler draws with (keras-hub's: TopKSampler(k, temperature), TopPSampler(p, temperature),
# RandomSampler(temperature)); "random" is keras-hub's name for "temperature".
SAMPLER_OPTIONS = {"greedy": (), "top_k": ("top_k", "temperature"), "top_p": ("top_p", "temperature"),
                   "temperature": ("temperature",), "random": ("temperature",)}
DEFAULTS = {"top_k": 50, "top_p": 0.9, "temperature": 1.0}


def check_options(sampler="greedy", top_k=None, top_p=None, temperature=None):
    """Refuse a sampler name or setting that no draw could use, before any model is loaded or run: `zoo generate`
    and `generate()` / `stream()` alike. A temperature of 0 would divide the logits by zero (its limit is greedy);
    a setting the sampler does not draw with (`top_p` for "top_k") would be ignored."""
    if isinstance(sampler, str) and sampler.replace("-", "_") not in SAMPLER_OPTIONS:
        raise ValueError(f"Unknown sampler {sampler!r}; known: {', '.join(SAMPLERS)} (or a keras_hub sampler).")
    given = {k: v for k, v in {"top_k": top_k, "top_p": top_p, "temperature": temperature}.items() if v is not None}
    takes = SAMPLER_OPTIONS[sampler.replace("-", "_")] if isinstance(sampler, str) else ()
    for option in given:
        if option not in takes:
            owners = [name for name in SAMPLERS if option in SAMPLER_OPTIONS[name]]
            name = sampler if isinstance(sampler, str) else f"a {type(sampler).__name__} object (its own settings)"
            raise ValueError(f"{option} does not apply to sampler {name}, which would ignore it: it is a setting of "
                             f"{' and '.join(owners)}. Choose one of those samplers, or drop {option}.")
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a number above 0, got {temperature}: the logits are divided by it. "
                         "For the most likely token at every step use sampler 'greedy'.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}: the share of probability the draw keeps "
                         "(1 keeps every token).")
    if top_k is not None and (isinstance(top_k, bool) or int(top_k) != top_k or top_k < 1):
        raise ValueError(f"top_k must be a whole number of tokens, at least 1, got {top_k}.")


def make_sampler(sampler="greedy", seed=None, top_k=None, top_p=None, temperature=None):
    """A keras-hub sampler from a name: "greedy", "top_k"/"top-k", "top_p"/"top-p", or
    "temperature" (also "random": keras-hub's `RandomSampler`, a draw from the whole
    softmax(logits / temperature)). A setting left None takes `DEFAULTS` (k 50, p 0.9, temperature 1)."""
    check_options(sampler, top_k, top_p, temperature)
    if not isinstance(sampler, str):
        return sampler  # already a keras_hub.samplers.Sampler
    name = sampler.replace("-", "_")
    top_k, top_p, temperature = (DEFAULTS[k] if v is None else v for k, v in
                                 (("top_k", top_k), ("top_p", top_p), ("temperature", temperature)))
    if name == "greedy":
        return keras_hub.samplers.GreedySampler()
    if name == "top_k":
        return keras_hub.samplers.TopKSampler(k=top_k, seed=seed, temperature=temperature)
    if name == "top_p":
        return keras_hub.samplers.TopPSampler(p=top_p, seed=seed, temperature=temperature)
    return keras_hub.samplers.RandomSampler(seed=seed, temperature=temperature)  # "temperature", "random"


class _DrawSeed(keras.random.SeedGenerator):
    """A seed "generator" without state: `next()` returns the pair it was given. keras.random
    takes a seed as an int or a SeedGenerator; this is the second, so keras-hub's samplers
    accept it, and no variable is created inside the exported graph."""

    def __init__(self, pair):  # no super().__init__(): that would create the state variable
        self.pair = pair

    def next(self, ordered=True):
        return self.pair


def sampler_id(name):
    """A sampler name tensor ("greedy", "top_k", "top_p", "temperature"; "-" for "_") -> its index,
    with an error naming the choices for any other name."""
    name = tf.strings.regex_replace(name, "-", "_")
    matches = tf.stack([tf.equal(name, known) for known in SAMPLER_IDS])
    check = tf.debugging.Assert(tf.reduce_any(matches), [
        tf.constant(f"Unknown sampler; use one of {', '.join(SAMPLER_IDS)}. Got:"), name])
    with tf.control_dependencies([check]):
        return tf.cast(tf.argmax(tf.cast(matches, tf.int32)), tf.int32)


class SettingsSampler(keras_hub.samplers.Sampler):
    """keras-hub's decode loop, drawing with settings given as tensors.

    Args:
        kind: int32 scalar, a value of SAMPLER_IDS (see `sampler_id`).
        top_k: int32 scalar, k of "top_k" (clipped to 1..vocabulary).
        top_p: float32 scalar, p of "top_p".
        temperature: float32 scalar, for every sampler but "greedy" (as zoo.generation).
        seed: int scalar; draw i uses the stateless seed pair [seed, i].
    """

    def __init__(self, kind, top_k, top_p, temperature, seed):
        super().__init__(temperature=temperature)
        self.kind, self.top_k, self.top_p, self.seed = kind, top_k, top_p, seed
        self.draw = None

    def __call__(self, next, prompt, cache=None, index=0, **kwargs):
        start = tf.cast(index, tf.int64)

        def next_with_draw(prompt, cache, index):
            # The loop body calls next() before get_next_token(): this step's draw number.
            self.draw = tf.cast(index, tf.int64) - start
            return next(prompt, cache, index)

        return super().__call__(next_with_draw, prompt, cache=cache, index=index, **kwargs)

    def compute_probabilities(self, logits):
        return logits  # each branch applies its own temperature (greedy: 1, as GreedySampler())

    def get_next_token(self, logits):
        samplers = keras_hub.samplers
        seed_pair = _DrawSeed(tf.stack([tf.cast(self.seed, tf.int64), self.draw]))
        vocab = tf.shape(logits)[-1]

        def run(cls, temperature, **attributes):
            # keras-hub's own code for `cls`, on an object that holds the settings
            settings = SimpleNamespace(temperature=temperature, seed_generator=seed_pair, **attributes)
            probabilities = samplers.Sampler.compute_probabilities(settings, logits)
            return tf.cast(cls.get_next_token(settings, probabilities), tf.int32)

        branches = [
            lambda: run(samplers.GreedySampler, 1.0),
            lambda: run(samplers.TopKSampler, self.temperature, k=tf.clip_by_value(self.top_k, 1, vocab)),
            lambda: run(samplers.TopPSampler, self.temperature, p=self.top_p, k=None),
            lambda: run(samplers.RandomSampler, self.temperature),
        ]
        return tf.switch_case(self.kind, branches)
