from zoo.layers.attention import Attention, AttentionMask, attention_core
from zoo.layers.block import TransformerBlock
from zoo.layers.feedforward import FeedForward

__all__ = ["Attention", "AttentionMask", "FeedForward", "TransformerBlock", "attention_core"]
