"""Weight initialisation shared by both families (BERT and Llama use N(0, 0.02))."""

import keras


def init():
    """A new truncated-normal initializer for each weight: an unseeded Keras
    initializer fixes its seed when constructed, so one shared instance would give
    every same-shaped weight the same values."""
    return keras.initializers.TruncatedNormal(stddev=0.02)
