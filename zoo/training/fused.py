"""The optimizer step inside the backward pass (the "fused update", after LOMO/AdaLomo).

Under `full` checkpointing block i's backward needs only its saved input and the gradient from
above, so the step walks the blocks from last to first: replay block i, take its gradients, update
its variables at once and drop the gradients. One block's gradients exist at a time, besides the
embedding's and head's, kept to the end (a tied embedding sums both uses). Under tf.distribute
each block's gradients are summed across replicas as they appear. Clipping modes, replicas, and
why every replay and update waits for what it does: docs/design-notes.md (The fused update).
"""

import tensorflow as tf

from zoo import checks
from zoo.ops.ordering import after
from zoo.training import keras_optimizer, step

CLIPS = ("global", "per-block")


def check_clip(clip) -> str:
    if clip not in CLIPS:
        raise ValueError(f"Unknown fused-update clip {clip!r}; known: {', '.join(CLIPS)} "
                         "('global' is exact; 'per-block' clips each block by its own norm).")
    return clip


def check_fusable(model):
    """The model side of the rules (zoo.checks.fused): a task model, `full` checkpointing, no LoRA."""
    if any(getattr(layer, "lora_enabled", False) for layer in model._flatten_layers()):
        checks.lora_fused()
    if model.task in (None, "backbone"):
        raise ValueError(f"The fused update trains a task model; {type(model).__name__} has no loss. "
                         "Build the model with a task (task='causal_lm', 'masked_lm' or 'classifier').")
    checks.fused(model.checkpointing)


def check_optimizer(optimizer):
    """The optimizer side: no accumulation, EMA or fixed loss scale."""
    inner, _ = keras_optimizer.split_scaling(optimizer)
    checks.fused("full", inner.gradient_accumulation_steps or 1)
    if inner.use_ema:
        raise ValueError("The fused update does not keep an exponential moving average of the weights (use_ema=True); "
                         "turn one of them off.")
    if getattr(inner, "loss_scale_factor", None) is not None:
        raise ValueError("The fused update supports dynamic loss scaling (mixed_float16) but not a fixed "
                         "loss_scale_factor; drop loss_scale_factor.")


def _tensors(grads):
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]


def _summed(grads):
    """Under tf.distribute, the sum of every replica's gradients (each replica's loss is already
    divided by the replica count, so the sum is the global batch's gradient); else `grads`."""
    if not tf.distribute.has_strategy():
        return grads
    dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
    return step.sum_over_replicas(dense, tf.distribute.get_replica_context())


def _global_clip_scale(norm, clipnorm):
    """Keras' `clip_by_global_norm` factor: 1 below the threshold, clipnorm / norm above it."""
    return clipnorm * tf.minimum(1.0 / norm, 1.0 / clipnorm)


class _Step:
    """One fused training step on one batch: the forward pass (run on construction), then
    backward walks over the blocks (`run`)."""

    def __init__(self, model, clip, x, y, sample_weight, head_loss=None):
        self.model, self.clip, self.head_loss = model, clip, head_loss
        self.optimizer = model.optimizer
        self.inner, self.scaler = keras_optimizer.split_scaling(self.optimizer)
        self.blocks = model.backbone.blocks
        self.block_vars = [block.trainable_variables for block in self.blocks]
        in_blocks = {id(v) for group in self.block_vars for v in group}
        self.outer_vars = [v for v in model.trainable_variables if id(v) not in in_blocks]
        self.mask = x["padding_mask"]
        self.stem_tape = tf.GradientTape(persistent=True)
        forward = self._forward(x, y, sample_weight)
        self.first, self.inputs, self.masks, self.d_top, self.head_grads, self.y_pred = forward

    def _forward(self, x, y, sample_weight):
        """The stem (taped), the blocks (untaped, each input and dropout draw kept) and the head (taped)."""
        model, backbone = self.model, self.model.backbone
        with self.stem_tape:
            first = backbone.embed(x, training=True)
        h, inputs, masks = first, [], []
        for block in self.blocks:
            inputs.append(h)
            with tf.control_dependencies([h]):  # its weight reads wait too (design notes: Order)
                masks.append(block.draw_masks(h, ahead=True))
                h = block.replay(h, self.mask, masks[-1])
        with tf.GradientTape() as head_tape:
            head_tape.watch(h)
            if self.head_loss is None:
                loss, y_pred = model.training_loss(backbone.final_outputs(h, training=True), x, y, sample_weight)
                step.track_loss(model, x, loss)
            else:  # another loss on the backbone's outputs (zoo.grpo's): its caller tracks it
                loss, y_pred = self.head_loss(backbone.final_outputs(h, training=True))
            scaled = self.optimizer.scale_loss(loss)
        d_top, *head_grads = head_tape.gradient(scaled, [h, *self.outer_vars])
        return first, inputs, masks, d_top, head_grads, y_pred

    def walk(self, on_block):
        """Backward from the last block to the first; `on_block(variables, grads)` consumes each
        block's gradients and returns tensors that exist once it is done with them. Returns the
        embedding and head gradients (both uses summed)."""
        d, done = self.d_top, []
        for i in reversed(range(len(self.blocks))):
            # Block i's recomputation waits for the block above it, its input gradient and the end of
            # its update (zoo.ops.ordering): one block is live at once, and one block's gradients.
            x = after(self.inputs[i], d, *done)
            with tf.GradientTape() as tape, tf.control_dependencies([x]):
                tape.watch(x)
                out = self.blocks[i].replay(x, self.mask, self.masks[i])
            d, *grads = tape.gradient(out, [x, *self.block_vars[i]], output_gradients=d)
            with tf.control_dependencies(_tensors(grads)):  # the update's reads and decay wait too
                done = on_block(self.block_vars[i], self._unscaled(_summed(grads)))
        stem_grads = self.stem_tape.gradient(self.first, self.outer_vars, output_gradients=d)
        outer = [a if b is None else (b if a is None else a + b) for a, b in zip(self.head_grads, stem_grads)]
        return self._unscaled(_summed(outer))  # a tied embedding's two uses are summed first, then reduced once

    def _unscaled(self, grads):
        if self.scaler is None:
            return grads
        scale = self.scaler.dynamic_scale
        return [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]

    def global_norm(self):
        """The norm-only pass: every gradient reduced to its squared sum as it appears. The sums
        are added up in the model's variable order, as Keras' `clip_by_global_norm` does, so the
        norm is the same number to the last bit."""
        order = {id(v): i for i, v in enumerate(self.model.trainable_variables)}
        squares = {}

        def add(variables, grads):
            sums = {order[id(v)]: tf.reduce_sum(tf.square(g)) for v, g in zip(variables, grads) if g is not None}
            squares.update(sums)
            return list(sums.values())

        add(self.outer_vars, self.walk(add))
        return tf.sqrt(tf.reduce_sum(tf.stack([squares[i] for i in sorted(squares)])))

    def update(self, clip_scale=None):
        """The update pass: each block's variables are updated as soon as their gradients exist."""
        def apply(variables, grads):
            pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
            if not pairs:
                return []
            grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
            if clip_scale is not None:  # exact global clipping, from the norm pass
                grads = [g * tf.cast(clip_scale, g.dtype) for g in grads]
            elif self.inner.global_clipnorm:  # "per-block": this group's own norm
                norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))
                scale = _global_clip_scale(norm, self.inner.global_clipnorm)
                grads = [g * tf.cast(scale, g.dtype) for g in grads]
            else:
                grads = keras_optimizer.clip_each(self.inner, grads)
            keras_optimizer.update(self.inner, grads, variables)
            return [v.value.read_value() for v in variables]  # read after the writes: the update is done

        apply(self.outer_vars, self.walk(apply))
        self.inner.iterations.assign_add(1)
        if self.scaler is not None:
            keras_optimizer.grow_scale(self.scaler)

    def run(self):
        """The update, after a norm pass where the global clip or a loss scale needs the norm first
        (a non-finite norm skips the whole step, and halves a dynamic loss scale)."""
        needs_norm = self.scaler is not None or (self.clip == "global" and self.inner.global_clipnorm)
        if not needs_norm:
            self.update()
            return
        norm = self.global_norm()
        if not tf.distribute.has_strategy():
            tf.cond(tf.math.is_finite(norm), lambda: self._update_by(norm), self._skip)
            return
        # A replica's control flow may not hold the update's all-reduces (tf.distribute refuses a merge_call
        # there), so, as Keras' LossScaleOptimizer does, the cond runs in cross-replica context on the norm
        # every replica holds (the same number: it is made of summed gradients) and each replica's update
        # pass runs inside its branch.
        def decide(strategy, steps, norms):
            def update():
                strategy.extended.call_for_each_replica(_Step._update_by, args=(steps, norms))
                return tf.constant(True)

            return tf.cond(tf.math.is_finite(strategy.experimental_local_results(norms)[0]), update, self._skip)

        tf.distribute.get_replica_context().merge_call(decide, args=(self, norm))

    def _update_by(self, norm):
        """The update pass after the norm pass: scaled by the exact global clip where it is on."""
        clip_scale = None
        if self.clip == "global" and self.inner.global_clipnorm:
            clip_scale = _global_clip_scale(norm, self.inner.global_clipnorm)
        self.update(clip_scale)
        return tf.constant(True)

    def _skip(self):
        """A non-finite step changes no weight; a dynamic loss scale halves."""
        if self.scaler is not None:
            keras_optimizer.skip_step(self.scaler)
        return tf.constant(False)


def loss_step(model, x, head_loss):
    """The fused update on a loss other than the model's own: `head_loss(the backbone's outputs) -> (loss, extra)`
    on inputs `x` ({"token_ids", "padding_mask"}), with the model's clip mode (`set_fused_update`). zoo.grpo's
    step runs here under the fused update. Returns `extra`."""
    check_fusable(model)
    check_optimizer(model.optimizer)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    fused_step = _Step(model, model.fused_update or "global", x, None, None, head_loss)
    fused_step.run()
    return fused_step.y_pred


def train_step(model, data, clip="global"):
    """`model.train_step` with the fused update (ZooModel.train_step calls it when enabled)."""
    check_fusable(model)
    check_optimizer(model.optimizer)
    x, y, sample_weight = step.unpack(model, data)
    if not model.optimizer.built:  # as Keras' apply() does on the first step
        model.optimizer.build(model.trainable_variables)
    fused_step = _Step(model, clip, x, y, sample_weight)
    fused_step.run()
    return step.metrics(model, x, y, fused_step.y_pred, sample_weight)
