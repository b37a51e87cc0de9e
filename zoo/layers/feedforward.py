"""Position-wise feed-forward networks: BERT's GELU MLP and the gated ones (Llama's and
Qwen's SwiGLU, Gemma's and ModernBERT's GeGLU)."""

import keras

from zoo.layers.initializers import init
from zoo.ops.activations import activation as activation_fn


class FeedForward(keras.layers.Layer):
    """`gated=False`: down(act(up(x))) (BERT `intermediate`/`output`).
    `gated=True`: down(act(gate(x)) * up(x)) (Llama `mlp`; ModernBERT's Wi holds [gate; up]).
    `activation` defaults to the family's classic: gelu ungated, silu gated; `use_bias` to
    biases ungated only."""

    def __init__(self, intermediate_dim, gated=False, activation=None, use_bias=None, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim, self.gated = intermediate_dim, gated
        self.activation = activation or ("silu" if gated else "gelu")
        self.use_bias = (not gated) if use_bias is None else use_bias
        self._act = activation_fn(self.activation)
        self.up = self._dense(intermediate_dim, "up")
        self.gate = self._dense(intermediate_dim, "gate") if gated else None
        self.down = None

    def _dense(self, units, name):
        return keras.layers.Dense(
            units, use_bias=self.use_bias, kernel_initializer=init(), name=name, dtype=self.dtype_policy
        )

    def build(self, input_shape):
        self.up.build(input_shape)
        if self.gate is not None:
            self.gate.build(input_shape)
        self.down = self._dense(input_shape[-1], "down")
        self.down.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, x):
        if self.gated:
            return self.down(self._act(self.gate(x)) * self.up(x))
        return self.down(self._act(self.up(x)))

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "gated": self.gated,
                "activation": self.activation, "use_bias": self.use_bias}
