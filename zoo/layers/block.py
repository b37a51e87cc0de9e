"""The Transformer block every family shares, and where checkpointing happens.

Norm placements: "post" (BERT: x = norm(x + attn(x)); x = norm(x + ffn(x))), "pre" (Llama,
Qwen, ModernBERT: x = x + attn(norm(x)); x = x + ffn(norm(x))) and "sandwich" (Gemma 3:
x = x + norm(attn(norm(x))); x = x + norm(ffn(norm(x)))). `attention_norm=False` leaves the
first pre-norm out (ModernBERT's block 0, whose input the embedding norm already normed).

The checkpointing policy is a plain attribute read at call time, so
`ZooModel.set_checkpointing` switches a built model. Recomputation only
happens when training: inference graphs never contain the wrapper.
"""

import keras
import tensorflow as tf
from tensorflow.python.eager import record  # is a GradientTape recording (no public API)

from zoo.layers.attention import Attention
from zoo.layers.feedforward import FeedForward
from zoo.layers.norm import make_norm
from zoo.ops.attention_core import attention_keep
from zoo.ops.dropout import Masks, dropout_keep, stateless_dropout
from zoo.ops.ordering import residual
from zoo.ops.position_chunks import in_position_chunks, position_chunk
from zoo.ops.recompute import policy_name, recompute


class TransformerBlock(keras.layers.Layer):
    def __init__(
        self,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_dim,
        placement="post",
        norm=None,
        gated_ffn=False,
        activation=None,
        use_bias=True,
        qkv_bias=None,
        qk_norm=False,
        attention_norm=True,
        rotary_theta=None,
        dropout=0.0,
        checkpointing="none",
        seed=None,
        rope_scaling=None,
        causal=False,
        scale=None,
        window=None,
        **kwargs,
    ):
        """`norm`: the settings of every norm in the block (zoo.layers.norm; default BERT's
        LayerNorm); `qk_norm`: the same norm on each head's queries and keys; the rest as
        Attention and FeedForward take them."""
        super().__init__(**kwargs)
        norm = dict(norm or {"kind": "layer", "epsilon": 1e-12})
        self.config_args = dict(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate_dim=intermediate_dim,
            placement=placement, norm=norm, gated_ffn=gated_ffn, activation=activation, use_bias=use_bias,
            qkv_bias=qkv_bias, qk_norm=qk_norm, attention_norm=attention_norm, rotary_theta=rotary_theta,
            dropout=dropout, rope_scaling=dict(rope_scaling) if rope_scaling else None, causal=causal, scale=scale,
            window=window,
        )
        if placement not in ("post", "pre", "sandwich"):
            raise ValueError(f"Unknown norm placement {placement!r}; known: post, pre, sandwich.")
        self.placement, self.dropout = placement, dropout
        self.checkpointing = policy_name(checkpointing)
        policy = self.dtype_policy
        self.attention = Attention(
            num_heads, num_kv_heads, head_dim, use_bias=use_bias, qkv_bias=qkv_bias,
            qk_norm=norm if qk_norm else None, rotary_theta=rotary_theta, dropout=dropout, rope_scaling=rope_scaling,
            causal=causal, scale=scale, window=window, dtype=policy, name="attention",
        )
        self.ffn = FeedForward(intermediate_dim, gated=gated_ffn, activation=activation, use_bias=use_bias,
                               dtype=policy, name="ffn")
        self.attention_norm = make_norm(norm, policy, "attention_norm") if attention_norm else None
        self.ffn_norm = make_norm(norm, policy, "ffn_norm")
        sandwich = placement == "sandwich"
        self.post_attention_norm = make_norm(norm, policy, "post_attention_norm") if sandwich else None
        self.post_ffn_norm = make_norm(norm, policy, "post_ffn_norm") if sandwich else None
        # One draw per call, outside any recomputation, seeds every dropout in the block.
        self.seed_generator = keras.random.SeedGenerator(seed, name="dropout_seed")
        self.shared_replays = None  # ZooModel.set_shared_blocks: its blocks share them (zoo.layers.shared_replay)

    def share_replays(self, replays):
        """Train under `full` through `replays`, the traced blocks this block's model shares between its layers
        (zoo.layers.shared_replay), rather than tracing this block's own ops into the step. Not with dropout."""
        self.shared_replays = replays

    def build(self, input_shape):
        for layer in (self.attention, self.ffn, self.attention_norm, self.ffn_norm, self.post_attention_norm,
                      self.post_ffn_norm):
            if layer is not None:
                layer.build(input_shape)

    def compute_output_shape(self, x_shape, padding_mask_shape=None):
        """A block keeps its input's shape. Keras reads it here instead of tracing `call` on symbolic
        inputs each time a model is built (`build` makes every variable)."""
        return x_shape

    def call(self, x, padding_mask=None, training=None):
        training = bool(training)
        # The policy applies wherever gradients are taken, dropout or not: a preference step runs its policy
        # under a tape with training=False (TRL's disable_dropout), and without this its blocks kept every
        # activation (dec-1b LoRA DPO at 2 pairs x 1024 under `full`: 11.4 GiB against SFT's 2.1).
        taped = training or record.could_possibly_record()
        if taped and self.checkpointing == "full":
            shared = training and not self.dropout and self.shared_replays is not None and not self._chunks_ffn(x)
            if shared and not tf.executing_eagerly():
                return self.shared_replays(self, x, padding_mask)  # one traced block for the model's like layers
            if training:
                masks = self.draw_masks(x, ahead=True)
                return recompute(lambda h: self.replay(h, padding_mask, masks), x)
            return recompute(lambda h: self._forward(h, mask=padding_mask, keep_scores=True, chunk_ffn=True)[0], x)
        recompute_core = taped and self.checkpointing == "selective"
        keep_scores = training and self.checkpointing == "none"  # "none" keeps everything: the fastest core
        # What the block computes from its variables alone (a dequantized or cast kernel) waits for its input:
        # otherwise TensorFlow's executor makes every block's at the start of a graph (a reference pass)
        with tf.control_dependencies([x]):
            return self._forward(x, mask=padding_mask, masks=self.draw_masks(x) if training else None,
                                 training=training, recompute_core=recompute_core, keep_scores=keep_scores)[0]

    def draw_masks(self, x, ahead=False):
        """The training call's dropout: one draw of the seed every mask in the block comes from and,
        `ahead` (for a block that runs again with them: "full"'s replay, the fused update), its masks
        drawn now and held as bits (zoo.ops.dropout.Masks). The attention's mask is held only where
        the replay runs the plain core (keys in one tile): the chunked core draws per tile, and a long
        sequence's whole mask would be s²/8 bytes a layer."""
        if not self.dropout:
            return Masks(None)
        masks = Masks(self.seed_generator.next())
        if ahead:
            with tf.control_dependencies([x]):  # drawn as the block runs, not every block's at the step's start
                shape = tf.shape(x)
                for site in (1, 2):  # the residual branches' dropout: the shape of x
                    masks.hold(site, dropout_keep(shape, self.dropout, masks.seed, site))
                if self.attention.core_for(keep_scores=True, key_length=x.shape[1]) == "plain":
                    masks.hold(0, attention_keep(masks.seed, shape[0], self.attention.num_heads, shape[1], shape[1],
                                                 self.dropout, self.attention.chunk_size))
        return masks

    def replay(self, x, padding_mask, masks):
        """The block in training with given dropout draws (`draw_masks`): the same function every
        time it is called, which is what recomputation and the fused update (zoo.training.fused)
        rely on. Its backward follows it at once, one block at a time, so it keeps its own scores
        (`keep_scores`: the plain core on one tile); a long sequence's MLP runs in chunks of positions
        (`chunk_ffn`), or its whole intermediates would be alive through the replay's backward."""
        return self._forward(x, mask=padding_mask, masks=masks, training=True, keep_scores=True, chunk_ffn=True)[0]

    def decode(self, x, padding_mask, cache, cache_index):
        """Inference with a key/value cache: returns (output, updated cache). Its kernels' dequantized or cast copies
        wait for its input, as in `call`: otherwise each step of the decode loop makes every block's at once (GRPO's
        sampling on an int4 base: every block's float32 kernels at each step)."""
        with tf.control_dependencies([x]):
            return self._forward(x, mask=padding_mask, cache=cache, cache_index=cache_index)

    def _forward(self, x, mask, masks=None, training=False, recompute_core=False, cache=None, cache_index=0,
                 keep_scores=False, chunk_ffn=False):
        rate = self.dropout if training else 0.0
        masks = masks or Masks(None)

        def attend(h):
            return self.attention(h, padding_mask=mask, seed=masks.seed, keep=masks.held(0, when=h), training=training,
                                  recompute_core=recompute_core, cache=cache, cache_index=cache_index,
                                  keep_scores=keep_scores)

        def drop(h, site):
            return stateless_dropout(h, rate, masks.seed, site=site, keep=masks.held(site, when=h))

        if self.placement != "post":  # x = x + attn(norm(x)); x = x + ffn(norm(x)), sandwich: norm() around both
            h, new_cache = attend(x if self.attention_norm is None else self.attention_norm(x))
            h = h if self.post_attention_norm is None else self.post_attention_norm(h)
            x = residual(x, drop(h, site=1))
            x = residual(x, drop(self._position_wise(self._ffn_branch, x, chunk_ffn), site=2))
        else:  # BERT: x = norm(x + attn(x)); x = norm(x + ffn(x))
            h, new_cache = attend(x)
            x = self.attention_norm(residual(x, drop(h, site=1)))
            x = self.ffn_norm(residual(x, drop(self._position_wise(self.ffn, x, chunk_ffn), site=2)))
        return x, new_cache

    def _ffn_branch(self, x):
        """The pre-norm MLP branch, norms included: every part of it acts on each position alone."""
        h = self.ffn(self.ffn_norm(x))
        return h if self.post_ffn_norm is None else self.post_ffn_norm(h)

    def _chunks_ffn(self, x) -> bool:
        """Whether the replay runs this sequence's MLP in chunks: those read their trainable variables as variables
        (zoo.ops.position_chunks), which a shared block (zoo.layers.shared_replay) passes in as values."""
        return x.shape[1] is not None and position_chunk(x.shape[1], self.ffn.intermediate_dim) < x.shape[1]

    def _position_wise(self, fn, x, chunked):
        """`fn(x)`; `chunked`: in chunks of positions, each recomputed in the backward (zoo.ops.position_chunks),
        where the sequence's float32 intermediates would pass its CHUNK_BYTES."""
        if not chunked or not self._chunks_ffn(x):
            return fn(x)
        return in_position_chunks(fn, x, position_chunk(x.shape[1], self.ffn.intermediate_dim))

    def get_config(self):
        return {**super().get_config(), **self.config_args, "checkpointing": self.checkpointing}
