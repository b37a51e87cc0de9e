"""Preference-tuning ops: per-sequence log-probabilities a chunk of positions at a time, and the DPO,
IPO, robust-DPO and SimPO losses as TRL defines them.

`token_logps(hidden, head, labels)` is log p(label) at every position ([B, S]: GRPO's per-token figures), and
`sequence_logps(hidden, head, labels, weights)` its sum over the positions whose weight is 1 (a completion's
tokens), per row, without the float32 [B, S, vocab] logits ever existing whole: one chunk's [B, c, vocab] at
a time, as zoo.ops.lm_loss.chunked_lm_loss walks them. Unlike a mean loss the output is per position, and the
gradient that reaches it (from a DPO or GRPO loss) is known only in the backward:
  - a head with no trainable variables (LoRA, the DPO case PEFT trains; a frozen tied embedding): each
    chunk's d hidden is made in the forward pass, and the backward only scales it by the incoming
    [B, S] gradient (a position's hidden state reaches only that position's log-probability);
  - a trainable head: its gradient is a sum over positions weighted by that incoming gradient, which the forward
    cannot know, and per-position copies of the head's gradient would cost B x S head-sized tensors. The forward keeps
    nothing; the backward makes each chunk's logits again (one chunk at a time) and their gradients w.r.t. the
    hidden slice and the head's variables, weighted by the incoming gradient (TRL's chunked log-prob kernel
    recomputes in its backward the same way): one extra head projection.

The losses take per-sequence log-probabilities [P] (P pairs) and return `(losses [P], chosen_rewards,
rejected_rewards)` with rewards `beta * (policy - reference)` with no gradient, as TRL's DPOTrainer (trl 1.16,
`DPOTrainer._compute_loss`) and CPOTrainer (`cpo_loss`, SimPO) compute them; `preference_metrics` gives the
figures under TRL's metric names. Parity with TRL itself: tests/zoo/test_preference.py against
tests/fixtures/dpo (tools/make_dpo_fixtures.py). The one difference: IPO's per-token average divides by the
tokens scored, where trl 1.16 counts a completion's first token that nothing predicts (a completion that starts
the sequence: an empty prompt and no BOS; docs/dpo.md).
"""

import tensorflow as tf

from zoo.ops.lm_loss import chunked_inputs
from zoo.ops.ordering import after

DPO_LOSS_TYPES = ("sigmoid", "ipo", "robust")
METRIC_NAMES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                "logps/rejected")


def _entropy(logits):
    """Each position's entropy, log-sum-exp less the softmax-weighted mean logit, with no gradient: a row of the
    batch at a time where the batch is static (a row is a slice of the logits' buffer, not a copy), so that its
    [c, vocab] temporary is all the entropy adds."""
    def of(z):
        lse = tf.reduce_logsumexp(z, axis=-1)
        return lse - tf.reduce_sum(tf.exp(z - lse[..., None]) * z, axis=-1)

    z = tf.stop_gradient(logits)
    if z.shape[0] is None:
        return of(z)
    return tf.stack([of(z[b]) for b in range(z.shape[0])])


def _chunk_logps(head, h_i, labels_i, entropy=False):
    """(log p(label) [B, c] float32, the entropy of each position's distribution [B, c] or None).

    The entropy (`_entropy`) is taken before the cross-entropy, which waits for it: the cross-entropy then writes
    its [B, c, vocab] softmax gradient over the logits' buffer, their last reader, as without the entropy. A
    log-softmax and its exp of the whole chunk read beside the cross-entropy held 1.5 chunks' [B, c, vocab] more at
    the GRPO update's peak (0.37 GiB at 16 x 85 x 49152) and 3.4-6.9 more at tests/zoo/test_preference.py's shape
    (docs/grpo.md)."""
    logits = tf.cast(head(h_i), tf.float32)
    chunk_entropy = _entropy(logits) if entropy else None
    with tf.control_dependencies([chunk_entropy] if entropy else []):
        logps = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels_i, logits=logits)
    return logps, chunk_entropy


def token_logps(hidden, head, labels, chunk_size=None, gradients=True, entropy=False):
    """log p(labels) under `head(hidden)` at every position, a chunk of positions at a time (GRPO's per-token
    log-probabilities; `sequence_logps` sums them).

    Args:
        hidden: [B, S, H] normed hidden states (any float dtype), S static; position t predicts `labels[:, t]`.
        head: a callable [B, c, H] -> logits [B, c, vocab] (cast to float32 here); its trainable variables
            get gradients.
        labels: int [B, S] target ids (in the vocabulary everywhere: mask what is not scored afterwards).
        chunk_size: positions per chunk; None: `zoo.ops.lm_loss.loss_chunk`'s choice.
        gradients: False (a reference's or the sampling policy's log-probabilities) keeps nothing.
        entropy: also return each position's entropy (TRL's logged `entropy`), with no gradient.

    Returns:
        float32 [B, S], differentiable w.r.t. `hidden` and the head's variables; with `entropy`, a pair.
    """
    hidden, labels, head_variables, c = chunked_inputs(hidden, head, labels, chunk_size)
    starts = range(0, hidden.shape[1], c)

    def forward(h, tape_chunks):
        """Per-token log-probabilities (and entropies); with `tape_chunks`, each chunk's d(its log-probabilities,
        summed) / d h_i: position t's slice is d logp[b, t] / d h[b, t], since positions are independent."""
        parts, entropies, d_chunks, previous = [], [], [], ()
        for start in starts:
            h_i = after(h[:, start:start + c], *previous)
            labels_i = labels[:, start:start + c]
            if not tape_chunks:
                with tf.control_dependencies([h_i]):  # the head's weight reads wait for the chunk
                    logps, chunk_entropy = _chunk_logps(head, h_i, labels_i, entropy)
                previous = (logps,)
            else:
                with tf.GradientTape(watch_accessed_variables=False) as tape, tf.control_dependencies([h_i]):
                    tape.watch(h_i)
                    logps, chunk_entropy = _chunk_logps(head, h_i, labels_i, entropy)
                d_h = tape.gradient(logps, h_i)
                d_chunks.append(d_h)
                previous = (d_h, logps)
            parts.append(logps)
            entropies.append(chunk_entropy)
        return tf.concat(parts, axis=1), tf.concat(entropies, axis=1) if entropy else None, d_chunks

    if not gradients:
        logps, entropies, _ = forward(hidden, False)
        logps = tf.stop_gradient(logps)
        return (logps, tf.stop_gradient(entropies)) if entropy else logps

    @tf.custom_gradient
    def logps_fn(h):
        logps, entropies, d_chunks = forward(h, not head_variables)
        if entropy:  # a second output, with no gradient of its own
            logps = (logps, entropies)

        def grad(*upstream, variables=None):  # `variables`: every variable the forward read (tf.custom_gradient)
            d_tokens = tf.cast(upstream[0], tf.float32)
            if not head_variables:  # the forward made d hidden: scale each position
                d_hidden = tf.concat(d_chunks, axis=1)
                d_h = tf.cast(d_tokens[:, :, None] * tf.cast(d_hidden, tf.float32), d_hidden.dtype)
                return d_h, [None for _ in variables or []]
            d_parts, d_vars, previous = [], None, (d_tokens,)
            for start in starts:  # the chunks again, one at a time, weighted by d_tokens
                h_i = after(h[:, start:start + c], *previous)
                with tf.GradientTape(watch_accessed_variables=False) as tape, tf.control_dependencies([h_i]):
                    tape.watch(h_i)
                    tape.watch(head_variables)
                    chunk, _ = _chunk_logps(head, h_i, labels[:, start:start + c])
                    weighted = tf.reduce_sum(chunk * d_tokens[:, start:start + c])
                d_h, *grads = tape.gradient(weighted, [h_i, *head_variables], unconnected_gradients="zero")
                grads = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]
                d_vars = grads if d_vars is None else [acc + g for acc, g in zip(d_vars, grads)]
                d_parts.append(d_h)
                previous = (d_h, *d_vars)
            mine = {v.ref(): g for v, g in zip(head_variables, d_vars)}
            return tf.concat(d_parts, axis=1), [tf.cast(mine[v.ref()], v.dtype) if v.ref() in mine else None
                                                for v in variables or []]

        return logps, grad

    return logps_fn(hidden)


def sequence_logps(hidden, head, labels, weights, chunk_size=None, gradients=True):
    """Per-row sum of log p(labels) under `head(hidden)` over the positions of weight 1, a chunk at a time.

    Args:
        hidden: [B, S, H] normed hidden states (any float dtype), S static; position t predicts `labels[:, t]`
            (shift before: hidden[:, :-1] against token_ids[:, 1:]).
        head: a callable [B, c, H] -> logits [B, c, vocab] (cast to float32 here), e.g.
            `DecoderCausalLM.lm_logits`; its trainable variables get gradients.
        labels: int [B, S] target ids (any id of the vocabulary where the weight is 0).
        weights: [B, S] 0/1 (the completion's positions); other values weigh the log-probabilities.
        chunk_size: positions per chunk; None: `zoo.ops.lm_loss.loss_chunk`'s choice.
        gradients: False (a reference model's log-probabilities) makes no gradient and keeps nothing.

    Returns:
        float32 [B], differentiable w.r.t. `hidden` and the head's variables.

    Example:
    >>> hidden = model.backbone(x)["sequence_output"]
    >>> logps = sequence_logps(hidden[:, :-1], model.lm_logits, x["token_ids"][:, 1:], completion_mask[:, 1:])
    """
    logps = token_logps(hidden, head, labels, chunk_size, gradients)
    weights = tf.broadcast_to(tf.cast(weights, tf.float32), tf.shape(logps))
    return tf.reduce_sum(logps * weights, axis=1)


def check_beta(beta, name="beta"):
    """A ValueError unless `beta` is a positive number."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
        raise ValueError(f"{name} must be a positive number (DPO's usual 0.1, SimPO's 2.0), got {beta!r}.")


def check_dpo(beta, label_smoothing=0.0, loss_type="sigmoid"):
    """A ValueError naming the setting unless (beta, label_smoothing, loss_type) is a DPO loss TRL defines
    (pure Python: recipes check it when registered, before TensorFlow may run anything)."""
    check_beta(beta)
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"Unknown DPO loss_type {loss_type!r}; known: {', '.join(DPO_LOSS_TYPES)}.")
    top = 0.5 if loss_type == "robust" else 0.5 + 1e-12
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not (
            0.0 <= label_smoothing < top):
        raise ValueError(f"label_smoothing must lie in [0, 0.5{')' if loss_type == 'robust' else ']'} for "
                         f"loss_type={loss_type!r}, got {label_smoothing!r}.")
    if loss_type == "ipo" and label_smoothing:
        raise ValueError("loss_type='ipo' has no label smoothing (TRL ignores it); pass label_smoothing=0.0.")


def check_simpo(beta, gamma=1.0, label_smoothing=0.0):
    """A ValueError naming the setting unless (beta, gamma, label_smoothing) is a SimPO loss (pure Python)."""
    check_beta(beta)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or gamma < 0:
        raise ValueError(f"gamma (SimPO's target margin) must be a number >= 0, got {gamma!r}.")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not (
            0.0 <= label_smoothing <= 0.5):
        raise ValueError(f"label_smoothing must lie in [0, 0.5], got {label_smoothing!r}.")


def _lengths(lengths, which, loss_type):
    """The tokens each log-probability sums, clamped at 1 as TRL clamps them."""
    if lengths is None:
        raise ValueError(f"loss_type={loss_type!r} divides by the completion lengths: pass {which}_lengths "
                         "(the number of completion tokens scored in each sequence).")
    return tf.maximum(tf.cast(lengths, tf.float32), 1.0)


def dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta=0.1, label_smoothing=0.0,
             loss_type="sigmoid", chosen_lengths=None, rejected_lengths=None):
    """DPO's per-pair losses and rewards, as TRL's DPOTrainer computes them (`_compute_loss`, trl 1.16).

    With Δ = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected):
      - "sigmoid": -log σ(β Δ); with label_smoothing ε > 0, conservative DPO
        -(1 - ε) log σ(β Δ) - ε log σ(-β Δ) (TRL's sigmoid loss before 1.0; trl 1.16's sigmoid ignores
        label_smoothing, and uses this form for its "aot" losses);
      - "ipo": (Δ' - 1 / (2β))², where Δ' divides each log-ratio by the number of tokens it sums (TRL
        normalises IPO by the completion's tokens: the same count, except where a completion starts the
        sequence, an empty prompt with no BOS, whose first token TRL counts but nothing predicts);
        needs `chosen_lengths` and `rejected_lengths`;
      - "robust" (Robust DPO, trl 1.16's meaning of label_smoothing: the flip probability ε in [0, 0.5)):
        (-(1 - ε) log σ(β Δ) + ε log σ(-β Δ)) / (1 - 2ε).

    Args:
        policy_chosen, policy_rejected, reference_chosen, reference_rejected: [P] summed log-probabilities of
            each pair's completions (`sequence_logps`).
        beta: β > 0 (for IPO, the regulariser τ).
        label_smoothing: ε, see above (refused for "ipo", which ignores it in TRL).
        loss_type: one of DPO_LOSS_TYPES.
        chosen_lengths, rejected_lengths: [P] the completion tokens scored ("ipo"; the weights' sums).

    Returns:
        `(losses [P], chosen_rewards [P], rejected_rewards [P])`; rewards β (policy - reference), no gradient.
        TRL's loss is `losses.mean()`.
    """
    check_dpo(beta, label_smoothing, loss_type)
    chosen_ratio = tf.cast(policy_chosen, tf.float32) - tf.cast(reference_chosen, tf.float32)
    rejected_ratio = tf.cast(policy_rejected, tf.float32) - tf.cast(reference_rejected, tf.float32)
    eps = float(label_smoothing)
    if loss_type == "ipo":
        delta = (chosen_ratio / _lengths(chosen_lengths, "chosen", loss_type)
                 - rejected_ratio / _lengths(rejected_lengths, "rejected", loss_type))
        losses = (delta - 1.0 / (2.0 * beta)) ** 2
    else:
        z = beta * (chosen_ratio - rejected_ratio)
        if loss_type == "sigmoid":
            losses = -(1.0 - eps) * tf.math.log_sigmoid(z) - eps * tf.math.log_sigmoid(-z)
        else:
            losses = (-(1.0 - eps) * tf.math.log_sigmoid(z) + eps * tf.math.log_sigmoid(-z)) / (1.0 - 2.0 * eps)
    return losses, tf.stop_gradient(beta * chosen_ratio), tf.stop_gradient(beta * rejected_ratio)


def simpo_loss(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths, beta=2.0, gamma=1.0,
               label_smoothing=0.0):
    """SimPO (Meng et al. 2024, reference-free), as TRL's CPOTrainer computes it (loss_type="simpo", cpo_alpha=0):
    with the length-normalised log-probabilities a = logps / length,
    z = β (a_chosen - a_rejected) - γ, losses -(1 - ε) log σ(z) - ε log σ(-z).

    Args:
        policy_chosen, policy_rejected: [P] summed log-probabilities (`sequence_logps`).
        chosen_lengths, rejected_lengths: [P] the completion tokens scored (the weights' sums; CPOTrainer's).
        beta: β > 0 (the paper's 2.0-2.5; TRL's CPOConfig defaults to 0.1, made for CPO).
        gamma: the target reward margin γ (TRL's `simpo_gamma`, default 0.5 there; the paper's γ/β of 0.5 at
            β 2 is 1.0).
        label_smoothing: ε in [0, 0.5].

    Returns:
        `(losses [P], chosen_rewards, rejected_rewards)`; rewards β · a, no gradient (TRL's).
    """
    check_simpo(beta, gamma, label_smoothing)
    chosen = tf.cast(policy_chosen, tf.float32) / _lengths(chosen_lengths, "chosen", "simpo")
    rejected = tf.cast(policy_rejected, tf.float32) / _lengths(rejected_lengths, "rejected", "simpo")
    z = beta * (chosen - rejected) - gamma
    eps = float(label_smoothing)
    losses = -(1.0 - eps) * tf.math.log_sigmoid(z) - eps * tf.math.log_sigmoid(-z)
    return losses, tf.stop_gradient(beta * chosen), tf.stop_gradient(beta * rejected)


def preference_metrics(chosen_rewards, rejected_rewards, policy_chosen, policy_rejected) -> dict:
    """TRL's logged figures for a batch, under its names (METRIC_NAMES): the means of the rewards, of
    chosen > rejected (accuracies), of their difference (margins) and of the policy's log-probabilities
    (for SimPO, TRL's CPOTrainer logs the length-normalised ones: pass those)."""
    chosen_rewards, rejected_rewards = tf.cast(chosen_rewards, tf.float32), tf.cast(rejected_rewards, tf.float32)
    values = (chosen_rewards, rejected_rewards, tf.cast(chosen_rewards > rejected_rewards, tf.float32),
              chosen_rewards - rejected_rewards, tf.cast(policy_chosen, tf.float32),
              tf.cast(policy_rejected, tf.float32))
    return {name: tf.reduce_mean(tf.stop_gradient(v)) for name, v in zip(METRIC_NAMES, values)}
