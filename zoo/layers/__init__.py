"""Keras layers of both families; they import only layers and zoo.ops."""

from zoo.layers.attention import Attention
from zoo.layers.block import TransformerBlock
from zoo.layers.feedforward import FeedForward

__all__ = ["Attention", "FeedForward", "TransformerBlock"]
