"""The Transformer block both families share, and where checkpointing happens.

BERT: post-LN (x = LN(x + attn(x)); x = LN(x + ffn(x))), LayerNorm, GELU, biases.
Llama: pre-norm (x = x + attn(RMSNorm(x)); x = x + ffn(RMSNorm(x))), SwiGLU, rotary.

The checkpointing policy is a plain attribute read at call time, so
`ZooModel.set_checkpointing` switches a built model. Recomputation only
happens when training: inference graphs never contain the wrapper.
"""

import keras

from zoo.layers.attention import Attention
from zoo.layers.feedforward import FeedForward
from zoo.ops.dropout import stateless_dropout
from zoo.ops.recompute import policy_name, recompute


class TransformerBlock(keras.layers.Layer):
    def __init__(
        self,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_dim,
        pre_norm=False,
        rms_norm=False,
        gated_ffn=False,
        use_bias=True,
        rotary_theta=None,
        dropout=0.0,
        epsilon=1e-12,
        checkpointing="none",
        seed=None,
        rope_scaling=None,
        causal=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.config_args = dict(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            intermediate_dim=intermediate_dim, pre_norm=pre_norm, rms_norm=rms_norm, gated_ffn=gated_ffn,
            use_bias=use_bias, rotary_theta=rotary_theta, dropout=dropout, epsilon=epsilon,
            rope_scaling=dict(rope_scaling) if rope_scaling else None, causal=causal,
        )
        self.pre_norm, self.dropout = pre_norm, dropout
        self.checkpointing = policy_name(checkpointing)
        policy = self.dtype_policy
        self.attention = Attention(
            num_heads, num_kv_heads, head_dim, use_bias=use_bias, rotary_theta=rotary_theta,
            dropout=dropout, rope_scaling=rope_scaling, causal=causal, dtype=policy, name="attention",
        )
        self.ffn = FeedForward(intermediate_dim, gated=gated_ffn, dtype=policy, name="ffn")
        norm = (
            (lambda name: keras.layers.RMSNormalization(epsilon=epsilon, dtype=policy, name=name))
            if rms_norm
            else (lambda name: keras.layers.LayerNormalization(epsilon=epsilon, dtype=policy, name=name))
        )
        self.attention_norm, self.ffn_norm = norm("attention_norm"), norm("ffn_norm")
        # One draw per call, outside any recomputation, seeds every dropout in the block.
        self.seed_generator = keras.random.SeedGenerator(seed, name="dropout_seed")

    def build(self, input_shape):
        for layer in (self.attention, self.ffn, self.attention_norm, self.ffn_norm):
            layer.build(input_shape)

    def call(self, x, padding_mask=None, training=None):
        training = bool(training)
        seed = self.draw_seed() if training else None
        if training and self.checkpointing == "full":
            return recompute(lambda h: self.replay(h, padding_mask, seed), x)
        recompute_core = training and self.checkpointing == "selective"
        return self._forward(x, mask=padding_mask, seed=seed, training=training, recompute_core=recompute_core)[0]

    def draw_seed(self):
        """The training call's one draw, which seeds every dropout in the block (None without dropout)."""
        return self.seed_generator.next() if self.dropout else None

    def replay(self, x, padding_mask, seed):
        """The block in training with a given dropout seed: the same function every time it
        is called, which is what recomputation and the fused update (zoo.training.fused) rely on."""
        return self._forward(x, mask=padding_mask, seed=seed, training=True)[0]

    def decode(self, x, padding_mask, cache, cache_index):
        """Inference with a key/value cache: returns (output, updated cache)."""
        return self._forward(x, mask=padding_mask, cache=cache, cache_index=cache_index)

    def _forward(self, x, mask, seed=None, training=False, recompute_core=False, cache=None, cache_index=0):
        rate = self.dropout if training else 0.0

        def attend(h):
            return self.attention(h, padding_mask=mask, seed=seed, training=training,
                                  recompute_core=recompute_core, cache=cache, cache_index=cache_index)

        def drop(h, site):
            return stateless_dropout(h, rate, seed, site=site)

        if self.pre_norm:  # Llama: x = x + attn(norm(x)); x = x + ffn(norm(x))
            h, new_cache = attend(self.attention_norm(x))
            x = x + drop(h, site=1)
            x = x + drop(self.ffn(self.ffn_norm(x)), site=2)
        else:  # BERT: x = norm(x + attn(x)); x = norm(x + ffn(x))
            h, new_cache = attend(x)
            x = self.attention_norm(x + drop(h, site=1))
            x = self.ffn_norm(x + drop(self.ffn(x), site=2))
        return x, new_cache

    def get_config(self):
        return {**super().get_config(), **self.config_args, "checkpointing": self.checkpointing}
