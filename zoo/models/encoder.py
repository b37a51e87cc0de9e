"""The encoders, BERT (post-LN, learned positions and token types) and ModernBERT (pre-LN,
rotary positions, local and global layers), whose weights map 1:1 onto Hugging Face
`BertModel` / `ModernBertModel`, with masked-LM and sequence-classification heads."""

import keras
from keras import ops
from keras_hub.layers import MaskedLMHead, PositionEmbedding, ReversibleEmbedding

from zoo.layers.dropout import Dropout
from zoo.layers.head import MaskedLMHead as ZooMaskedLMHead
from zoo.layers.initializers import init
from zoo.layers.norm import make_norm
from zoo.models.base import ZooModel, as_spec, has_segments, make_blocks, norm_settings, token_inputs
from zoo.ops.activations import activation


@keras.saving.register_keras_serializable(package="zoo")
class EncoderBackbone(ZooModel):
    """Outputs `sequence_output` [B, S, H] and, with BERT's pooler (`pooler=True`),
    `pooled_output` [B, H] (tanh dense on [CLS]); the masked-LM model has no pooler, as in
    Hugging Face `BertForMaskedLM`. ModernBERT has none (its classifier pools)."""

    task = "backbone"

    def __init__(self, spec, checkpointing="none", dtype=None, pooler=True, **kwargs):
        spec = as_spec(spec)
        h = spec.hidden_dim
        self.token_embedding = ReversibleEmbedding(
            spec.vocab_size, h, embeddings_initializer=init(), dtype=dtype, name="token_embedding"
        )
        self.position_embedding = self.segment_embedding = None
        if has_segments(spec):  # BERT's learned positions and token types
            self.position_embedding = PositionEmbedding(
                spec.max_sequence_length, initializer=init(), dtype=dtype, name="position_embedding"
            )
            self.segment_embedding = keras.layers.Embedding(
                spec.num_segments, h, embeddings_initializer=init(), dtype=dtype, name="segment_embedding"
            )
        norm = norm_settings(spec)
        self.embeddings_norm = make_norm(norm, dtype, "embeddings_norm") if spec.embedding_norm else None
        self.embeddings_dropout = Dropout(spec.dropout, dtype=dtype, name="embeddings_dropout")
        self.blocks = make_blocks(spec, checkpointing, dtype)
        self.final_norm = make_norm(norm, dtype, "final_norm") if spec.norm_placement != "post" else None
        self.use_pooler = pooler and spec.classifier_pooling == "pooler"
        self.pooler = (
            keras.layers.Dense(h, activation="tanh", kernel_initializer=init(), dtype=dtype, name="pooler")
            if self.use_pooler else None
        )

        inputs = token_inputs(spec)
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x, padding_mask=inputs["padding_mask"])
        self._init_functional(spec, inputs, self.final_outputs(x), dtype, **kwargs)

    def embed(self, inputs, training=None):
        """Token (and BERT's position and segment) ids -> the first block's input."""
        x = self.token_embedding(inputs["token_ids"])
        if self.segment_embedding is not None:
            x = x + self.position_embedding(x) + self.segment_embedding(inputs["segment_ids"])
        if self.embeddings_norm is not None:
            x = self.embeddings_norm(x)
        return self.embeddings_dropout(x, training=training)

    def final_outputs(self, x, training=None):
        """The last block's output -> the backbone's outputs."""
        outputs = {"sequence_output": x if self.final_norm is None else self.final_norm(x)}
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
        head = dict(token_embedding=self.backbone.token_embedding, kernel_initializer=init(),
                    dtype=policy.variable_dtype, name="mlm_head")
        if spec.classifier_pooling == "pooler":  # BERT: keras-hub's own layout (dense and LayerNorm with biases)
            self.head = MaskedLMHead(intermediate_activation="gelu", layer_norm_epsilon=spec.layer_norm_epsilon,
                                     **head)
        else:
            self.head = ZooMaskedLMHead(norm_settings(spec), use_bias=spec.dense_bias,
                                        intermediate_activation=activation(spec.activation), **head)
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
    """Sequence classification (Hugging Face `BertForSequenceClassification`,
    `ModernBertForSequenceClassification`): float32 `logits` [B, num_classes] from BERT's
    pooled output, or from ModernBERT's pooling ([CLS] or the mean over real tokens)
    through its head (dense, activation, norm)."""

    task = "classifier"

    def __init__(self, spec, num_classes=2, checkpointing="none", dtype=None, **kwargs):
        spec = as_spec(spec)
        self.num_classes = num_classes
        self.backbone = EncoderBackbone(spec, checkpointing, dtype, name="backbone")
        self.head_dense = self.head_norm = None
        self.pooling = spec.classifier_pooling
        if self.pooling != "pooler":
            self.head_dense = keras.layers.Dense(
                spec.hidden_dim, activation=activation(spec.activation), use_bias=spec.dense_bias,
                kernel_initializer=init(), dtype=dtype, name="head_dense")
            self.head_norm = make_norm(norm_settings(spec), dtype, "head_norm")
        self.classifier_dropout = Dropout(spec.dropout, dtype=dtype, name="classifier_dropout")
        self.classifier = keras.layers.Dense(
            num_classes, kernel_initializer=init(), dtype=dtype, name="classifier"
        )
        inputs = dict(self.backbone.input)
        self._init_functional(spec, inputs, self.task_head(self.backbone(inputs), inputs), dtype, **kwargs)

    def task_head(self, backbone_outputs, inputs, training=None):
        """The backbone's outputs -> this model's outputs (what `fit`'s loss reads)."""
        if self.head_dense is None:
            pooled = backbone_outputs["pooled_output"]
        else:
            pooled = self.head_norm(self.head_dense(self.pool(backbone_outputs["sequence_output"], inputs)))
        pooled = self.classifier_dropout(pooled, training=training)
        return {"logits": ops.cast(self.classifier(pooled), "float32")}

    def pool(self, sequence, inputs):
        """[B, S, H] -> [B, H]: position 0 ("cls") or the mean over the real tokens ("mean")."""
        if self.pooling == "cls":
            return sequence[:, 0, :]
        mask = ops.cast(inputs["padding_mask"], sequence.dtype)[..., None]
        return ops.sum(sequence * mask, axis=1) / ops.sum(mask, axis=1)

    def _task_config(self):
        return {"num_classes": self.num_classes}
