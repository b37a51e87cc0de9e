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

import tensorflow as tf

from zoo import lora
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
