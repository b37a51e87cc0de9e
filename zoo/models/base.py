"""What every zoo model shares: built from a ModelSpec, configured by it, and
checked at its inputs.

Models are functional Keras models built inside `__init__` (the keras-hub
pattern), so `summary()`, `save()` and export see a plain layer graph; the
config is the spec itself, so a saved model rebuilds the same shape.
"""

import keras
import numpy as np

from zoo import checks
from zoo.layers.block import TransformerBlock
from zoo.layers.shared_replay import SharedReplays
from zoo.ops.recompute import policy_name
from zoo.ops.scratch_graphs import release_scratch_graphs
from zoo.registry import ModelSpec
from zoo.training import fused, step


def as_spec(spec) -> ModelSpec:
    return spec if isinstance(spec, ModelSpec) else ModelSpec(**spec)


def norm_settings(spec: ModelSpec) -> dict:
    """The settings of every norm of a spec's model (zoo.layers.norm)."""
    return {"kind": spec.norm, "epsilon": spec.layer_norm_epsilon, "bias": spec.norm_bias,
            "offset": spec.norm_offset}


def make_blocks(spec: ModelSpec, checkpointing, dtype):
    rope = spec.positions == "rope"
    return [
        TransformerBlock(
            num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
            intermediate_dim=spec.intermediate_dim, placement=spec.norm_placement, norm=norm_settings(spec),
            gated_ffn=spec.gated_ffn, activation=spec.activation, use_bias=spec.dense_bias, qkv_bias=spec.qkv_bias,
            qk_norm=spec.qk_norm, attention_norm=spec.first_attention_norm or i > 0,
            rotary_theta=spec.layer_rope_theta(i) if rope else None, dropout=spec.dropout,
            rope_scaling=spec.rope_scaling if rope and spec.layer_kind(i) == "global" else None,
            causal=spec.is_decoder, scale=spec.attention_scale, window=spec.layer_window(i),
            checkpointing=checkpointing, dtype=dtype, name=f"block_{i}",
        )
        for i in range(spec.num_layers)
    ]


def token_inputs(spec: ModelSpec) -> dict:
    """keras-hub's input convention: token_ids, padding_mask (+ segment_ids with BERT's token types)."""
    names = ["token_ids", "padding_mask"] + (["segment_ids"] if has_segments(spec) else [])
    return {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in names}


def has_segments(spec: ModelSpec) -> bool:
    """Token types (segment ids) come with BERT's learned positions."""
    return not spec.is_decoder and spec.positions == "learned"


def blocks_of(model) -> list:
    """Every `TransformerBlock` of a model, in order (a task model's backbone included)."""
    return [layer for layer in model._flatten_layers() if isinstance(layer, TransformerBlock)]


class ZooModel(keras.Model):
    """Base of backbones and task models: spec-driven config and input checks.

    Each concrete class declares its `task` ("backbone", "masked_lm", "classifier",
    "causal_lm"), which is what export, the Hub format and generation read.
    """

    task = None

    def _init_functional(self, spec, inputs, outputs, dtype, **kwargs):
        """keras.Model.__init__ of the functional graph the subclass built, and the spec as its config."""
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        release_scratch_graphs()  # else the model's variables are never freed (zoo/ops/scratch_graphs.py)
        # Functional models drop `dtype`; compile() reads it to add loss scaling for float16.
        self.dtype_policy = keras.dtype_policies.get(dtype)
        self.spec = spec
        self._zoo_dtype = dtype

    @property
    def checkpointing(self) -> str:
        """The recomputation policy of every block ("mixed" if they differ)."""
        policies = {block.checkpointing for block in blocks_of(self)}
        return policies.pop() if len(policies) == 1 else "mixed"

    def set_checkpointing(self, policy) -> str:
        """Switch the recomputation policy of a built model, without rebuilding it.

        Compiled train/predict functions are dropped so that the next call retraces
        with the new policy; weights and optimizer state are untouched.

        Args:
            policy: "none", "full" or "selective" (`True` = "full").

        Returns:
            The resolved policy name.

        Example:
        >>> model = zoo.get("enc-base", num_layers=2, hidden_dim=64, num_heads=4)
        >>> model.set_checkpointing("selective")
        'selective'
        """
        policy = policy_name(policy)
        if self.fused_update:
            checks.fused(policy)
        for block in blocks_of(self):
            block.checkpointing = policy
        self._drop_compiled_functions()
        return policy

    @property
    def attention(self) -> tuple:
        """(core, chunk_size) of every block's attention."""
        return {(block.attention.core, block.attention.chunk_size) for block in blocks_of(self)}.pop()

    def set_attention(self, core="auto", chunk_size=None) -> tuple:
        """Choose the attention core of a built model: "auto" (default: "plain" when training
        under checkpointing "none" with at most one chunk of positions, 512 by default,
        which keeps every activation and is the fastest; "chunked" otherwise), "chunked"
        (memory linear in the sequence length) or "plain" (the s×s scores held whole).
        `chunk_size=None` picks it from the sequence length. Compiled functions retrace;
        weights stay.

        Example:
        >>> model.set_attention("chunked", chunk_size=256)
        ('chunked', 256)
        """
        for block in blocks_of(self):
            block.attention.set_core(core, chunk_size)
        self._drop_compiled_functions()
        return core, chunk_size

    @property
    def packed(self) -> bool:
        """Whether the padding mask holds packed rows' document numbers (`set_packed`)."""
        return any(block.attention.packed for block in blocks_of(self))

    def set_packed(self, enabled=True) -> bool:
        """Train on packed rows: several whole examples one after another in a row. With packing on,
        the integer `padding_mask` input holds document numbers instead of 0/1: 0 = padding, 1, 2,
        ... = the example each token belongs to, in contiguous runs along the row (a run of one
        number is one document). Every block's attention then lets a query see only keys of its own
        document, and rotary positions restart at 0 at each document's first token. Off (the
        default), every graph is as without it. The cached decode path (`call_with_cache`) is never
        packed. Not part of the saved config, like the attention core; compiled functions retrace.
        Decoders only: an encoder's learned positions and pooled heads read the row as one example.

        Example:
        >>> model.set_packed(True)
        True
        >>> model({"token_ids": ids, "padding_mask": [[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]]})
        """
        enabled = bool(enabled)
        if enabled and not self.spec.is_decoder:
            raise ValueError(f"set_packed(True) supports the decoders only; {type(self).__name__} is a "
                             f"{self.spec.family} encoder, whose positions and pooled or per-row heads read a row "
                             "as one example. Pad each example to its own row instead.")
        for block in blocks_of(self):
            block.attention.packed = enabled
        self._drop_compiled_functions()
        return enabled

    @property
    def shared_blocks(self) -> bool:
        """Whether `full` trains through one traced block per kind of block (`set_shared_blocks`)."""
        return any(block.shared_replays is not None for block in blocks_of(self))

    def set_shared_blocks(self, enabled=True) -> bool:
        """Under `full` recomputation and without dropout, train every layer through one traced block of its kind
        (zoo.layers.shared_replay) instead of tracing each block's ops into the step: the step's graph, and the
        heap TensorFlow keeps for it (~0.1 GiB a block at 3B-8B), stop growing with depth. Off by default until
        the default is measured beside it and the planner fitted to it: at llama3.2-3b QLoRA 1 x 2048 it peaks at
        3.53 GiB (allocator) and 5.04 GiB (RSS), against 3.53 / 6.40 traced in (docs/memory.md). Same gradients;
        a block with dropout, or whose MLP runs in chunks, is traced in as before. Not saved with the model;
        compiled functions retrace.

        Example:
        >>> model = zoo.get("llama3.2-3b", checkpointing="full")
        >>> model.set_shared_blocks(True)
        True
        """
        enabled = bool(enabled)
        replays = SharedReplays() if enabled else None
        for block in blocks_of(self):
            block.share_replays(replays)
        self._drop_compiled_functions()
        return enabled

    fused_update = None  # the fused update's clip mode ("global", "per-block"), or None when off

    def set_fused_update(self, enabled=True, clip="global"):
        """Apply the optimizer inside the backward pass, block by block (zoo.training.fused), so that
        the gradients of the whole model never exist at once. Needs `full` checkpointing;
        call before `fit` (compiled functions retrace; weights and optimizer state stay).

        Args:
            enabled: turn it on (True) or off (False).
            clip: "global" (exact global-norm clipping, with a norm-only backward pass first)
                or "per-block" (each block clipped by its own norm: cheaper, not the same).

        Returns:
            The clip mode, or None when off.

        Example:
        >>> model = zoo.get("dec-1b", checkpointing="full")
        >>> model.set_fused_update(True)
        'global'
        >>> model.compile(optimizer=keras.optimizers.AdamW(1e-4, global_clipnorm=1.0), loss=...)
        """
        if enabled:
            fused.check_fusable(self)
        self.fused_update = fused.check_clip(clip) if enabled else None
        self._drop_compiled_functions()
        return self.fused_update

    preference_step = None  # zoo.preference.set_preference's step: preference pairs instead of the model's loss
    grpo_step = None  # zoo.grpo.set_grpo's step: completions sampled and rewarded, instead of the model's loss

    @property
    def metrics(self):
        extra = [m for s in (self.preference_step, self.grpo_step) if s is not None for m in s.metrics]
        return super().metrics + extra

    def make_train_function(self, force=False):
        """Keras' own, with the optimizer built first. With no distribution strategy, Keras' TensorFlow trainer
        builds the optimizer inside the step's first trace; TensorFlow then traces the whole step a second time,
        as a function that makes no variables: twice the first step's tracing time and graph memory (a tiny
        decoder's first `fit` 3.5 s against 1.7). Built here, the step is traced once."""
        if self.optimizer is not None and not self.optimizer.built and self.built:
            with self.distribute_strategy.scope():
                self.optimizer.build(self.trainable_variables)
        return super().make_train_function(force)

    def train_step(self, data):
        """Which training step runs is decided here, and only here: GRPO's when `zoo.grpo.set_grpo` set
        one; preference pairs' when `zoo.preference.set_preference` set one; the fused update when
        `set_fused_update` turned it on; a loss made from the backbone's outputs when the model has one
        (`loss_from_backbone`: the causal LM's chunked loss); otherwise Keras' own step."""
        step.check_weights(self)
        if self.grpo_step is not None:
            return self.grpo_step.train_step(self, data)
        if self.preference_step is not None:
            return self.preference_step.train_step(self, data)
        if self.fused_update:
            return fused.train_step(self, data, self.fused_update)
        if self.loss_from_backbone():
            return step.backbone_step(self, data)
        return super().train_step(data)

    def test_step(self, data):
        """Evaluation (`evaluate`, `fit`'s validation) makes the loss as training does: from the
        backbone's outputs where the model has such a loss (the chunked loss never makes the whole
        [B, S, vocab] logits), otherwise Keras' own step."""
        if self.preference_step is not None:
            return self.preference_step.test_step(self, data)
        if self.loss_from_backbone():
            return step.backbone_test_step(self, data)
        return super().test_step(data)

    def loss_from_backbone(self) -> bool:
        """Whether `training_loss` makes the loss from the backbone's outputs without this
        model's whole output (DecoderCausalLM's chunked loss)."""
        return False

    def training_loss(self, backbone_outputs, x, y, sample_weight, training=True):
        """(loss, outputs) of one batch, from the backbone's outputs: the compiled loss of
        `task_head`'s outputs. The fused update, `backbone_step` and (training=False)
        `backbone_test_step` call it; outputs are None where the loss updated the metrics itself."""
        y_pred = self.task_head(backbone_outputs, x, training=training)
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        return loss, y_pred

    def _drop_compiled_functions(self):
        for attr in ("train_function", "test_function", "predict_function"):
            if hasattr(self, attr):
                setattr(self, attr, None)
        # zoo.generation's traced decode loops too: they would keep generating with the old core or policy
        self.__dict__.pop("_zoo_generate", None)

    def __call__(self, inputs, *args, **kwargs):
        return super().__call__(self.complete_inputs(inputs), *args, **kwargs)

    def complete_inputs(self, inputs):
        """Inputs with one-segment `segment_ids` added where the model takes them and they are
        missing, as Hugging Face defaults token_type_ids to zeros."""
        if isinstance(inputs, dict) and "segment_ids" in self.input and "segment_ids" not in inputs:
            ids = inputs["token_ids"]
            zeros = np.zeros_like(ids) if isinstance(ids, np.ndarray) else keras.ops.zeros_like(ids)
            inputs = {**inputs, "segment_ids": zeros}
        return inputs

    def call(self, inputs, training=None, mask=None):
        self.check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask)

    def check_inputs(self, inputs):
        if not isinstance(inputs, dict):
            raise TypeError(
                f"{type(self).__name__} takes a dict of tensors with keys {sorted(self.input)}; "
                f"got {type(inputs).__name__}."
            )
        missing = sorted(set(self.input) - set(inputs))
        if missing:
            raise ValueError(f"Missing input(s) {missing}; {type(self).__name__} needs {sorted(self.input)}.")
        length = inputs["token_ids"].shape[-1]
        limit = self.spec.max_sequence_length
        if length is not None and length > limit:
            raise ValueError(
                f"Input sequence length {length} exceeds this model's maximum of {limit} positions; "
                f"truncate inputs to {limit} tokens (or build with max_sequence_length >= {length})."
            )

    def get_config(self):
        return {
            "spec": self.spec.to_dict(), "checkpointing": self.checkpointing,
            "dtype": self._zoo_dtype, "name": self.name, **self._task_config(),
        }

    def _task_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
