"""GRPO's ops as TRL's GRPOTrainer defines them (trl 1.16): the rewards' weighted sum, group-normalised advantages,
and the clipped policy loss on per-token log-probabilities with the k3 KL to a reference.

The per-token log-probabilities come from `zoo.ops.preference.token_logps` (a chunk of positions at a time: the
float32 [B, S, vocab] logits never exist); this module takes them as [B, T] tensors over the completion tokens.
Parity with TRL itself: tests/zoo/test_grpo_loss.py against tests/fixtures/grpo (tools/make_grpo_fixtures.py).

    advantages = group_advantages(weighted_rewards(rewards_per_function, weights), num_generations)
    loss, metrics = grpo_loss(logps, advantages, completion_mask, old_logps, ref_logps, "dapo", beta=0.04)
"""

import math
import warnings

import numpy as np
import tensorflow as tf

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
STD_FLOOR = 1e-4  # TRL's: advantages / (std + 1e-4)
METRIC_NAMES = ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
                "clip_ratio/low_min", "clip_ratio/high_max")


def _number(value, name, low=0.0, low_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            value <= low if low_open else value < low):
        raise ValueError(f"{name} must be a number {'>' if low_open else '>='} {low:g}, got {value!r}.")


def check_grpo(loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=None, scale_rewards="group",
               num_generations=None, max_completion_length=None):
    """A ValueError naming the setting unless these make a GRPO loss TRL defines (pure Python: recipes check their
    settings before TensorFlow runs anything)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"Unknown GRPO loss_type {loss_type!r}; known: {', '.join(LOSS_TYPES)}.")
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"Unknown scale_rewards {scale_rewards!r}; known: {', '.join(SCALE_REWARDS)}.")
    _number(beta, "beta (the KL coefficient; 0 needs no reference)")
    _number(epsilon, "epsilon (the PPO clip range)", low_open=True)
    if epsilon_high is not None:
        _number(epsilon_high, "epsilon_high (the upper clip range; None: epsilon)", low_open=True)
    if num_generations is not None and (isinstance(num_generations, bool) or not isinstance(num_generations, int)
                                        or num_generations < 2):
        raise ValueError(f"num_generations must be an integer >= 2 (GRPO normalises each reward within its group "
                         f"of completions of one prompt; one completion has no group), got {num_generations!r}.")
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' divides by max_completion_length: pass it.")
    if max_completion_length is not None and (isinstance(max_completion_length, bool)
                                              or not isinstance(max_completion_length, int)
                                              or max_completion_length < 1):
        raise ValueError(f"max_completion_length must be a positive integer, got {max_completion_length!r}.")


def weighted_rewards(rewards_per_function, weights=None) -> np.ndarray:
    """float32 [N]: the weighted sum over reward functions of [N, F] rewards in which NaN stands for a function's
    None (TRL's `nansum`: a None is skipped); a row every function left None is NaN (unscorable)."""
    rewards = np.asarray(rewards_per_function, np.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards_per_function must be [completions, functions]; got shape {rewards.shape}.")
    weights = np.ones(rewards.shape[1], np.float32) if weights is None else np.asarray(weights, np.float32)
    if weights.shape != (rewards.shape[1],):
        raise ValueError(f"{len(weights)} reward weights for {rewards.shape[1]} reward functions: give one each.")
    total = np.nansum(rewards * weights[None, :], axis=1).astype(np.float32)
    total[np.isnan(rewards).all(axis=1)] = np.nan
    return total


def _nanstd(x, axis=None):
    """TRL's `nanstd`: the unbiased (n - 1) standard deviation of the non-NaN entries."""
    count = np.sum(~np.isnan(x), axis=axis, keepdims=axis is not None)
    mean = np.nanmean(x, axis=axis, keepdims=axis is not None)
    variance = np.nansum((x - mean) ** 2, axis=axis, keepdims=axis is not None) / (count - 1)
    return np.sqrt(variance)


def group_advantages(rewards, num_generations, scale_rewards="group") -> np.ndarray:
    """float32 [N]: each completion's reward less its group's mean, divided by the std (+1e-4) of its group
    ("group"), of the whole batch ("batch"), or not ("none"), as TRL's `sum_then_normalize`.

    Args:
        rewards: [N] weighted rewards, the G completions of each prompt consecutive (N = prompts x G); NaN marks an
            unscorable completion, left out of its group's mean and std, whose advantage is 0.
        num_generations: G >= 2.
        scale_rewards: one of SCALE_REWARDS.
    """
    check_grpo(scale_rewards=scale_rewards, num_generations=num_generations)
    rewards = np.asarray(rewards, np.float32)
    if rewards.ndim != 1 or rewards.size % num_generations:
        raise ValueError(f"{rewards.size} rewards do not make groups of {num_generations} (num_generations): give "
                         "each prompt's completions, consecutive.")
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN group's mean: its advantages become 0
        groups = rewards.reshape(-1, num_generations)
        mean = np.repeat(np.nanmean(groups, axis=1), num_generations)
        advantages = rewards - mean
        if scale_rewards == "group":
            advantages = advantages / (np.repeat(_nanstd(groups, axis=1), num_generations) + STD_FLOOR)
        elif scale_rewards == "batch":
            advantages = advantages / (_nanstd(rewards) + STD_FLOOR)
    return np.nan_to_num(advantages, nan=0.0).astype(np.float32)


def grpo_loss(logps, advantages, mask, old_logps=None, ref_logps=None, loss_type="dapo", beta=0.0, epsilon=0.2,
              epsilon_high=None, max_completion_length=None, num_items=None, entropies=None, bias_correction_kl=True):
    """TRL's GRPO loss (`GRPOTrainer._compute_loss`, token-level importance sampling) and its logged figures.

    With r = exp(logps - old_logps) (the importance ratio to the policy that sampled; old_logps None, mu = 1:
    the policy itself held constant, r = 1 with r's gradient), the per-token loss is
    -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta r^c k3, with k3 = exp(ref - logps) - (ref - logps) - 1
    the KL estimate to the reference and c = 1 under `bias_correction_kl` (trl 1.16's default
    `use_bias_correction_kl=True`: the unbiased reverse-KL gradient, which changes the gradient even where r = 1),
    else 0; summed over the mask and divided per `loss_type`:
      - "grpo": each completion by its own tokens, then the mean over completions;
      - "bnpo": by the batch's tokens;
      - "dr_grpo": by completions x max_completion_length;
      - "dapo": by `num_items`, the tokens of the whole generation batch (default: this batch's).

    Args:
        logps: [B, T] float32 per-token log-probabilities of the completion tokens under the policy (with gradient).
        advantages: [B] (`group_advantages`).
        mask: [B, T] 0/1, the completion tokens trained (0 after the end, and on a masked truncated completion).
        old_logps: [B, T] the sampling policy's log-probabilities (mu > 1), or None.
        ref_logps: [B, T] the reference's log-probabilities; needed when beta > 0.
        loss_type, beta, epsilon, epsilon_high, max_completion_length: TRL's settings (epsilon_high None: epsilon).
        num_items: "dapo"'s divisor (None: mask.sum()).
        entropies: [B, T] per-token entropies for the `entropy` figure, or None.
        bias_correction_kl: weigh the KL term by r (TRL's `use_bias_correction_kl`, default True).

    Returns:
        `(loss, metrics)`: the scalar loss and {name: float32 scalar} under TRL's names (METRIC_NAMES that apply:
        no `kl` at beta 0, no `entropy` without entropies).
    """
    check_grpo(loss_type, beta, epsilon, epsilon_high, max_completion_length=max_completion_length)
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    logps = tf.cast(logps, tf.float32)
    mask = tf.cast(mask, tf.float32)
    scored = mask > 0  # log-ratios outside it (padding) are set to 0 before exp: no inf * 0
    advantages = tf.cast(advantages, tf.float32)[:, None]
    old = tf.stop_gradient(logps) if old_logps is None else tf.cast(old_logps, tf.float32)
    ratio = tf.exp(tf.where(scored, logps - old, 0.0))
    clipped = tf.clip_by_value(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    per_token = -tf.minimum(ratio * advantages, clipped * advantages)
    if beta:
        if ref_logps is None:
            raise ValueError("beta > 0 adds the KL to the reference: pass ref_logps (the adapters-off or stored "
                             "reference log-probabilities), or set beta=0.")
        to_ref = tf.where(scored, tf.cast(ref_logps, tf.float32) - logps, 0.0)
        kl = tf.exp(to_ref) - to_ref - 1.0
        if bias_correction_kl:
            kl *= ratio
        per_token += beta * kl
    tokens = tf.reduce_sum(mask)
    masked = tf.reduce_sum(per_token * mask, axis=1)
    if loss_type == "grpo":
        loss = tf.reduce_mean(masked / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0))
    elif loss_type == "bnpo":
        loss = tf.reduce_sum(masked) / tf.maximum(tokens, 1.0)
    elif loss_type == "dr_grpo":
        loss = tf.reduce_sum(masked) / tf.cast(tf.shape(mask)[0] * max_completion_length, tf.float32)
    else:
        divisor = tokens if num_items is None else tf.cast(num_items, tf.float32)
        loss = tf.reduce_sum(masked) / tf.maximum(divisor, 1.0)

    def masked_mean(x):
        return tf.reduce_sum(tf.stop_gradient(x) * mask) / tf.maximum(tokens, 1.0)

    def per_completion(x, empty):  # completions with no token scored are left out, as TRL's nanmin / nanmax
        counts = tf.reduce_sum(mask, axis=1)
        return tf.where(counts > 0, tf.reduce_sum(x * mask, axis=1) / tf.maximum(counts, 1.0), empty)

    low = tf.cast((ratio < 1.0 - epsilon) & (advantages < 0), tf.float32)
    high = tf.cast((ratio > 1.0 + epsilon_high) & (advantages > 0), tf.float32)
    metrics = {}
    if beta:
        metrics["kl"] = masked_mean(kl)
    if entropies is not None:
        metrics["entropy"] = masked_mean(tf.cast(entropies, tf.float32))
    metrics.update({"clip_ratio/low_mean": masked_mean(low), "clip_ratio/high_mean": masked_mean(high),
                    "clip_ratio/region_mean": masked_mean(tf.maximum(low, high)),
                    "clip_ratio/low_min": tf.reduce_min(per_completion(low, np.inf)),
                    "clip_ratio/high_max": tf.reduce_max(per_completion(high, -np.inf))})
    return loss, {k: tf.stop_gradient(v) for k, v in metrics.items()}
