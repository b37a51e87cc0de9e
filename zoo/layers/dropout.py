"""Dropout outside the blocks (an encoder's embeddings, a classifier's pooled vector).

Keras' `Dropout` draws from a seed generator every replica advances alike, so under
tf.distribute every replica drops the same positions of its own rows, and N replicas
do not train what one device trains. This one draws the mask through
`zoo.ops.dropout.stateless_dropout`: each replica's rows of the mask one device would draw.
"""

import keras

from zoo.ops.dropout import stateless_dropout


class Dropout(keras.layers.Layer):
    """Inverted dropout at `rate` in training; the identity otherwise."""

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        # As Keras' Dropout: a generator only where it draws, so the model's other initial weights
        # (drawn from the same global seed) do not depend on which dropout class built it.
        self.seed_generator = keras.random.SeedGenerator(seed, name="seed_generator") if self.rate else None

    def call(self, x, training=False):
        if not training or not self.rate:
            return x
        return stateless_dropout(x, self.rate, self.seed_generator.next())

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate}
