"""A chunked causal-LM loss: the float32 [B, S, vocab] logits never exist whole.

`chunked_lm_loss(hidden, head, labels)` equals Keras' `SparseCategoricalCrossentropy(from_logits=True)`
of `head(hidden)` in value and gradients. It walks the positions a chunk at a time, and each chunk's
logits make its loss and, at once, its gradients, then are dropped; the backward pass only scales
them. Why a Python loop and why each chunk waits for the last: docs/design-notes.md (Chunked loss).
"""

import tensorflow as tf
from tensorflow.python.eager import record

from zoo.ops.ordering import after, unfolded_zeros

DEFAULT_LOSS_CHUNK = 512  # positions per chunk; see loss_chunk and benchmarks/lm_loss.py
CHUNK_LOGITS_BYTES = 256 * 2**20  # a cap on one chunk's float32 logits, B * c * vocab * 4 bytes
LOGITS_COPIES = 3  # [B, c, vocab] float32 tensors alive in a chunk: logits, softmax, d logits
# With a frozen head (LoRA) no head gradient waits on d logits: measured 1.5-1.9 chunk-sized tensors at the peak of
# the loss and its d hidden (dec-1b's head, 4 x 1024, 1 x 2048 and 8 x 512, the allocator's peak over the step's).
FROZEN_HEAD_COPIES = 2
FLOAT16_SCALE = 2.0**10  # see chunked_lm_loss: float16 gradients made before the loss scale is known
# trained_only: the fine chunks are at most 1/TRAINED_CHUNKS of the sequence, so that the head runs on at most that
# fraction of the positions beyond the trained ones; more chunks add a head call each (HEAD_CALL_POSITIONS).
TRAINED_CHUNKS = 8
# What a head call costs beyond its positions, as positions of head work (the table's cast, and with a trained
# head its gradient's cast and sum): measured 29 with LoRA and 24 fully trained (qwen2.5-0.5b's tied head,
# mixed_bfloat16, batch 1 x 512 every position trained: 8 calls against 2; 2 AVX-512 cores, contended). It picks
# trained_only's chunks (`_TrainedFirst.fine_is_cheaper`); set above the measure, so that the fine chunks are
# taken only where they cost less on any machine whose fixed cost is below it.
HEAD_CALL_POSITIONS = 128


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


def trained_first(weights):
    """(order, rank, count) that move the positions of non-zero weight to the front, in their order.

    `weights` [B, S]; positions are numbered row-major (p = b * S + s). `order[j]` is the position at slot j
    (trained positions first), `rank[p]` the slot of position p (its inverse), `count` how many are trained.
    Cumulative sums and a permutation's inverse: static shapes, so tf.function, XLA and tf.distribute trace it
    once. (TRL's `chunked_nll` drops untrained positions with a boolean index, a shape that changes every batch;
    its XLA variant, trl PR #6314, orders them trained-first with an argsort and runs the chunks that hold any.)"""
    trained = tf.reshape(tf.not_equal(weights, 0), [-1])
    ones = tf.cast(trained, tf.int32)
    count = tf.reduce_sum(ones)
    rank = tf.where(trained, tf.cumsum(ones, exclusive=True), count + tf.cumsum(1 - ones, exclusive=True))
    return tf.math.invert_permutation(rank), rank, count


def trained_chunk(seq, chunk_size) -> int:
    """Positions per row of the fine chunks when the trained positions are moved to the front: at most
    `chunk_size` and at most 1/TRAINED_CHUNKS of the sequence, so that the head runs on at most one chunk beyond
    the last trained position (B x this many positions: 1/TRAINED_CHUNKS of the batch)."""
    return max(1, min(chunk_size, -(-seq // TRAINED_CHUNKS)))


class _TrainedFirst:
    """A [B, S, ...] tensor's positions reordered trained-first (`trained_first`), laid out again as
    [B, S, ...] so that slot j sits at [j % B, j // B]: a chunk of c positions per row ([:, s:s + c]) holds
    slots s * B to (s + c) * B, so chunks past the trained count can be skipped whole."""

    def __init__(self, weights, seq):
        self.order, self.rank, self.count = trained_first(weights)
        self.seq, self.batch = seq, tf.shape(weights)[0]

    def gather(self, x):
        flat = tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))
        slots = tf.reshape(tf.gather(flat, self.order), tf.concat([[self.seq, -1], tf.shape(x)[2:]], 0))
        return tf.transpose(slots, [1, 0, *range(2, x.shape.rank)])  # [S, B, ...] -> [B, S, ...]

    def scatter(self, x):
        """The inverse of `gather`: values at the slots -> values at the positions."""
        slots = tf.transpose(x, [1, 0, *range(2, x.shape.rank)])
        flat = tf.reshape(slots, tf.concat([[-1], tf.shape(x)[2:]], 0))
        return tf.reshape(tf.gather(flat, self.rank), tf.shape(x))

    def needed(self, start):
        """Whether the chunk starting at column `start` holds a trained slot."""
        return start * self.batch < self.count

    def fine_is_cheaper(self, fine, coarse):
        """Whether chunks of `fine` columns cost less than chunks of `coarse` on this batch's trained slots:
        each run chunk costs HEAD_CALL_POSITIONS plus its positions. Fewer, larger chunks win where most slots
        are trained (the coarse chunks are the every-position loss's, so trained_only never runs more head
        calls nor more positions than it), fine ones where a chunk of `coarse` would be mostly untrained."""
        columns = -(-self.count // self.batch)

        def cost(c):
            chunks = tf.maximum(1, -(-columns // c))  # the first chunk always runs
            return chunks * HEAD_CALL_POSITIONS + self.batch * tf.minimum(chunks * c, self.seq)

        return cost(fine) <= cost(coarse)


def _weights(sample_weight, labels):
    """[B, S] float32 weights of Keras' forms ([B, S], [B, 1], [B]), or None; a clear error for other shapes."""
    if sample_weight is None:
        return None
    weights = tf.cast(sample_weight, tf.float32)
    if weights.shape.rank == 1:  # one weight per row, as Keras' losses take it
        weights = weights[:, None]
    static = labels.shape
    if weights.shape.rank != 2 or any(w not in (None, 1, n) and n is not None for w, n in zip(weights.shape, static)):
        raise ValueError(f"sample_weight must be [B, S] like the labels ({static}), [B, 1] or [B]; got "
                         f"{sample_weight.shape}. Pass one weight per label position (0 where nothing is trained).")
    return tf.broadcast_to(weights, tf.shape(labels))


def chunked_lm_loss(hidden, head, labels, chunk_size=None, sample_weight=None, on_chunk=None, gradients=True,
                    trained_only=True):
    """Mean token cross-entropy of `head(hidden)` against `labels`, a chunk of positions at a time.

    Args:
        hidden: [B, S, H] normed hidden states (any float dtype); S must be static.
        head: a callable [B, c, H] -> logits [B, c, vocab] (cast to float32 here), e.g.
            `DecoderCausalLM.lm_logits`; the trainable variables it reads get gradients.
        labels: int [B, S] target token ids.
        chunk_size: positions per chunk; None: `loss_chunk`'s choice.
        sample_weight: optional [B, S] (or [B, 1], [B]) weights with Keras' "sum_over_batch_size":
            sum(loss * w) / (B * S), divided by the replicas under a tf.distribute strategy.
        on_chunk: optional `f(labels, logits, weights)` called with each chunk's [B, c] labels,
            float32 [B, c, vocab] logits and [B, c] weights (or None), e.g. to update metrics; the
            tensors it returns are done before the next chunk starts.
        gradients: False (evaluation) makes each chunk's loss only, with no gradient.
        trained_only: with `sample_weight`, the head runs only where the weight is not 0 (a chat's
            assistant tokens: prompt, system and padding positions are dropped before the head): the
            positions are reordered trained-first and the chunks past the last trained one are skipped
            (`trained_first`), in fine chunks or in the every-position loss's, whichever costs less for the
            batch (`_TrainedFirst.fine_is_cheaper`). Same loss and gradients: the skipped terms are multiplied
            by 0. False: every position, as without weights.

    Returns:
        A float32 scalar, differentiable w.r.t. `hidden` and the head's variables.

    Example:
    >>> loss = chunked_lm_loss(backbone(x)["sequence_output"], model.lm_logits, y, chunk_size=256)
    """
    hidden, labels, head_variables, c = chunked_inputs(hidden, head, labels, chunk_size)
    seq = hidden.shape[1]
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    scale = tf.math.divide_no_nan(1.0, tf.cast(tf.shape(hidden)[0] * seq * replicas, tf.float32))
    weights = _weights(sample_weight, labels)
    reordered = None
    if weights is not None and trained_only:
        reordered = _TrainedFirst(weights, seq)
        labels, weights = reordered.gather(labels), reordered.gather(weights)

    def in_slots(h):
        return h if reordered is None else reordered.gather(h)

    def pieces(start, c):
        return labels[:, start:start + c], None if weights is None else weights[:, start:start + c]

    def in_turn(start, run, skip, state):
        """`run(state)`, or where the chunk holds no trained slot `skip(state)` (a cond: nothing computed)."""
        if reordered is None or start == 0:  # the first chunk always runs: it starts the accumulators
            return run(state)
        return tf.cond(reordered.needed(start), lambda: run(state), lambda: skip(state))

    def by_plan(walk):
        """`walk(c)` over chunks of c positions a row. Trained-first, a cond picks the fine chunks
        (`trained_chunk`) or the every-position loss's, whichever `fine_is_cheaper` says for this batch."""
        fine = c if reordered is None else trained_chunk(seq, c)
        if fine == c:
            return walk(c)
        return tf.cond(reordered.fine_is_cheaper(fine, c), lambda: walk(fine), lambda: walk(c))

    def metrics_done(total, labels_i, logits, weights_i):
        seen = tuple(on_chunk(labels_i, logits, weights_i) or ()) if on_chunk is not None else ()
        return after(total, *seen)  # the next chunk (which waits for the total) starts once they are done

    if not gradients:  # evaluation: the same chunks, one after another, and no gradient made
        slots = in_slots(hidden)

        def evaluate(c):
            total = tf.constant(0.0)
            for start in range(0, seq, c):
                def run(total, start=start):
                    h_i = after(slots[:, start:start + c], total)
                    labels_i, weights_i = pieces(start, c)
                    logits = tf.cast(head(h_i), tf.float32)
                    per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels_i, logits=logits)
                    total += tf.reduce_sum(per if weights_i is None else per * weights_i)
                    return metrics_done(total, labels_i, logits, weights_i)

                total = in_turn(start, run, lambda total: total, total)
            return total

        return by_plan(evaluate) * scale

    # The chunks' gradients are made in the forward pass, before Keras' loss scale is known. In
    # float16, d hidden of a mean over B·S positions would underflow there: it is made for a loss
    # scaled by FLOAT16_SCALE, and the backward divides it out (in float32).
    inner = FLOAT16_SCALE if hidden.dtype == tf.float16 else 1.0

    @tf.custom_gradient
    def loss_fn(h):
        h = in_slots(h)  # d hidden is made here in the slots' order and put back in place below

        def train(c):
            """(total, d hidden in the slots' order, the head's gradients) over chunks of c positions a row."""
            state = (tf.constant(0.0), None, [])  # the first chunk's gradients start the sums of the head's
            d_chunks = []
            for start in range(0, seq, c):
                def run(state, start=start):
                    total, previous_d_h, d_vars = state
                    h_i = after(h[:, start:start + c], total, *([] if previous_d_h is None else [previous_d_h]),
                                *d_vars)
                    labels_i, weights_i = pieces(start, c)
                    # The head's weight reads (and casts) wait for the chunk too, or every chunk's would be made
                    # at once.
                    with tf.GradientTape(watch_accessed_variables=False) as tape, tf.control_dependencies([h_i]):
                        tape.watch(h_i)
                        tape.watch(head_variables)
                        logits = tf.cast(head(h_i), tf.float32)
                        per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels_i, logits=logits)
                        chunk = tf.reduce_sum(per if weights_i is None else per * weights_i)
                        scaled = chunk * (scale * inner)
                    d_h, *grads = tape.gradient(scaled, [h_i, *head_variables], unconnected_gradients="zero")
                    grads = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]
                    d_vars = grads if not d_vars else [acc + g for acc, g in zip(d_vars, grads)]
                    return metrics_done(total + chunk, labels_i, logits, weights_i), d_h, d_vars

                def skip(state, start=start):
                    total, _, d_vars = state
                    h_i = h[:, start:start + c]
                    return total, unfolded_zeros(tf.shape(h_i), h_i.dtype, total), d_vars

                state = in_turn(start, run, skip, state)
                d_chunks.append(state[1])
            total, _, d_vars = state
            return total, tf.concat(d_chunks, axis=1), d_vars

        total, d_hidden, d_vars = by_plan(train)
        if reordered is not None:
            d_hidden = reordered.scatter(d_hidden)  # back to the positions (those never trained get 0)

        def grad(d_loss, variables=None):  # `variables`: every variable the forward read (tf.custom_gradient)
            d_loss = tf.cast(d_loss, tf.float32) / inner
            mine = {v.ref(): g for v, g in zip(head_variables, d_vars)}
            d_h = tf.cast(d_loss * tf.cast(d_hidden, tf.float32), d_hidden.dtype)
            return d_h, [tf.cast(d_loss * mine[v.ref()], v.dtype) if v.ref() in mine else None
                         for v in variables or []]

        return total * scale, grad

    return loss_fn(hidden)
