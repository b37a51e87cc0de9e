"""A chunked causal-LM loss: the float32 [B, S, vocab] logits never exist whole.

`chunked_lm_loss(hidden, head, labels)` equals Keras' `SparseCategoricalCrossentropy(from_logits=True)`
of `head(hidden)` in value and gradients. It walks the positions a chunk at a time, and each chunk's
logits make its loss and, at once, its gradients, then are dropped; the backward pass only scales
them. Why a Python loop and why each chunk waits for the last: docs/design-notes.md (Chunked loss).
"""

import tensorflow as tf
from tensorflow.python.eager import record

from zoo.ops.ordering import after

DEFAULT_LOSS_CHUNK = 512  # positions per chunk; see loss_chunk and benchmarks/lm_loss.py
CHUNK_LOGITS_BYTES = 256 * 2**20  # a cap on one chunk's float32 logits, B * c * vocab * 4 bytes
LOGITS_COPIES = 3  # [B, c, vocab] float32 tensors alive in a chunk: logits, softmax, d logits
# With a frozen head (LoRA) no head gradient waits on d logits: measured 1.5-1.9 chunk-sized tensors at the peak of
# the loss and its d hidden (dec-1b's head, 4 x 1024, 1 x 2048 and 8 x 512, the allocator's peak over the step's).
FROZEN_HEAD_COPIES = 2
FLOAT16_SCALE = 2.0**10  # see chunked_lm_loss: float16 gradients made before the loss scale is known


def check_chunk(chunk_size):
    """A ValueError unless `chunk_size` is a positive int (None, the default, is checked by the caller)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"Loss chunk_size must be a positive number of positions, got {chunk_size!r}; pass e.g. "
                         f"chunk_size={DEFAULT_LOSS_CHUNK}, or None for the default.")


def loss_chunk(batch, seq, vocab, chunk_size=None) -> int:
    """Positions per chunk: `chunk_size`, or DEFAULT_LOSS_CHUNK lowered until one chunk's
    float32 logits fit CHUNK_LOGITS_BYTES; never more than `seq`."""
    if chunk_size is not None:
        check_chunk(chunk_size)
        return int(min(chunk_size, seq))
    by_bytes = CHUNK_LOGITS_BYTES // max(1, 4 * batch * vocab)
    return int(max(1, min(DEFAULT_LOSS_CHUNK, by_bytes, seq)))


def live_bytes(batch, seq, vocab, chunk_size=None, trainable_head=True) -> int:
    """The [B, c, vocab] float32 tensors one chunk holds at its peak."""
    copies = LOGITS_COPIES if trainable_head else FROZEN_HEAD_COPIES
    return copies * batch * loss_chunk(batch, seq, vocab, chunk_size) * vocab * 4


def _head_variables(head, hidden):
    """The trainable variables `head` reads, and its vocabulary size (a call on zero positions)."""
    with record.VariableWatcher() as watcher:
        vocab = head(hidden[:, :0]).shape[-1]
    variables = {v.ref(): v for v in watcher.watched_variables() if v.trainable}
    return list(variables.values()), vocab


def chunked_inputs(hidden, head, labels, chunk_size=None):
    """(hidden, labels, the head's trainable variables, positions per chunk) of a chunked computation
    over `head(hidden)` (the loss here, sequence log-probabilities in zoo.ops.preference), checked."""
    if chunk_size is not None:
        check_chunk(chunk_size)
    hidden = tf.convert_to_tensor(hidden)
    labels = tf.convert_to_tensor(labels)
    seq = hidden.shape[1]
    if hidden.shape.rank != 3 or labels.shape.rank != 2 or seq is None:
        raise ValueError(f"hidden must be [B, S, H] with a static S, and labels [B, S]; got {hidden.shape} "
                         f"and {labels.shape}.")
    head_variables, vocab = _head_variables(head, hidden)
    return hidden, labels, head_variables, loss_chunk(hidden.shape[0] or 1, seq, vocab, chunk_size)


def chunked_lm_loss(hidden, head, labels, chunk_size=None, sample_weight=None, on_chunk=None, gradients=True):
    """Mean token cross-entropy of `head(hidden)` against `labels`, a chunk of positions at a time.

    Args:
        hidden: [B, S, H] normed hidden states (any float dtype); S must be static.
        head: a callable [B, c, H] -> logits [B, c, vocab] (cast to float32 here), e.g.
            `DecoderCausalLM.lm_logits`; the trainable variables it reads get gradients.
        labels: int [B, S] target token ids.
        chunk_size: positions per chunk; None: `loss_chunk`'s choice.
        sample_weight: optional [B, S] (or [B, 1]) weights with Keras' "sum_over_batch_size":
            sum(loss * w) / (B * S), divided by the replicas under a tf.distribute strategy.
        on_chunk: optional `f(labels, logits, weights)` called with each chunk's [B, c] labels,
            float32 [B, c, vocab] logits and [B, c] weights (or None), e.g. to update metrics; the
            tensors it returns are done before the next chunk starts.
        gradients: False (evaluation) makes each chunk's loss only, with no gradient.

    Returns:
        A float32 scalar, differentiable w.r.t. `hidden` and the head's variables.

    Example:
    >>> loss = chunked_lm_loss(backbone(x)["sequence_output"], model.lm_logits, y, chunk_size=256)
    """
    hidden, labels, head_variables, c = chunked_inputs(hidden, head, labels, chunk_size)
    seq = hidden.shape[1]
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    scale = tf.math.divide_no_nan(1.0, tf.cast(tf.shape(hidden)[0] * seq * replicas, tf.float32))
    weights = None
    if sample_weight is not None:
        weights = tf.cast(sample_weight, tf.float32)
        if weights.shape.rank == 1:  # one weight per row, as Keras' losses take it
            weights = weights[:, None]
        weights = tf.broadcast_to(weights, tf.shape(labels))

    if not gradients:  # evaluation: the same chunks, one after another, and no gradient made
        total, previous = tf.constant(0.0), ()
        for start in range(0, seq, c):
            h_i = after(hidden[:, start:start + c], *previous)
            logits = tf.cast(head(h_i), tf.float32)
            labels_i = labels[:, start:start + c]
            weights_i = None if weights is None else weights[:, start:start + c]
            per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels_i, logits=logits)
            total += tf.reduce_sum(per if weights_i is None else per * weights_i)
            seen = tuple(on_chunk(labels_i, logits, weights_i) or ()) if on_chunk is not None else ()
            previous = (total, *seen)
        return total * scale

    # The chunks' gradients are made in the forward pass, before Keras' loss scale is known. In
    # float16, d hidden of a mean over B·S positions would underflow there: it is made for a loss
    # scaled by FLOAT16_SCALE, and the backward divides it out (in float32).
    inner = FLOAT16_SCALE if hidden.dtype == tf.float16 else 1.0

    @tf.custom_gradient
    def loss_fn(h):
        total, d_chunks, d_vars = tf.constant(0.0), [], None  # the first chunk's gradients start the sums
        previous = ()
        for start in range(0, seq, c):
            h_i = after(h[:, start:start + c], *previous)
            # The head's weight reads (and casts) wait for the chunk too, or every chunk's would be made at once.
            with tf.GradientTape(watch_accessed_variables=False) as tape, tf.control_dependencies([h_i]):
                tape.watch(h_i)
                tape.watch(head_variables)
                logits = tf.cast(head(h_i), tf.float32)
                labels_i = labels[:, start:start + c]
                weights_i = None if weights is None else weights[:, start:start + c]
                per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels_i, logits=logits)
                chunk = tf.reduce_sum(per if weights_i is None else per * weights_i)
                scaled = chunk * (scale * inner)
            d_h, *grads = tape.gradient(scaled, [h_i, *head_variables], unconnected_gradients="zero")
            seen = tuple(on_chunk(labels_i, logits, weights_i) or ()) if on_chunk is not None else ()
            grads = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]
            d_vars = grads if d_vars is None else [acc + g for acc, g in zip(d_vars, grads)]
            total += chunk
            d_chunks.append(d_h)
            previous = (d_h, total, *d_vars, *seen)  # the next chunk starts once this one is done
        d_hidden = tf.concat(d_chunks, axis=1)

        def grad(d_loss, variables=None):  # `variables`: every variable the forward read (tf.custom_gradient)
            d_loss = tf.cast(d_loss, tf.float32) / inner
            mine = {v.ref(): g for v, g in zip(head_variables, d_vars)}
            d_h = tf.cast(d_loss * tf.cast(d_hidden, tf.float32), d_hidden.dtype)
            return d_h, [tf.cast(d_loss * mine[v.ref()], v.dtype) if v.ref() in mine else None
                         for v in variables or []]

        return total * scale, grad

    return loss_fn(hidden)
