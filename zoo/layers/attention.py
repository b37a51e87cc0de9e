"""Multi-head attention with grouped-query heads, optional rotary positions, per-head
Q/K norms, a sliding window and a choice of attention core (`zoo.ops.attention_core`).

Projections are separate `Dense` layers (q, k, v, o) so that Hugging Face
`BertSelfAttention` and `LlamaAttention` weights map one tensor to one kernel
(ModernBERT's fused Wqkv is split on load: zoo.hub.weights).
The core and its chunk size are runtime choices (`ZooModel.set_attention`),
like the checkpointing policy: they change memory and speed, never the weights.
The default core, "auto", follows the policy (`zoo.ops.attention_core.resolve_core`).
`packed` (`ZooModel.set_packed`), also a runtime choice: the padding mask holds document numbers
(0 = padding), a query sees only its own document and rotary positions restart at each document.
"""

import keras
from keras import ops

from zoo.layers.initializers import init
from zoo.layers.norm import make_norm
from zoo.ops.attention_core import attention, check_chunk_size, check_core, document_spans, resolve_core
from zoo.ops.recompute import recompute


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
        causal=False,
        qkv_bias=None,
        qk_norm=None,
        scale=None,
        window=None,
        **kwargs,
    ):
        """`use_bias`: the output projection's bias (and Q/K/V's unless `qkv_bias` says otherwise);
        `qk_norm`: norm settings (zoo.layers.norm) of a per-head norm on Q and K before the rotary
        positions, or None; `scale`: the scores' factor (None: 1/sqrt(head_dim)); `window`: keys
        with |i - j| < window are seen (None: all)."""
        super().__init__(**kwargs)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.causal, self.scale, self.window = causal, scale, window
        self.core, self.chunk_size = "auto", None  # set_attention() changes them; not part of the config
        self.packed = False  # set_packed() changes it; not part of the config
        self.use_bias, self.rotary_theta, self.dropout = use_bias, rotary_theta, dropout
        self.qkv_bias = use_bias if qkv_bias is None else qkv_bias
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None  # Llama 3's, or linear (Gemma 3)
        self.qk_norm = dict(qk_norm) if qk_norm else None
        self.query_dense = self._dense(num_heads * head_dim, "query", self.qkv_bias)
        self.key_dense = self._dense(num_kv_heads * head_dim, "key", self.qkv_bias)
        self.value_dense = self._dense(num_kv_heads * head_dim, "value", self.qkv_bias)
        self.query_norm = make_norm(self.qk_norm, self.dtype_policy, "query_norm") if qk_norm else None
        self.key_norm = make_norm(self.qk_norm, self.dtype_policy, "key_norm") if qk_norm else None
        self.output_dense = None  # built in build(): needs the model width
        self.rotary = None
        if rotary_theta is not None and self.rope_scaling and self.rope_scaling["rope_type"] == "linear":
            from keras_hub.layers import RotaryEmbedding  # transformers' `linear` rope_type: positions / factor

            self.rotary = RotaryEmbedding(max_wavelength=rotary_theta, scaling_factor=self.rope_scaling["factor"],
                                          dtype=self.dtype_policy, name="rotary")
        elif rotary_theta is not None and self.rope_scaling:
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

    def _dense(self, units, name, use_bias):
        return keras.layers.Dense(
            units, use_bias=use_bias, name=name, dtype=self.dtype_policy, kernel_initializer=init()
        )

    def build(self, input_shape):
        hidden = input_shape[-1]
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(input_shape)
        if self.qk_norm:
            self.query_norm.build((None, None, self.num_heads, self.head_dim))
            self.key_norm.build((None, None, self.num_kv_heads, self.head_dim))
        self.output_dense = self._dense(hidden, "output", self.use_bias)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.num_heads * self.head_dim,))

    def _heads(self, x, n):
        batch, length = ops.shape(x)[:2]  # read once: each read of a traced batch size adds ops to the graph
        return ops.reshape(x, (batch, length, n, self.head_dim))

    def call(self, x, padding_mask=None, seed=None, training=False, recompute_core=False, cache=None,
             cache_index=0, keep_scores=False, keep=None):
        """`padding_mask` [B, T] marks the keys that may be attended (1 = a real token).
        `cache` [B, 2, T, KV, D] holds earlier keys/values for incremental decoding;
        `cache_index` is where `x`'s positions start; `keep_scores`: see `resolve_core`;
        `keep`: the dropout mask of the probabilities drawn ahead (plain core only; `seed` draws it
        otherwise). With `packed` on (and no cache: decoding is never packed) `padding_mask` holds
        document numbers. Returns (output, cache)."""
        query = self._heads(self.query_dense(x), self.num_heads)
        key = self._heads(self.key_dense(x), self.num_kv_heads)
        value = self._heads(self.value_dense(x), self.num_kv_heads)
        if self.qk_norm:
            query, key = self.query_norm(query), self.key_norm(key)
        documents = padding_mask if self.packed and cache is None else None
        if self.rotary is not None and documents is not None:  # each document's positions start at 0
            first = document_spans(documents)[1]
            positions = ops.arange(ops.shape(first)[1], dtype="int32")[None] - first
            query, key = self.rotary(query, positions=positions), self.rotary(key, positions=positions)
        elif self.rotary is not None:
            query = self.rotary(query, start_index=cache_index)
            key = self.rotary(key, start_index=cache_index)
        if cache is not None:
            start = [0, cache_index, 0, 0]
            key = ops.slice_update(cache[:, 0], start, ops.cast(key, cache.dtype))
            value = ops.slice_update(cache[:, 1], start, ops.cast(value, cache.dtype))
            cache = ops.stack([key, value], axis=1)
        core_name = self.core_for(keep_scores, key.shape[1])
        options = dict(
            core=core_name, key_mask=padding_mask, causal=self.causal, query_offset=cache_index,
            rate=self.dropout if training else 0.0, seed=seed, chunk_size=self.chunk_size, window=self.window,
            scale=self.scale,
        )
        if documents is not None:  # the document numbers' zeros are the padding
            options.update(key_mask=None, documents=documents)
        if keep is not None:
            if core_name != "plain":
                raise ValueError(f"A dropout mask drawn ahead needs the plain core; this call runs {core_name!r}.")
            options["keep"] = keep

        def core(q, k, v):
            return attention(q, k, v, **options)

        # The chunked core's own backward already keeps no probabilities: recomputing it would only add work.
        recompute_core = recompute_core and core_name == "plain"
        out = recompute(core, query, key, value) if recompute_core else core(query, key, value)
        out = ops.reshape(out, (ops.shape(out)[0], ops.shape(out)[1], self.num_heads * self.head_dim))
        return self.output_dense(out), cache

    def core_for(self, keep_scores, key_length) -> str:
        """The core a call runs (zoo.ops.attention_core.resolve_core)."""
        return resolve_core(self.core, keep_scores, key_length, self.chunk_size)

    def set_core(self, core="auto", chunk_size=None):
        check_core(core)
        check_chunk_size(chunk_size)
        self.core, self.chunk_size = core, chunk_size

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            use_bias=self.use_bias, rotary_theta=self.rotary_theta, dropout=self.dropout,
            rope_scaling=self.rope_scaling, causal=self.causal, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
            scale=self.scale, window=self.window,
        )
        return config
