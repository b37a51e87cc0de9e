"""Position-wise feed-forward networks: BERT's GELU MLP and Llama's SwiGLU."""

import keras
from keras import ops

from zoo.layers.initializers import init
from zoo.ops.activations import gelu


class FeedForward(keras.layers.Layer):
    """`gated=False`: down(gelu(up(x))) with biases (BERT `intermediate`/`output`).
    `gated=True`: down(silu(gate(x)) * up(x)) without biases (Llama `mlp`)."""

    def __init__(self, intermediate_dim, gated=False, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim, self.gated = intermediate_dim, gated
        self.up = self._dense(intermediate_dim, "up")
        self.gate = self._dense(intermediate_dim, "gate") if gated else None
        self.down = None

    def _dense(self, units, name):
        return keras.layers.Dense(
            units, use_bias=not self.gated, kernel_initializer=init(), name=name, dtype=self.dtype_policy
        )

    def build(self, input_shape):
        self.up.build(input_shape)
        if self.gate is not None:
            self.gate.build(input_shape)
        self.down = self._dense(input_shape[-1], "down")
        self.down.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, x):
        if self.gated:
            return self.down(ops.silu(self.gate(x)) * self.up(x))
        return self.down(gelu(self.up(x)))

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "gated": self.gated}
