"""Multi-head attention with grouped-query heads, optional rotary positions and
an attention core that can be recomputed on its own (selective checkpointing).

Projections are separate `Dense` layers (q, k, v, o) so that Hugging Face
`BertSelfAttention` and `LlamaAttention` weights map one tensor to one kernel.
"""

import keras
import tensorflow as tf
from keras import ops

from zoo.layers.dropout import stateless_dropout
from zoo.layers.initializers import init
from zoo.recompute import recompute

_MASKED = -1e9  # added to masked scores in float32; exp() underflows to exactly 0


def attention_core(query, key, value, mask, rate, seed):
    """softmax(QKᵀ/√d + mask) -> dropout -> ·V, with the softmax in float32.

    query [B, S, H, D]; key/value [B, T, KV, D] with H % KV == 0; mask broadcastable
    to [B, 1, S, T] (True = attend) or None. This is the 5·a·s² part of a layer's
    activation memory that selective checkpointing recomputes.
    """
    num_heads, kv_heads = query.shape[2], key.shape[2]
    if kv_heads != num_heads:  # grouped-query attention: share each KV head
        key = ops.repeat(key, num_heads // kv_heads, axis=2)
        value = ops.repeat(value, num_heads // kv_heads, axis=2)
    scale = 1.0 / float(query.shape[-1]) ** 0.5
    scores = tf.einsum("bshd,bthd->bhst", query * ops.cast(scale, query.dtype), key)
    scores = ops.cast(scores, "float32")
    if mask is not None:
        scores = ops.where(mask, scores, _MASKED)
    probs = ops.cast(ops.softmax(scores, axis=-1), value.dtype)
    probs = stateless_dropout(probs, rate, seed)
    return tf.einsum("bhst,bthd->bshd", probs, value)


class Attention(keras.layers.Layer):
    def __init__(
        self,
        num_heads,
        num_kv_heads,
        head_dim,
        use_bias=True,
        rotary_theta=None,
        dropout=0.0,
        rope_scaling=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.use_bias, self.rotary_theta, self.dropout = use_bias, rotary_theta, dropout
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None  # Llama 3 frequency scaling
        self.query_dense = self._dense(num_heads * head_dim, "query")
        self.key_dense = self._dense(num_kv_heads * head_dim, "key")
        self.value_dense = self._dense(num_kv_heads * head_dim, "value")
        self.output_dense = None  # built in build(): needs the model width
        self.rotary = None
        if rotary_theta is not None and self.rope_scaling:
            # keras-hub's Llama 3 rotary layer (not exported in 0.32): transformers' `llama3` rope_type.
            from keras_hub.src.models.llama.llama_rotary_embedding import LlamaRotaryEmbedding

            scaling = self.rope_scaling
            self.rotary = LlamaRotaryEmbedding(
                max_wavelength=rotary_theta, frequency_adjustment_factor=scaling["factor"],
                low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"],
                pretraining_sequence_length=scaling["original_max_position_embeddings"],
                dtype=self.dtype_policy, name="rotary",
            )
        elif rotary_theta is not None:
            from keras_hub.layers import RotaryEmbedding

            self.rotary = RotaryEmbedding(max_wavelength=rotary_theta, dtype=self.dtype_policy, name="rotary")

    def _dense(self, units, name):
        return keras.layers.Dense(
            units, use_bias=self.use_bias, name=name, dtype=self.dtype_policy, kernel_initializer=init()
        )

    def build(self, input_shape):
        hidden = input_shape[-1]
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(input_shape)
        self.output_dense = self._dense(hidden, "output")
        self.output_dense.build(tuple(input_shape[:-1]) + (self.num_heads * self.head_dim,))

    def _heads(self, x, n):
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], n, self.head_dim))

    def call(self, x, attention_mask=None, seed=None, training=False, recompute_core=False, cache=None, cache_index=0):
        """`cache` [B, 2, T, KV, D] holds earlier keys/values for incremental decoding;
        `cache_index` is where `x`'s positions start. Returns (output, cache)."""
        query = self._heads(self.query_dense(x), self.num_heads)
        key = self._heads(self.key_dense(x), self.num_kv_heads)
        value = self._heads(self.value_dense(x), self.num_kv_heads)
        if self.rotary is not None:
            query = self.rotary(query, start_index=cache_index)
            key = self.rotary(key, start_index=cache_index)
        if cache is not None:
            start = [0, cache_index, 0, 0]
            key = ops.slice_update(cache[:, 0], start, ops.cast(key, cache.dtype))
            value = ops.slice_update(cache[:, 1], start, ops.cast(value, cache.dtype))
            cache = ops.stack([key, value], axis=1)
        rate = self.dropout if training else 0.0

        def core(q, k, v):
            return attention_core(q, k, v, attention_mask, rate, seed)

        out = recompute(core, query, key, value) if recompute_core else core(query, key, value)
        out = ops.reshape(out, (ops.shape(out)[0], ops.shape(out)[1], self.num_heads * self.head_dim))
        return self.output_dense(out), cache

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            use_bias=self.use_bias, rotary_theta=self.rotary_theta, dropout=self.dropout,
            rope_scaling=self.rope_scaling,
        )
        return config


class AttentionMask(keras.layers.Layer):
    """padding_mask [B, T] (1 = real token) -> boolean mask [B, 1, S, T] (True = attend),
    lower-triangular when causal. Built once per model and shared by every block."""

    def __init__(self, causal=False, **kwargs):
        super().__init__(**kwargs)
        self.causal = causal

    def call(self, padding_mask):
        mask = ops.cast(padding_mask, "bool")[:, None, None, :]
        if self.causal:
            length = ops.shape(padding_mask)[1]
            positions = ops.arange(length)
            mask = ops.logical_and(mask, (positions[:, None] >= positions[None, :])[None, None])
        return mask

    def get_config(self):
        return {**super().get_config(), "causal": self.causal}
