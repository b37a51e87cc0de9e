"""The Llama family: a pre-RMSNorm causal decoder with rotary positions, SwiGLU
and grouped-query attention, whose weights map 1:1 onto Hugging Face
`LlamaForCausalLM` (tied or untied LM head)."""

import keras
from keras import ops
from keras_hub.layers import ReversibleEmbedding

from zoo.layers.attention import AttentionMask
from zoo.layers.initializers import init
from zoo.models.base import ZooModel, as_spec, make_blocks, token_inputs


@keras.saving.register_keras_serializable(package="zoo")
class DecoderBackbone(ZooModel):
    """Outputs `sequence_output` [B, S, H] after the final norm. The LM head is the
    token embedding's reverse (tied) or its separate reverse kernel (untied)."""

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
        mask = AttentionMask(causal=True, name="attention_mask")(inputs["padding_mask"])
        for block in self.blocks:
            x = block(x, attention_mask=mask)
        outputs = {"sequence_output": self.final_norm(x)}
        self._finish(spec, inputs, outputs, dtype, **kwargs)


@keras.saving.register_keras_serializable(package="zoo")
class DecoderCausalLM(ZooModel):
    """Next-token logits (float32) at every position: [B, S, vocab]."""

    def __init__(self, spec, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.backbone = DecoderBackbone(spec, checkpointing, dtype, name="backbone")
        inputs = dict(self.backbone.input)
        sequence = self.backbone(inputs)["sequence_output"]
        logits = ops.cast(self.backbone.token_embedding(sequence, reverse=True), "float32")
        self._finish(spec, inputs, {"logits": logits}, dtype, **kwargs)
