"""The decoders' token embedding: keras-hub's ReversibleEmbedding (the tied LM head is its reverse),
its lookups optionally x `scale` (Gemma: sqrt(hidden), cast to the compute dtype as transformers
casts it to the weights'). The reverse uses the matrix unscaled, as transformers' tied head does.

The scale is applied inside the layer: on a Keras 3.15 symbolic tensor, `x * scalar` comes out
marked sparse (ops.Multiply's output spec takes a missing `.sparse` for True) and the next layer
then fails on a SparseTensor placeholder."""

from keras import ops
from keras_hub.layers import ReversibleEmbedding

from zoo.ops import quantized_head


class ScaledEmbedding(ReversibleEmbedding):
    def __init__(self, *args, scale=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale

    def call(self, inputs, reverse=False):
        return self._scaled(super().call(inputs, reverse=reverse), reverse)

    def quantized_call(self, inputs, reverse=False):
        """A quantized layer (zoo.quantization.quantize_base) is called here, not through `call`: scale it too.
        An int8 head runs a slice of the vocabulary at a time (zoo.ops.quantized_head), never the whole table cast."""
        if reverse and quantized_head.sliceable(self):
            return quantized_head.int8_logits(inputs, self)
        return self._scaled(super().quantized_call(inputs, reverse=reverse), reverse)

    def _scaled(self, x, reverse):
        if reverse or self.scale is None:
            return x
        return x * ops.cast(self.scale, x.dtype)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}
