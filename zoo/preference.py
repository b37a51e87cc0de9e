"""Preference tuning of a causal LM on (prompt, chosen, rejected) pairs: DPO and its IPO and robust
variants, or SimPO, as `fit`'s training step, with no second model in memory.

    zoo.lora.enable_lora(model, rank=16)                  # the reference: the same model, adapters off
    zoo.preference.set_preference(model, "dpo", beta=0.1)
    model.compile(optimizer=keras.optimizers.AdamW(5e-7), loss=None)
    model.fit(pairs)       # x {"token_ids", "padding_mask"} [P, 2, S]; y {"targets", "weights"} [P, 2, S]

A batch holds P pairs, each a chosen (index 0) and a rejected (index 1) sequence of the same prompt
(recipes.dpo_data writes them). The step runs the backbone once over the 2P rows and scores each row
by `zoo.ops.preference.sequence_logps`, a chunk of positions at a time: no [2P, S, vocab] logits
exist, for the policy or the reference. The reference is one of:
  - "adapters": the model with its LoRA adapters switched off (`zoo.lora.adapters_off`), as TRL's
    DPOTrainer does with a PEFT model: one more forward pass in the step, which keeps nothing;
  - "stored": log-probabilities computed once before training (`reference_logps`, from the starting
    model or a reference model loaded for that pass only), carried in each batch's
    y["reference_logps"] [P, 2] (TRL's `precompute_ref_log_probs`);
  - none, for SimPO, which has no reference.
Dropout is off in both passes by default, as TRL's `disable_dropout=True`.

Metrics go under TRL's names (rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
logps/chosen, logps/rejected), averaged over the pairs since the last reset, as fit's other metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from zoo import lora
from zoo.ops.ordering import after
from zoo.ops.preference import (
    METRIC_NAMES,
    check_dpo,
    check_simpo,
    dpo_loss,
    preference_metrics,
    sequence_logps,
    simpo_loss,
)
from zoo.training.step import attach_step, needs_lm_head, track_loss

LOSSES = ("dpo", "simpo")
REFERENCES = ("adapters", "stored")


@dataclass(frozen=True)
class Preference:
    """What the step optimises. `loss`: "dpo" (with `loss_type` sigmoid, ipo or robust, and
    `label_smoothing`: conservative DPO for sigmoid, the flip rate for robust) or "simpo" (with
    `gamma`). `beta`: DPO's β (IPO's τ), SimPO's β. `reference`: "adapters" or "stored" (DPO only).
    `dropout`: keep the model's dropout on in the policy pass (TRL's disable_dropout=False)."""

    loss: str = "dpo"
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    gamma: float = 1.0
    reference: str | None = "adapters"
    dropout: bool = False

    def check(self):
        """Every setting by name, in pure Python (recipes check theirs at import, before TensorFlow runs)."""
        if self.loss not in LOSSES:
            raise ValueError(f"Unknown preference loss {self.loss!r}; known: {', '.join(LOSSES)}.")
        if self.loss == "simpo":
            check_simpo(self.beta, self.gamma, self.label_smoothing)
            if self.reference is not None:
                raise ValueError("SimPO has no reference model; pass reference=None.")
            return self
        check_dpo(self.beta, self.label_smoothing, self.loss_type)
        if self.reference not in REFERENCES:
            raise ValueError(f"Unknown reference {self.reference!r}; known: {', '.join(REFERENCES)} (DPO needs one).")
        return self


def rows(pairs):
    """[P, 2, ...] -> [2P, ...]: the P chosen sequences, then the P rejected (TRL's layout)."""
    return tf.concat([pairs[:, 0], pairs[:, 1]], axis=0)


def sequence_scores(model, inputs, targets, weights, training=False, gradients=True):
    """[2P] float32: each row's summed log-probability of its completion tokens under `model`."""
    hidden = model.backbone(inputs, training=training)["sequence_output"]
    chunk = model.loss_chunk or None  # 0 (whole logits for the LM loss) has no meaning here
    return sequence_logps(hidden, model.lm_logits, targets, weights, chunk, gradients)


def reference_logps(model, batches, adapters_off=False) -> np.ndarray:
    """The reference log-probabilities of every pair, in order: float32 [N, 2] (chosen, rejected).

    Args:
        model: the reference (the policy before training; a reference model loaded for this pass only;
            or a LoRA model with `adapters_off`).
        batches: an iterable of `(x, y)` or `(indices, x, y)` numpy batches in the pairs' order, with
            x and y as the step takes them ([P, 2, S]; recipes.dpo_data.reference_batches).
    """

    @tf.function(reduce_retracing=True)
    def score(token_ids, padding_mask, targets, weights):
        inputs = {"token_ids": rows(token_ids), "padding_mask": rows(padding_mask)}
        logps = sequence_scores(model, inputs, rows(targets), rows(weights), gradients=False)
        return tf.reshape(logps, [2, -1])

    out = []
    for batch in batches:
        x, y = batch[-2], batch[-1]
        args = (x["token_ids"], x["padding_mask"], y["targets"], y["weights"])
        if adapters_off:
            with lora.adapters_off(model):
                both = score(*args)
        else:
            both = score(*args)
        out.append(np.asarray(both).T)
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 2), np.float32)


class PreferenceStep:
    """The training and evaluation steps `ZooModel.train_step` / `test_step` hand a batch to when
    `set_preference` set one, and their metrics (`ZooModel.metrics` lists them)."""

    def __init__(self, preference: Preference):
        self.preference = preference
        self.metrics = [keras.metrics.Mean(name=name) for name in METRIC_NAMES]

    def train_step(self, model, data):
        x, y = self._unpack(data)
        inputs, targets, weights = self._rows(x, y)
        reference = self._reference(model, inputs, targets, weights, y)
        if reference is not None:  # the policy's forward waits for the reference's: one pass's activations at a time
            inputs = {**inputs, "token_ids": after(inputs["token_ids"], reference)}
        with tf.GradientTape() as tape:
            policy = sequence_scores(model, inputs, targets, weights, training=self.preference.dropout)
            loss = self._loss(policy, reference, weights)
            track_loss(model, x, loss)
            scaled = model.optimizer.scale_loss(loss)
        variables = model.trainable_weights
        model.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        return model.get_metrics_result()

    def test_step(self, model, data):
        x, y = self._unpack(data)
        inputs, targets, weights = self._rows(x, y)
        reference = self._reference(model, inputs, targets, weights, y)
        policy = sequence_scores(model, inputs, targets, weights, gradients=False)
        track_loss(model, x, self._loss(policy, reference, weights))
        return model.get_metrics_result()

    def _unpack(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None or not isinstance(x, dict) or not isinstance(y, dict):
            raise ValueError("A preference batch is (x, y): x {'token_ids', 'padding_mask'} and y {'targets', "
                             "'weights'[, 'reference_logps']}, each [pairs, 2, ...] (recipes.dpo_data.dataset).")
        for name, part in (("token_ids", x), ("padding_mask", x), ("targets", y), ("weights", y)):
            shape = tf.TensorShape(part[name].shape) if name in part else None  # a tensor's, or (eager) an array's
            if shape is None or shape.rank != 3 or shape[1] != 2:
                found = shape
                raise ValueError(f"A preference batch needs {name!r} of shape [pairs, 2, sequence] (chosen, "
                                 f"rejected); got {found}.")
        return x, y

    @staticmethod
    def _rows(x, y):
        inputs = {"token_ids": rows(x["token_ids"]), "padding_mask": rows(x["padding_mask"])}
        return inputs, rows(y["targets"]), rows(tf.cast(y["weights"], tf.float32))

    def _reference(self, model, inputs, targets, weights, y):
        """[2P] reference log-probabilities, or None (SimPO)."""
        kind = self.preference.reference
        if kind is None:
            return None
        if kind == "stored":
            if "reference_logps" not in y:
                raise ValueError("reference='stored' reads each batch's y['reference_logps'] [pairs, 2], and this "
                                 "batch has none: compute them first (zoo.preference.reference_logps; the dpo recipe "
                                 "does), or train LoRA adapters with reference='adapters'.")
            return rows(tf.cast(y["reference_logps"], tf.float32))
        with lora.adapters_off(model):
            return sequence_scores(model, inputs, targets, weights, gradients=False)

    def _loss(self, policy, reference, weights):
        """The mean loss over the pairs (divided by the replicas, as Keras' losses are); updates the metrics."""
        p = self.preference
        half = tf.shape(policy)[0] // 2
        lengths = tf.reduce_sum(weights, axis=1)  # the tokens scored (IPO, SimPO divide by them: docs/dpo.md)
        chosen, rejected = policy[:half], policy[half:]
        if p.loss == "simpo":
            losses, chosen_rewards, rejected_rewards = simpo_loss(chosen, rejected, lengths[:half], lengths[half:],
                                                                  p.beta, p.gamma, p.label_smoothing)
            chosen, rejected = chosen / tf.maximum(lengths[:half], 1.0), rejected / tf.maximum(lengths[half:], 1.0)
        else:
            losses, chosen_rewards, rejected_rewards = dpo_loss(
                chosen, rejected, reference[:half], reference[half:], p.beta, p.label_smoothing, p.loss_type,
                lengths[:half], lengths[half:])
        figures = preference_metrics(chosen_rewards, rejected_rewards, chosen, rejected)
        pairs = tf.cast(half, tf.float32)
        for metric in self.metrics:
            metric.update_state(figures[metric.name], sample_weight=pairs)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return tf.reduce_mean(losses) / replicas


def set_preference(model, loss="dpo", beta=0.1, loss_type="sigmoid", label_smoothing=0.0, gamma=1.0,
                   reference="auto", dropout=False) -> Preference:
    """Make `fit` (and `evaluate`) train `model`, a zoo causal LM, on preference pairs. Call before
    `compile`... or after: compiled functions retrace. `set_preference(model, None)` turns it off.

    Args:
        loss, beta, loss_type, label_smoothing, gamma, dropout: `Preference`'s fields.
        reference: "adapters" (a LoRA model's base), "stored" (each batch carries the reference's
            log-probabilities), or "auto": adapters where the model has LoRA, else stored; SimPO: none.

    Returns:
        The checked `Preference`.

    Raises:
        ValueError: a bad setting (named), a model that is not a causal LM, the fused update (it
            applies the LM loss's gradients block by block), packed rows, or reference="adapters" on a
            model without LoRA (the fix: LoRA, or stored reference log-probabilities).
    """
    if loss is None:
        return attach_step(model, "preference_step", None)
    needs_lm_head(model, "Preference tuning scores completions")
    if getattr(model, "fused_update", None):
        raise ValueError("Preference tuning does not run under the fused update (it fuses the LM loss's backward); "
                         "call model.set_fused_update(False).")
    if getattr(model, "packed", False):
        raise ValueError("Preference tuning scores one pair's sequences a row (not packed rows); call "
                         "model.set_packed(False).")
    if reference == "auto":
        reference = None if loss == "simpo" else ("adapters" if lora.has_lora(model) else "stored")
    preference = Preference(loss, beta, loss_type, label_smoothing, gamma, reference, dropout).check()
    if reference == "adapters" and not lora.has_lora(model):
        raise ValueError("reference='adapters' is the model with its LoRA adapters off, and this model has no LoRA. "
                         "Enable LoRA (zoo.lora.enable_lora), or use reference='stored' with log-probabilities "
                         "computed before training (zoo.preference.reference_logps).")
    attach_step(model, "preference_step", PreferenceStep(preference))
    return preference
