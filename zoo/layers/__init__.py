from zoo.layers.attention import Attention
from zoo.layers.attention_core import chunked_attention, plain_attention
from zoo.layers.block import TransformerBlock
from zoo.layers.feedforward import FeedForward

__all__ = ["Attention", "FeedForward", "TransformerBlock", "chunked_attention", "plain_attention"]
