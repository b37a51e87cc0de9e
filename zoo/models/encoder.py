"""The BERT family: a post-LN encoder whose weights map 1:1 onto Hugging Face
`BertModel`, with masked-LM and sequence-classification heads."""

import keras
from keras import ops
from keras_hub.layers import MaskedLMHead, PositionEmbedding, ReversibleEmbedding

from zoo.layers.initializers import init
from zoo.models.base import ZooModel, as_spec, make_blocks, token_inputs


@keras.saving.register_keras_serializable(package="zoo")
class EncoderBackbone(ZooModel):
    """Outputs `sequence_output` [B, S, H] and, with `pooler=True`, `pooled_output`
    [B, H] (tanh dense on [CLS]); the masked-LM model has no pooler, as in
    Hugging Face `BertForMaskedLM`."""

    task = "backbone"

    def __init__(self, spec, checkpointing="none", dtype=None, pooler=True, **kwargs):
        spec = as_spec(spec)
        h = spec.hidden_dim
        self.token_embedding = ReversibleEmbedding(
            spec.vocab_size, h, embeddings_initializer=init(), dtype=dtype, name="token_embedding"
        )
        self.position_embedding = PositionEmbedding(
            spec.max_sequence_length, initializer=init(), dtype=dtype, name="position_embedding"
        )
        self.segment_embedding = keras.layers.Embedding(
            spec.num_segments, h, embeddings_initializer=init(), dtype=dtype, name="segment_embedding"
        )
        self.embeddings_norm = keras.layers.LayerNormalization(
            epsilon=spec.layer_norm_epsilon, dtype=dtype, name="embeddings_norm"
        )
        self.embeddings_dropout = keras.layers.Dropout(spec.dropout, dtype=dtype, name="embeddings_dropout")
        self.blocks = make_blocks(spec, checkpointing, dtype)
        self.use_pooler = pooler
        self.pooler = (
            keras.layers.Dense(h, activation="tanh", kernel_initializer=init(), dtype=dtype, name="pooler")
            if pooler else None
        )

        inputs = token_inputs(spec)
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x, padding_mask=inputs["padding_mask"])
        self._init_functional(spec, inputs, self.final_outputs(x), dtype, **kwargs)

    def embed(self, inputs, training=None):
        """Token, position and segment ids -> the first block's input."""
        tokens = self.token_embedding(inputs["token_ids"])
        x = tokens + self.position_embedding(tokens) + self.segment_embedding(inputs["segment_ids"])
        return self.embeddings_dropout(self.embeddings_norm(x), training=training)

    def final_outputs(self, x, training=None):
        """The last block's output -> the backbone's outputs."""
        outputs = {"sequence_output": x}
        if self.use_pooler:
            outputs["pooled_output"] = self.pooler(x[:, 0, :])
        return outputs

    def _task_config(self):
        return {"pooler": self.use_pooler}


@keras.saving.register_keras_serializable(package="zoo")
class EncoderMaskedLM(ZooModel):
    """Masked-LM logits (float32) at `mask_positions` [B, P]: [B, P, vocab].

    The head is Hugging Face's `cls.predictions` (dense, GELU, LayerNorm, decoder
    tied to the token embedding, output bias)."""

    task = "masked_lm"

    def __init__(self, spec, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.backbone = EncoderBackbone(spec, checkpointing, dtype, pooler=False, name="backbone")
        # keras-hub's head adds its float32 bias to half-precision logits unconverted
        # (it disables autocast), which fails under a mixed policy: run it in float32.
        policy = keras.dtype_policies.get(dtype)
        self.head = MaskedLMHead(
            token_embedding=self.backbone.token_embedding, intermediate_activation="gelu",
            layer_norm_epsilon=spec.layer_norm_epsilon, kernel_initializer=init(),
            dtype=policy.variable_dtype, name="mlm_head",
        )
        inputs = dict(self.backbone.input)
        inputs["mask_positions"] = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        outputs = self.backbone({k: v for k, v in inputs.items() if k != "mask_positions"})
        self._init_functional(spec, inputs, self.task_head(outputs, inputs), dtype, **kwargs)

    def task_head(self, backbone_outputs, inputs, training=None):
        """The backbone's outputs -> this model's outputs (what `fit`'s loss reads)."""
        logits = self.head(backbone_outputs["sequence_output"], mask_positions=inputs["mask_positions"])
        return {"logits": ops.cast(logits, "float32")}


@keras.saving.register_keras_serializable(package="zoo")
class EncoderClassifier(ZooModel):
    """Sequence classification on the pooled output (Hugging Face
    `BertForSequenceClassification`): float32 `logits` [B, num_classes]."""

    task = "classifier"

    def __init__(self, spec, num_classes=2, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.num_classes = num_classes
        self.backbone = EncoderBackbone(spec, checkpointing, dtype, name="backbone")
        self.classifier_dropout = keras.layers.Dropout(spec.dropout, dtype=dtype, name="classifier_dropout")
        self.classifier = keras.layers.Dense(
            num_classes, kernel_initializer=init(), dtype=dtype, name="classifier"
        )
        inputs = dict(self.backbone.input)
        self._init_functional(spec, inputs, self.task_head(self.backbone(inputs), inputs), dtype, **kwargs)

    def task_head(self, backbone_outputs, inputs, training=None):
        """The backbone's outputs -> this model's outputs (what `fit`'s loss reads)."""
        pooled = self.classifier_dropout(backbone_outputs["pooled_output"], training=training)
        return {"logits": ops.cast(self.classifier(pooled), "float32")}

    def _task_config(self):
        return {"num_classes": self.num_classes}
