"""Activations that keep less for the backward pass.

TensorFlow's GELUs (exact, 0.5·x·(1 + erf(x/√2)), and tanh-approximate) are chains of ops
whose gradients keep several ffn-wide tensors per layer (erf's or tanh's input and the
factors of the last products). Their derivatives need only x, so these GELUs keep x alone:
32·s·b·h bytes less per BERT layer in float32, for one more erf or tanh in the backward pass.
"""

import math

import tensorflow as tf

_TANH_C = math.sqrt(2.0 / math.pi)


@tf.custom_gradient
def gelu(x):
    """Exact (erf) GELU, as Hugging Face BERT's `hidden_act="gelu"`."""

    def grad(dy):
        cdf = 0.5 * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0))))
        pdf = tf.exp(-0.5 * tf.square(x)) * (1.0 / math.sqrt(2.0 * math.pi))
        return dy * (cdf + x * pdf)

    return 0.5 * x * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0)))), grad


@tf.custom_gradient
def gelu_tanh(x):
    """tanh-approximate GELU, as transformers' `gelu_pytorch_tanh` (Gemma): 0.5·x·(1 + tanh(c·(x + 0.044715·x³)))."""

    def grad(dy):
        t = tf.tanh(_TANH_C * (x + 0.044715 * x * x * x))
        return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _TANH_C * (1.0 + 3 * 0.044715 * x * x))

    return 0.5 * x * (1.0 + tf.tanh(_TANH_C * (x + 0.044715 * x * x * x))), grad


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "silu": tf.nn.silu}


def activation(name):
    """The function of an activation name (zoo.registry.ACTIVATIONS)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}.")
    return ACTIVATIONS[name]
