"""The Llama family: a pre-RMSNorm causal decoder with rotary positions, SwiGLU
and grouped-query attention, whose weights map 1:1 onto Hugging Face
`LlamaForCausalLM` (tied or untied LM head)."""

import keras
import tensorflow as tf
from keras import ops
from keras_hub.layers import ReversibleEmbedding

from zoo.layers.initializers import init
from zoo.models.base import ZooModel, as_spec, make_blocks, token_inputs


@keras.saving.register_keras_serializable(package="zoo")
class DecoderBackbone(ZooModel):
    """Outputs `sequence_output` [B, S, H] after the final norm. The LM head is the
    token embedding's reverse (tied) or its separate reverse kernel (untied)."""

    task = "backbone"

    def __init__(self, spec, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.token_embedding = ReversibleEmbedding(
            spec.vocab_size, spec.hidden_dim, tie_weights=spec.tie_embeddings,
            embeddings_initializer=init(), dtype=dtype, name="token_embedding",
        )
        self.blocks = make_blocks(spec, checkpointing, dtype)
        self.final_norm = keras.layers.RMSNormalization(
            epsilon=spec.layer_norm_epsilon, dtype=dtype, name="final_norm"
        )
        inputs = token_inputs(spec)
        x = self.token_embedding(inputs["token_ids"])
        for block in self.blocks:
            x = block(x, padding_mask=inputs["padding_mask"])
        outputs = {"sequence_output": self.final_norm(x)}
        self._finish(spec, inputs, outputs, dtype, **kwargs)


@keras.saving.register_keras_serializable(package="zoo")
class DecoderCausalLM(ZooModel):
    """Next-token logits (float32) at every position: [B, S, vocab].

    `call_with_cache` runs a few positions against a key/value cache (keras-hub's
    `LlamaCausalLM` has the same method): generation and export use it, so the
    decoder's forward pass is written once, here.
    """

    task = "causal_lm"

    def __init__(self, spec, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.backbone = DecoderBackbone(spec, checkpointing, dtype, name="backbone")
        inputs = dict(self.backbone.input)
        sequence = self.backbone(inputs)["sequence_output"]
        self._finish(spec, inputs, {"logits": self.lm_logits(sequence)}, dtype, **kwargs)

    def lm_logits(self, sequence_output):
        """The LM head: normed hidden states [..., H] -> float32 logits [..., vocab]."""
        return ops.cast(self.backbone.token_embedding(sequence_output, reverse=True), "float32")

    def init_cache(self, batch_size, max_length):
        """An empty key/value cache: one [B, 2, max_length, KV heads, head dim] tensor per block."""
        spec = self.spec
        dtype = self.backbone.token_embedding.compute_dtype
        shape = [batch_size, 2, max_length, spec.num_kv_heads, spec.head_dim]
        return tuple(tf.zeros(shape, dtype) for _ in self.backbone.blocks)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None):
        """Run `token_ids` [B, S] at positions cache_index.. against `cache`.

        Args:
            token_ids: int [B, S], the new positions.
            cache: the tuple `init_cache` made (or the last call returned).
            cache_index: scalar int, the position of `token_ids[:, 0]`.
            padding_mask: optional [B, max_length] (1 = a real token) over the whole
                cache; positions marked 0 are never attended to.

        Returns:
            `(logits, sequence_output, cache)`: float32 logits [B, S, vocab], the
            normed hidden states [B, S, H] and the updated cache.

        Example:
        >>> cache = model.init_cache(1, 16)
        >>> logits, _, cache = model.call_with_cache(prompt_ids, cache, 0)
        """
        backbone = self.backbone
        x = backbone.token_embedding(token_ids)
        updated = []
        for block, block_cache in zip(backbone.blocks, cache):
            x, block_cache = block.decode(x, padding_mask=padding_mask, cache=block_cache, cache_index=cache_index)
            updated.append(block_cache)
        sequence = backbone.final_norm(x)
        return self.lm_logits(sequence), sequence, tuple(updated)
