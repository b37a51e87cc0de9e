"""The optimizer step inside the backward pass (the "fused update", after LOMO/AdaLomo).

Under `full` checkpointing a block's backward pass needs only the block's saved input and
the gradient from above. So the step walks the blocks from last to first: recompute block i,
take the gradients of its variables and of its input, apply the optimizer to its variables
at once, and drop those gradients before block i-1. At no moment do more than one block's
gradients exist, besides the embedding and head gradients, which are kept to the end: a tied
embedding sums the gradients of both of its uses before its single update.

Every gradient is taken with the pre-step weights: a block's variables are read only by its
own recomputation, which comes before its update. The step counter (learning-rate schedule,
bias correction) advances once per step, after the last update.

Clipping:
  "global"     exact global-norm clipping (`global_clipnorm`, the recipes' `clipnorm`). The
               norm must be known before the first update, so a norm-only backward pass runs
               first; its gradients are reduced to squared sums and dropped block by block.
               The update pass runs inside a `cond` on that norm being finite, which is also
               mixed_float16's rule: a non-finite gradient anywhere skips the whole step and
               halves the loss scale. (In float32 and bfloat16 a non-finite step is skipped
               too, where Keras would write NaN into every weight.)
  "per-block"  each block's gradients are clipped by their own norm (and the embedding and
               head gradients by theirs): no norm pass, so cheaper, but a different
               algorithm: only ever chosen explicitly.
An optimizer's per-variable `clipnorm` or `clipvalue` is exact in both.

Order: a variable read depends on nothing but earlier writes to its variable, so TF's executor
would make every block's weight reads (and bfloat16 casts) and every update's reads at the start
of the step and hold them: the memory of all gradients again. Each forward block and replay waits
for its input, and each update for its block's gradients (docs/design-notes.md). Nothing makes an
update finish before the next block's gradients are taken either, so under load a few blocks'
updates fell behind, each holding its gradients; each replay also waits for the update above it.

Gradient accumulation cannot be combined with it (there is no whole-step gradient to add
up), nor, for now, a tf.distribute strategy with more than one replica.
"""

import tensorflow as tf
from keras.optimizers import LossScaleOptimizer

from zoo import training
from zoo.ordering import after

CLIPS = ("global", "per-block")


def check_clip(clip) -> str:
    if clip not in CLIPS:
        raise ValueError(f"Unknown fused-update clip {clip!r}; known: {', '.join(CLIPS)} "
                         "('global' is exact; 'per-block' clips each block by its own norm).")
    return clip


def check_model(model):
    """The fused update replays blocks from their saved inputs: it needs `full` everywhere."""
    if model.task in (None, "backbone"):
        raise ValueError(f"The fused update trains a task model; {type(model).__name__} has no loss. "
                         "Build the model with a task (task='causal_lm', 'masked_lm' or 'classifier').")
    if model.checkpointing != "full":
        raise ValueError(
            f"The fused update needs checkpointing='full' (it recomputes each block from its saved input "
            f"during the backward pass); this model's policy is {model.checkpointing!r}. Call "
            "model.set_checkpointing('full') first, or turn the fused update off with "
            "model.set_fused_update(False)."
        )


def check_optimizer(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if inner.gradient_accumulation_steps:
        raise ValueError(
            f"The fused update cannot be combined with gradient accumulation (gradient_accumulation_steps="
            f"{inner.gradient_accumulation_steps}): it applies each block's gradients as soon as they exist, so "
            "there is no whole-step gradient to accumulate. Drop accumulation and raise the batch size instead "
            "(the memory the fused update frees is meant for it), or turn the fused update off."
        )
    if inner.use_ema:
        raise ValueError("The fused update does not keep an exponential moving average of the weights (use_ema=True); "
                         "turn one of them off.")
    if getattr(inner, "loss_scale_factor", None) is not None:
        raise ValueError("The fused update supports dynamic loss scaling (mixed_float16) but not a fixed "
                         "loss_scale_factor; drop loss_scale_factor.")
    if tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1:
        raise ValueError("The fused update runs on one replica only for now; train without a strategy, or turn "
                         "the fused update off to train data-parallel.")


def _tensors(grads):
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]


def _global_clip_scale(norm, clipnorm):
    """Keras' `clip_by_global_norm` factor: 1 below the threshold, clipnorm / norm above it."""
    return clipnorm * tf.minimum(1.0 / norm, 1.0 / clipnorm)


class _Step:
    """One fused training step on one batch: the forward pass, then backward walks."""

    def __init__(self, model, clip):
        self.model, self.clip = model, clip
        self.optimizer = model.optimizer
        self.scaler = self.optimizer if isinstance(self.optimizer, LossScaleOptimizer) else None
        self.inner = self.scaler.inner_optimizer if self.scaler else self.optimizer
        self.blocks = model.backbone.blocks
        self.block_vars = [block.trainable_variables for block in self.blocks]
        in_blocks = {id(v) for group in self.block_vars for v in group}
        self.outer_vars = [v for v in model.trainable_variables if id(v) not in in_blocks]

    def forward(self, x, y, sample_weight):
        """Runs the stem (taped), the blocks (untaped, inputs kept) and the head (taped)."""
        model, backbone = self.model, self.model.backbone
        self.mask = x["padding_mask"]
        with tf.GradientTape(persistent=True) as self.stem_tape:
            self.first = backbone.embed(x, training=True)
        h, self.inputs, self.seeds = self.first, [], []
        for block in self.blocks:
            self.inputs.append(h)
            self.seeds.append(block.draw_seed())
            with tf.control_dependencies([h]):  # its weight reads too (module docstring: Order)
                h = block.replay(h, self.mask, self.seeds[-1])
        with tf.GradientTape() as head_tape:
            head_tape.watch(h)
            loss, y_pred = model.training_loss(backbone.finish(h, training=True), x, y, sample_weight)
            training.track_loss(model, x, loss)
            scaled = self.optimizer.scale_loss(loss)
        self.d_top, *self.head_grads = head_tape.gradient(scaled, [h, *self.outer_vars])
        return y_pred

    def walk(self, on_block):
        """Backward from the last block to the first; `on_block(variables, grads)` consumes each
        block's gradients and returns tensors that exist once it is done with them. Returns the
        embedding and head gradients (both uses summed)."""
        d, done = self.d_top, []
        for i in reversed(range(len(self.blocks))):
            # Block i's recomputation waits for the block above it, its input gradient and the end of
            # its update (zoo.ordering): one block is live at once, and one block's gradients.
            x = after(self.inputs[i], d, *done)
            with tf.GradientTape() as tape, tf.control_dependencies([x]):
                tape.watch(x)
                out = self.blocks[i].replay(x, self.mask, self.seeds[i])
            d, *grads = tape.gradient(out, [x, *self.block_vars[i]], output_gradients=d)
            with tf.control_dependencies(_tensors(grads)):  # the update's reads and decay wait too
                done = on_block(self.block_vars[i], self._unscaled(grads))
        stem_grads = self.stem_tape.gradient(self.first, self.outer_vars, output_gradients=d)
        outer = [a if b is None else (b if a is None else a + b) for a, b in zip(self.head_grads, stem_grads)]
        return self._unscaled(outer)

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
        norm = tf.sqrt(tf.reduce_sum(tf.stack([squares[i] for i in sorted(squares)])))
        return norm

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
                grads = self.inner._clip_gradients(grads)  # per-variable clipnorm / clipvalue (or none)
            self.inner._apply_weight_decay(variables)
            self.inner._backend_update_step(grads, variables, self.inner.learning_rate)
            return [v.value.read_value() for v in variables]  # read after the writes: the update is done

        apply(self.outer_vars, self.walk(apply))
        self.inner.iterations.assign_add(1)
        if self.scaler is not None:
            self.scaler_after_finite_step()

    def scaler_after_finite_step(self):
        """LossScaleOptimizer's own bookkeeping after a finite step: double the scale every
        `dynamic_growth_steps` finite steps."""
        s = self.scaler

        def upscale():
            s.step_counter.assign(0)
            s.dynamic_scale.assign(s.dynamic_scale * 2.0)

        def count():
            s.step_counter.assign_add(1)

        tf.cond(tf.equal(s.step_counter, s.dynamic_growth_steps - 1), upscale, count)

    def skip(self):
        if self.scaler is not None:
            self.scaler._stateful_handle_non_finite_grads()

    def run(self):
        needs_norm = self.scaler is not None or (self.clip == "global" and self.inner.global_clipnorm)
        if not needs_norm:
            self.update()
            return
        norm = self.global_norm()
        clip_scale = None
        if self.clip == "global" and self.inner.global_clipnorm:
            clip_scale = _global_clip_scale(norm, self.inner.global_clipnorm)

        def update():
            self.update(clip_scale)
            return tf.constant(True)

        def skip():
            self.skip()
            return tf.constant(False)

        tf.cond(tf.math.is_finite(norm), update, skip)


def train_step(model, data, clip="global"):
    """`model.train_step` with the fused update (ZooModel.train_step calls it when enabled)."""
    check_model(model)
    check_optimizer(model.optimizer)
    x, y, sample_weight = training.unpack(model, data)
    if not model.optimizer.built:  # as Keras' apply() does on the first step
        model.optimizer.build(model.trainable_variables)
    step = _Step(model, clip)
    y_pred = step.forward(x, y, sample_weight)
    step.run()
    return training.metrics(model, x, y, y_pred, sample_weight)
