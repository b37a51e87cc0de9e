"""The decoders (Llama, Qwen2, Qwen3, Gemma 3): a pre- or sandwich-norm causal decoder with
rotary positions, a gated FFN and grouped-query attention, whose weights map 1:1 onto
Hugging Face `LlamaForCausalLM` and its relatives (tied or untied LM head)."""

import warnings

import keras
import tensorflow as tf
from keras import ops

from zoo.layers.embedding import ScaledEmbedding
from zoo.layers.initializers import init
from zoo.layers.norm import make_norm
from zoo.models.base import ZooModel, as_spec, make_blocks, norm_settings, token_inputs
from zoo.ops.lm_loss import check_chunk, chunked_lm_loss


@keras.saving.register_keras_serializable(package="zoo")
class DecoderBackbone(ZooModel):
    """Outputs `sequence_output` [B, S, H] after the final norm. The LM head is the
    token embedding's reverse (tied) or its separate reverse kernel (untied)."""

    task = "backbone"

    def __init__(self, spec, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.token_embedding = ScaledEmbedding(
            spec.vocab_size, spec.hidden_dim, tie_weights=spec.tie_embeddings, embeddings_initializer=init(),
            scale=spec.hidden_dim ** 0.5 if spec.scale_embeddings else None, dtype=dtype, name="token_embedding",
        )
        self.blocks = make_blocks(spec, checkpointing, dtype)
        self.final_norm = make_norm(norm_settings(spec), dtype, "final_norm")
        inputs = token_inputs(spec)
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x, padding_mask=inputs["padding_mask"])
        self._init_functional(spec, inputs, self.final_outputs(x), dtype, **kwargs)

    def embed(self, inputs, training=None):
        """Token ids -> the first block's input."""
        return self.token_embedding(inputs["token_ids"])

    def final_outputs(self, x, training=None):
        """The last block's output -> the backbone's outputs."""
        return {"sequence_output": self.final_norm(x)}


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
        self._init_functional(spec, inputs, self.task_head(self.backbone(inputs), inputs), dtype, **kwargs)

    def task_head(self, backbone_outputs, inputs, training=None):
        """The backbone's outputs -> this model's outputs (what `fit`'s loss reads)."""
        return {"logits": self.lm_logits(backbone_outputs["sequence_output"])}

    loss_chunk = None  # positions per chunk of the training loss: None = zoo.ops.lm_loss's choice, 0 = unchunked
    loss_trained_only = True  # with sample weights, the head runs only where the weight is not 0 (chat SFT)

    def set_loss_chunk(self, chunk_size=None, trained_only=True):
        """How `fit` computes the causal-LM loss: over chunks of `chunk_size` positions (None:
        zoo.ops.lm_loss picks it; the default), so that the float32 [B, S, vocab] logits never
        exist whole, or unchunked (0). `trained_only`: with sample weights (a chat's assistant
        mask) the chunked loss runs the head only on the positions of non-zero weight (False: on
        every position). Same loss, gradients and metrics either way."""
        if chunk_size not in (None, 0):
            check_chunk(chunk_size)
        if not isinstance(trained_only, bool):
            raise ValueError(f"trained_only must be True or False, got {trained_only!r}.")
        self.loss_chunk, self.loss_trained_only = chunk_size, trained_only
        self._drop_compiled_functions()
        return chunk_size

    def loss_from_backbone(self) -> bool:
        """The chunked loss trains unless `set_loss_chunk(0)` asked for whole logits, or the model
        is compiled with a loss it does not compute (only SparseCategoricalCrossentropy from logits,
        with Keras' default reduction): then Keras' step runs, with a warning, and an explicit
        chunk size is refused. Compiled metrics are updated chunk by chunk."""
        if self.loss_chunk == 0 or self.loss is None:
            return False
        loss = self.loss.get("logits") if isinstance(self.loss, dict) and len(self.loss) == 1 else self.loss
        if (isinstance(loss, keras.losses.SparseCategoricalCrossentropy) and loss.from_logits
                and loss.ignore_class is None and loss.reduction == "sum_over_batch_size"):
            return True
        if self.loss_chunk is not None:
            raise ValueError(f"set_loss_chunk({self.loss_chunk}) needs the model compiled with "
                             "SparseCategoricalCrossentropy(from_logits=True) on 'logits' (no ignore_class, the "
                             f"default reduction); it is compiled with {loss!r}. Compile with that loss, or call "
                             "set_loss_chunk(0) to train on whole logits.")
        warnings.warn(f"{type(self).__name__}: the compiled loss {loss!r} is not one the chunked loss computes, so "
                      "training makes the whole float32 [batch, sequence, vocab] logits. Compile with "
                      "SparseCategoricalCrossentropy(from_logits=True) to keep one chunk of them.", stacklevel=2)
        return False

    def training_loss(self, backbone_outputs, x, y, sample_weight, training=True):
        if not self.loss_from_backbone():
            return super().training_loss(backbone_outputs, x, y, sample_weight, training)
        y = y["logits"] if isinstance(y, dict) else y
        loss = chunked_lm_loss(backbone_outputs["sequence_output"], self.lm_logits, y, self.loss_chunk,
                               sample_weight, on_chunk=self._update_metrics, gradients=training,
                               trained_only=self.loss_trained_only)
        return loss, None

    def _update_metrics(self, labels, logits, weights):
        """The compiled metrics on one chunk of positions: Keras metrics accumulate, so after the last
        chunk they hold the whole batch's figure. Returns their values, read after the update."""
        metrics = self._compile_metrics
        if metrics is None:
            return ()
        metrics.update_state(labels, {"logits": logits}, weights)
        return [v.value for v in metrics.variables]

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
