"""GRPO (Group Relative Policy Optimization) on a zoo causal LM, as TRL's GRPOTrainer: the completions' per-token
log-probabilities under the policy, the sampling policy or the reference, and the loss on a batch of them, with no
second model in memory and no [batch, sequence, vocab] logits.

    zoo.lora.enable_lora(model, rank=16)            # the reference: the same model, adapters off
    batch = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"}   # TRL's layout, below
    reference = completion_logps(model, batch, adapters_off=True, gradients=False)
    with tf.GradientTape() as tape:
        logps, entropies = completion_logps(model, batch, entropy=True)
        loss, metrics = zoo.ops.grpo.grpo_loss(logps, advantages, batch["completion_mask"], old, reference, ...)

A batch is TRL's: prompts left-padded [B, P] (their mask 0 on the padding), completions right-padded [B, T]
(their mask 1 on the tokens generated, the end-of-turn token included). The model reads each row as prompt then
completion; position P - 1 + t predicts completion token t. The reference is the model with its LoRA adapters
off (`zoo.lora.adapters_off`, TRL's reference for a PEFT model) or log-probabilities stored before training.
"""

import time
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from zoo import lora
from zoo.generation import generate_ids
from zoo.ops.grpo import METRIC_NAMES, check_grpo, group_advantages, grpo_loss
from zoo.ops.preference import token_logps
from zoo.training import fused
from zoo.training.step import attach_step, needs_lm_head

BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
PROMPT_MULTIPLE = 16  # GrpoStep's prompt widths: each new width traces the scoring and the update again (~1 min)


def completion_logps(model, batch, training=False, gradients=True, entropy=False, adapters_off=False):
    """float32 [B, T]: log p(completion token t | the prompt and the tokens before it) under `model`, a chunk of
    positions at a time (`zoo.ops.preference.token_logps`); with `entropy`, also each position's entropy.

    Args:
        model: a zoo causal LM (`lm_logits`).
        batch: {"prompt_ids", "prompt_mask"} [B, P] and {"completion_ids", "completion_mask"} [B, T].
        training: run the backbone in training mode (dropout; TRL's disable_dropout=True means False).
        gradients: False for the sampling policy's or the reference's log-probabilities: nothing kept.
        entropy: also return [B, T] entropies (TRL's logged `entropy`), with no gradient.
        adapters_off: score with the LoRA adapters switched off (the reference).
    """
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"A GRPO batch needs {', '.join(BATCH_KEYS)} (TRL's layout: prompts left-padded, "
                         f"completions right-padded); missing {', '.join(missing)}.")
    if not hasattr(model, "lm_logits"):
        raise ValueError(f"GRPO scores completions with an LM head; {type(model).__name__} has none (build the "
                         "causal LM: task='causal_lm').")
    x = backbone_inputs(batch)

    def score():
        return logps_of(model, model.backbone(x, training=training), batch, gradients, entropy)

    if adapters_off:
        with lora.adapters_off(model):
            return score()
    return score()


def backbone_inputs(batch) -> dict:
    """The backbone's inputs of a TRL-layout batch: each row prompt then completion, and its padding mask."""
    ids = tf.concat([tf.cast(batch["prompt_ids"], tf.int32), tf.cast(batch["completion_ids"], tf.int32)], 1)
    mask = tf.concat([tf.cast(batch["prompt_mask"], tf.int32), tf.cast(batch["completion_mask"], tf.int32)], 1)
    return {"token_ids": ids, "padding_mask": mask}


def logps_of(model, outputs, batch, gradients=True, entropy=False):
    """The completion tokens' log-probabilities (and entropies) from the backbone's outputs on
    `backbone_inputs(batch)`."""
    prompt_length = batch["prompt_ids"].shape[1]
    hidden = outputs["sequence_output"]
    chunk = model.loss_chunk or None  # 0 (whole logits for the LM loss) has no meaning here
    return token_logps(hidden[:, prompt_length - 1:-1], model.lm_logits, tf.cast(batch["completion_ids"], tf.int32),
                       chunk, gradients, entropy)


@dataclass(frozen=True)
class Grpo:
    """What a GRPO step optimises (TRL's GRPOConfig names and defaults): `loss_type`, `beta` (the KL coefficient;
    0: no reference), `epsilon` / `epsilon_high` (the clip range; None: epsilon), `scale_rewards`,
    `num_generations` (G >= 2 completions per prompt), `max_completion_length`, `num_iterations` (mu: steps on each
    sampled batch, with the importance ratio to the sampling policy), `mask_truncated_completions` (a completion
    cut at the length limit trains nothing), `bias_correction_kl` (TRL's `use_bias_correction_kl`)."""

    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    scale_rewards: str = "group"
    num_generations: int = 8
    max_completion_length: int = 256
    num_iterations: int = 1
    mask_truncated_completions: bool = False
    bias_correction_kl: bool = True

    def check(self):
        """Every setting by name, in pure Python."""
        check_grpo(self.loss_type, self.beta, self.epsilon, self.epsilon_high, self.scale_rewards,
                   self.num_generations, self.max_completion_length)
        if isinstance(self.num_iterations, bool) or not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ValueError(f"num_iterations (mu) must be a positive integer, got {self.num_iterations!r}.")
        return self


def sample(model, prompts, settings: Grpo, stop_token_ids=(), pad_id=0, seed=None, sampler="random",
           prompt_multiple=1, **sampler_args) -> dict:
    """G completions of each prompt from the policy (zoo.generation's key/value cache), in TRL's batch layout.

    Args:
        model: a zoo causal LM.
        prompts: token-id rows (a chat prompt: `Chat.prompt_ids`, with its generation prompt).
        settings: `Grpo` (num_generations, max_completion_length, mask_truncated_completions).
        stop_token_ids: the template's end-of-turn and eos tokens (`Chat.stop_ids`): a completion ends after one.
        pad_id: the id padding takes (masked out; any id of the vocabulary).
        seed, sampler, **sampler_args: zoo.generation's (TRL samples the whole softmax: "random", temperature 1).
        prompt_multiple: the prompts' padded width rounded up to a multiple of this, so that the traced scoring
            and update see a few prompt widths, not one per batch (the padding is masked out, and rotary positions
            shifted alike in a row leave its attention as it was).

    Returns:
        {"prompt_ids", "prompt_mask"} [N, P] (left-padded), {"completion_ids", "completion_mask"} [N, T] with
        T = max_completion_length (right-padded; mask 1 on the tokens generated, the stop token included, and 0 on
        a truncated completion when `mask_truncated_completions`), "truncated" [N] bool (no stop token within the
        limit), "completion_lengths" [N]; N = prompts x G, each prompt's completions consecutive.
    """
    g, limit = settings.num_generations, settings.max_completion_length
    rows = [np.asarray(p, np.int32).reshape(-1) for p in prompts for _ in range(g)]
    out, ends = generate_ids(model, rows, limit, sampler, seed, True, list(stop_token_ids), True, False,
                              sampler_args)
    longest = -(-max(len(r) for r in rows) // prompt_multiple) * prompt_multiple
    batch = {"prompt_ids": np.full((len(rows), longest), pad_id, np.int32),
             "prompt_mask": np.zeros((len(rows), longest), np.int32),
             "completion_ids": np.full((len(rows), limit), pad_id, np.int32),
             "completion_mask": np.zeros((len(rows), limit), np.int32)}
    stops = set(int(t) for t in stop_token_ids)
    truncated, lengths = np.zeros(len(rows), bool), np.zeros(len(rows), np.int32)
    for i, (row, end) in enumerate(zip(rows, ends)):
        batch["prompt_ids"][i, longest - len(row):] = row
        batch["prompt_mask"][i, longest - len(row):] = 1
        completion = out[i, len(row):end]
        lengths[i] = len(completion)
        batch["completion_ids"][i, :len(completion)] = completion
        batch["completion_mask"][i, :len(completion)] = 1
        truncated[i] = not len(completion) or int(completion[-1]) not in stops
    if settings.mask_truncated_completions:
        batch["completion_mask"][truncated] = 0
    return {**batch, "truncated": truncated, "completion_lengths": lengths}


def train_step(model, batch, advantages, settings: Grpo, old_logps=None, ref_logps=None, num_items=None):
    """One optimizer update of `model` (compiled with its optimizer) on a sampled batch: the loss of
    zoo.ops.grpo.grpo_loss on the policy's log-probabilities, its gradients applied. The reference's
    log-probabilities (beta > 0) are `ref_logps`, or the model with its adapters off, scored here. Under the fused
    update (full weights, `full` checkpointing: zoo.training.fused) each block is updated as its gradients appear;
    its walk runs the blocks in training mode (their dropout, where a model has any).

    Returns:
        `(loss, metrics)` as grpo_loss's, float32 scalars.
    """
    if settings.beta and ref_logps is None:
        ref_logps = completion_logps(model, batch, gradients=False, adapters_off=True)

    def loss_of(logps, entropies):
        return grpo_loss(logps, advantages, batch["completion_mask"], old_logps, ref_logps, settings.loss_type,
                         settings.beta, settings.epsilon, settings.epsilon_high, settings.max_completion_length,
                         num_items, entropies, settings.bias_correction_kl)

    if getattr(model, "fused_update", None):  # the update block by block inside the backward (full weights)
        def head_loss(outputs):
            loss, metrics = loss_of(*logps_of(model, outputs, batch, entropy=True))
            return loss, (loss, metrics)

        return fused.loss_step(model, backbone_inputs(batch), head_loss)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        loss, metrics = loss_of(*completion_logps(model, batch, entropy=True))
        scaled = model.optimizer.scale_loss(loss)
    model.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
    return loss, metrics


class GrpoStep:
    """The training step `ZooModel.train_step` hands a batch of prompt rows to when `set_grpo` set one: every
    `num_iterations` steps it samples G completions of each prompt from the policy (`sample`), scores them
    (`score`), takes their group advantages, the sampling policy's log-probabilities (mu > 1) and the reference's
    (beta > 0: the adapters off); each step is one update on that batch (`train_step`). It runs eagerly (Python
    rewards; generation and the update trace their own functions): compile with run_eagerly=True.

    Metrics, as TRL logs them, averaged over the steps since the last reset: reward, reward_std,
    rewards/<function>/mean and /std, completions/mean_length, min_length, max_length, clipped_ratio (truncated),
    frac_reward_zero_std, the loss's figures (kl, entropy, clip_ratio/...), and tokens/s apart: generated tokens per
    second of sampling (`tokens_per_second/generation`, on the steps that sample) and completion tokens trained
    per second of update (`tokens_per_second/training`); the first step's include tracing."""

    def __init__(self, settings: Grpo, prompts, score, reward_names=(), stop_token_ids=(), pad_id=0, seed=0,
                 sampler="random", **sampler_args):
        self.settings = settings.check()
        self.prompts, self.score, self.stop_token_ids, self.pad_id = list(prompts), score, stop_token_ids, pad_id
        self.seed, self.sampler, self.sampler_args = seed, sampler, sampler_args
        names = ["reward", "reward_std", *[f"rewards/{n}/{s}" for n in reward_names for s in ("mean", "std")],
                 "completions/mean_length", "completions/min_length", "completions/max_length",
                 "completions/clipped_ratio", "frac_reward_zero_std",
                 *[n for n in METRIC_NAMES if n != "kl" or settings.beta]]
        self.metrics = [keras.metrics.Mean(name=n) for n in names]
        self.metrics += [keras.metrics.Mean(name=f"tokens_per_second/{n}") for n in ("generation", "training")]
        self.reward_names = list(reward_names)
        self._sampled, self._compiled = None, None

    def train_step(self, model, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        if not isinstance(x, dict) or "rows" not in x:
            raise ValueError("A GRPO batch is x {'rows': the prompts' indices} (recipes.grpo's batches).")
        rows = np.asarray(x["rows"]).reshape(-1)
        step = int(model.optimizer.iterations.numpy())
        self._generation_speed = None
        if self._sampled is None or step % self.settings.num_iterations == 0 or self._sampled[0] != rows.tolist():
            self._sampled = (rows.tolist(), self._sample(model, rows, step))
        batch, advantages, old, reference, figures = self._sampled[1]
        began = time.perf_counter()
        loss, metrics = self._functions(model)["update"](batch, tf.constant(advantages), old, reference)
        trained = float(tf.reduce_sum(batch["completion_mask"]))  # reading it waits for the update
        values = {**figures, **{k: float(v) for k, v in metrics.items()},
                  "tokens_per_second/training": trained / max(time.perf_counter() - began, 1e-9)}
        if self._generation_speed is not None:
            values["tokens_per_second/generation"] = self._generation_speed
        for metric in self.metrics:
            if metric.name in values:  # the generation's speed: on the steps that sample
                metric.update_state(values[metric.name])
        model._loss_tracker.update_state(loss)
        return model.get_metrics_result()

    def _functions(self, model) -> dict:
        """The step's traced functions (one trace per prompt length): the policy's and the reference's
        log-probabilities (traced with the adapters off: `zoo.lora.adapters_off` acts when a graph is traced), and
        the update. The optimizer is built first: a traced function may not create its variables later."""
        if self._compiled is None:
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            self._compiled = {
                "policy": tf.function(lambda batch: completion_logps(model, batch, gradients=False)),
                "reference": tf.function(lambda batch: completion_logps(model, batch, gradients=False,
                                                                        adapters_off=True)),
                "update": tf.function(lambda batch, advantages, old, reference: train_step(
                    model, batch, advantages, self.settings, old, reference))}
        return self._compiled

    def _sample(self, model, rows, step):
        """The step's sampled batch: (TRL's batch, advantages, old log-probabilities or None, reference
        log-probabilities or None, the figures logged)."""
        s = self.settings
        seed = int(np.random.SeedSequence([self.seed, step]).generate_state(1)[0] % 2**31)
        began = time.perf_counter()
        sampled = sample(model, [self.prompts[r] for r in rows], s, self.stop_token_ids, self.pad_id, seed,
                         self.sampler, PROMPT_MULTIPLE, **self.sampler_args)
        generation_speed = float(sampled["completion_lengths"].sum()) / max(time.perf_counter() - began, 1e-9)
        per_function, rewards = self.score(np.repeat(rows, s.num_generations), sampled)
        advantages = group_advantages(rewards, s.num_generations, s.scale_rewards)
        batch = {k: tf.constant(sampled[k]) for k in BATCH_KEYS}
        functions = self._functions(model)
        old = functions["policy"](batch) if s.num_iterations > 1 else None
        reference = functions["reference"](batch) if s.beta else None
        lengths = sampled["completion_lengths"].astype(np.float64)
        with np.errstate(invalid="ignore"):
            groups = rewards.reshape(-1, s.num_generations)
            figures = {"reward": np.nanmean(rewards), "reward_std": np.nanstd(rewards, ddof=1),
                       "completions/mean_length": lengths.mean(), "completions/min_length": lengths.min(),
                       "completions/max_length": lengths.max(),
                       "completions/clipped_ratio": sampled["truncated"].mean(),
                       "frac_reward_zero_std": np.mean(np.isclose(np.nanstd(groups, axis=1, ddof=1), 0.0)),
                       "tokens_per_second/generation": generation_speed}
            for j, name in enumerate(self.reward_names):
                figures[f"rewards/{name}/mean"] = np.nanmean(per_function[:, j])
                figures[f"rewards/{name}/std"] = np.nanstd(per_function[:, j], ddof=1)
        figures = {k: float(np.nan_to_num(v)) for k, v in figures.items()}
        self._generation_speed = figures.pop("tokens_per_second/generation")
        return batch, advantages, old, reference, figures

    def test_step(self, model, data):
        raise ValueError("GRPO has no validation pass yet: run it without validation (validation_every=0).")


def set_grpo(model, step: GrpoStep | None):
    """Make `fit` train `model`, a zoo causal LM, by GRPO (`GrpoStep`); None turns it off. Compile with
    run_eagerly=True (the step calls Python reward functions)."""
    if step is None:
        return attach_step(model, "grpo_step", None)
    needs_lm_head(model, "GRPO samples and scores completions")
    if getattr(model, "packed", False):
        raise ValueError("GRPO does not run on packed rows: call model.set_packed(False).")
    if step.settings.beta and not lora.has_lora(model):
        raise ValueError("beta > 0 takes the KL to the reference, the model with its LoRA adapters off, and this "
                         "model has no LoRA: enable LoRA (zoo.lora.enable_lora), or set beta=0.")
    return attach_step(model, "grpo_step", step)
