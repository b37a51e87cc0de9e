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

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from zoo import lora
from zoo.generation import _generate_ids
from zoo.ops.grpo import check_grpo, grpo_loss
from zoo.ops.preference import token_logps

BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


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
    prompt_length = batch["prompt_ids"].shape[1]
    token_ids = tf.concat([tf.cast(batch["prompt_ids"], tf.int32), tf.cast(batch["completion_ids"], tf.int32)], 1)
    padding_mask = tf.concat([tf.cast(batch["prompt_mask"], tf.int32), tf.cast(batch["completion_mask"], tf.int32)],
                             1)

    def score():
        hidden = model.backbone({"token_ids": token_ids, "padding_mask": padding_mask},
                                training=training)["sequence_output"]
        chunk = model.loss_chunk or None  # 0 (whole logits for the LM loss) has no meaning here
        return token_logps(hidden[:, prompt_length - 1:-1], model.lm_logits, token_ids[:, prompt_length:], chunk,
                           gradients, entropy)

    if adapters_off:
        with lora.adapters_off(model):
            return score()
    return score()


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
           **sampler_args) -> dict:
    """G completions of each prompt from the policy (zoo.generation's key/value cache), in TRL's batch layout.

    Args:
        model: a zoo causal LM.
        prompts: token-id rows (a chat prompt: `Chat.prompt_ids`, with its generation prompt).
        settings: `Grpo` (num_generations, max_completion_length, mask_truncated_completions).
        stop_token_ids: the template's end-of-turn and eos tokens (`Chat.stop_ids`): a completion ends after one.
        pad_id: the id padding takes (masked out; any id of the vocabulary).
        seed, sampler, **sampler_args: zoo.generation's (TRL samples the whole softmax: "random", temperature 1).

    Returns:
        {"prompt_ids", "prompt_mask"} [N, P] (left-padded), {"completion_ids", "completion_mask"} [N, T] with
        T = max_completion_length (right-padded; mask 1 on the tokens generated, the stop token included, and 0 on
        a truncated completion when `mask_truncated_completions`), "truncated" [N] bool (no stop token within the
        limit), "completion_lengths" [N]; N = prompts x G, each prompt's completions consecutive.
    """
    g, limit = settings.num_generations, settings.max_completion_length
    rows = [np.asarray(p, np.int32).reshape(-1) for p in prompts for _ in range(g)]
    out, ends = _generate_ids(model, rows, limit, sampler, seed, True, list(stop_token_ids), True, False,
                              sampler_args)
    longest = max(len(r) for r in rows)
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
    log-probabilities (beta > 0) are `ref_logps`, or the model with its adapters off, scored here.

    Returns:
        `(loss, metrics)` as grpo_loss's, float32 scalars.
    """
    if settings.beta and ref_logps is None:
        ref_logps = completion_logps(model, batch, gradients=False, adapters_off=True)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        logps, entropies = completion_logps(model, batch, entropy=True)
        loss, metrics = grpo_loss(logps, advantages, batch["completion_mask"], old_logps, ref_logps,
                                  settings.loss_type, settings.beta, settings.epsilon, settings.epsilon_high,
                                  settings.max_completion_length, num_items, entropies, settings.bias_correction_kl)
        scaled = model.optimizer.scale_loss(loss)
    model.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
    return loss, metrics
