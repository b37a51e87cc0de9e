"""The masked-LM head when its layout is not BERT's: keras-hub's `MaskedLMHead` (gather at the
masked positions, dense + activation, norm, tied decoder, output bias) with the dense's bias and
the norm as the model's spec says (ModernBERT: no bias, LayerNorm without beta). Only `build`
differs; keras-hub's `call` and sublayer names are kept, so one weight map reads both."""

import keras
from keras_hub.layers import MaskedLMHead as KerasHubMaskedLMHead

from zoo.layers.norm import make_norm


class MaskedLMHead(KerasHubMaskedLMHead):
    def __init__(self, norm, use_bias=True, **kwargs):
        """`norm`: the transform's norm settings (zoo.layers.norm); `use_bias`: the dense's bias.
        The decoder is always `token_embedding` (tied)."""
        super().__init__(**kwargs)
        self.norm, self.use_bias = dict(norm), use_bias

    def build(self, inputs_shape, mask_positions_shape=None):
        feature_size = self.token_embedding.output_dim
        self._intermediate_dense = keras.layers.Dense(
            feature_size, activation=self.intermediate_activation, use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="intermediate_dense")
        self._intermediate_layer_norm = make_norm(self.norm, self.dtype_policy, "intermediate_layer_norm")
        self._intermediate_dense.build((inputs_shape[0], None, inputs_shape[-1]))
        self._intermediate_layer_norm.build((inputs_shape[0], None, feature_size))
        self._bias = self.add_weight(name="output_bias", shape=[self.vocabulary_size],
                                     initializer=self.bias_initializer, dtype=self.dtype)
        self.built = True

    def get_config(self):
        return {**super().get_config(), "norm": self.norm, "use_bias": self.use_bias}
