"""The attention core, softmax(QKᵀ·scale + mask) -> dropout -> ·V, in two implementations
(scale 1/√d unless given: Gemma 3 scales by query_pre_attn_scalar^-½).

`chunked_attention` (the default) never holds an s×s matrix. It walks query
chunks and, within each, key chunks with an online softmax (running max and
sum in float32; Rabe & Staats 2021). Its custom gradient saves only Q, K, V,
the output and each row's log-sum-exp, and recomputes each chunk's
probabilities in the backward pass (FlashAttention, Dao et al. 2022). A causal
core skips the key chunks above the diagonal. Grouped-query heads are handled
by reshaping queries to [.., KV heads, group, ..], never by repeating K and V.

A sliding window (`window=w`, None = global attention) lets a query at position
i see a key at position j only when |i - j| < w (and j <= i when causal): w keys,
itself included, for a causal query (transformers' `sliding_window=w` of Gemma 3,
Qwen2/3, Mistral); 2w - 1 keys for a bidirectional one (ModernBERT's
`local_attention=L` is w = L // 2 + 1). The chunked core then computes, forward
and backward, only the tiles that hold at least one such pair
(`key_chunk_range`, `tile_count`): about s·(w + chunk)/chunk² tiles instead of s²/chunk².

Packed rows (`documents=` [B, T] int: 0 = padding, 1, 2, ... = the example each token belongs to,
in contiguous runs) let a query see only keys of its own document, a run of one number (a number
that comes back after another is a new document). The chunked core then also skips the tiles that
lie wholly across documents: query chunk i needs no key before the first token of its earliest
query's document, nor (bidirectional) after the last of its latest one's, over all batch rows
(`document_key_bounds`). Documents need self-attention: queries and keys are the same positions.

`plain_attention` materialises the scores [B, H, S, T]. It is the reference the
tests compare against, and a user's fallback (`ZooModel.set_attention("plain")`).

Both draw the same dropout mask from the same seed: the mask of the tile
(query chunk i, key chunk j) is a stateless draw seeded by (seed, i, j), so a
tile is the unit of randomness in both cores. Both define a query that may
attend to no key at all (a fully padded row) to output zeros.

Shapes: query [B, S, H, D]; key/value [B, T, KV, D] with H % KV == 0; key_mask
[B, T] (True = may be attended) or None; query i sits at position
query_offset + i (a KV cache), key t at position t: a decoding query is
masked to its window like any other.
"""

from __future__ import annotations

import tensorflow as tf

from zoo.ops.dropout import replica_uniform
from zoo.ops.ordering import unfolded_zeros

CORES = ("auto", "chunked", "plain")  # "auto": chosen per call by policy and length (resolve_core)
DEFAULT_CHUNK = 512  # a [B, H, 512, 512] float32 tile: 1 MiB per batch row and head
_MASKED = -1e9  # a masked score; exp(_MASKED - m) is exactly 0 whenever a row has a real score
_NO_KEY = -5e8  # a row whose running max stays below this attended to no key


def chunk_sizes(query_length, key_length, chunk_size=None):
    """(query chunk, key chunk, query chunks, key chunks); lengths may be tensors.

    A chunk never exceeds its sequence: a short sequence is one chunk, so a
    512-token batch runs as one tile with no padding.
    """
    check_chunk_size(chunk_size, key_length)
    size = int(chunk_size or DEFAULT_CHUNK)
    query_chunk = _min(query_length, size)
    key_chunk = _min(key_length, size)
    return query_chunk, key_chunk, _ceil_div(query_length, query_chunk), _ceil_div(key_length, key_chunk)


def check_window(window):
    """A window is a positive number of positions (or None: global attention)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"Attention window must be a positive number of positions (or None for global "
                         f"attention), got {window!r}.")


def key_chunk_range(i, query_chunk, key_chunk, key_chunks, query_length, causal=False, window=None,
                    query_offset=0, key_bounds=None):
    """[start, stop) of the key chunks that query chunk i needs: those holding at least one key
    it may see. Causal: none past its last query; windowed: none wholly outside the window;
    `key_bounds` (packed rows: `document_key_bounds`' [first, stop) of the keys the chunk's
    queries may see): none wholly outside those. Arguments may be Python ints (then so is the
    result) or scalar tensors."""
    first = query_offset + i * query_chunk  # the chunk's first and last real query positions
    last = query_offset + _min(query_length, (i + 1) * query_chunk) - 1
    start, stop = 0, key_chunks
    if window is not None:
        start = _max((first - window + 1) // key_chunk, 0)
        if not causal:
            stop = _min(key_chunks, (last + window - 1) // key_chunk + 1)
    if causal:
        stop = _min(key_chunks, last // key_chunk + 1)
    if key_bounds is not None:
        start = _max(start, key_bounds[0] // key_chunk)
        stop = _min(stop, _ceil_div(key_bounds[1], key_chunk))
    return start, stop


def tile_count(query_length, key_length, chunk_size=None, causal=False, window=None, query_offset=0,
               documents=None):
    """How many (query chunk, key chunk) tiles the chunked core computes, in each of its forward
    and backward passes (Python ints in, an int out; `documents`: a packed batch's document
    numbers [B, T], as the cores take them)."""
    check_window(window)
    cq, ck, nq, nk = chunk_sizes(query_length, key_length, chunk_size)
    bounds = None
    if documents is not None:
        _check_documents(query_length, key_length, query_offset)
        bounds = [b.numpy().tolist() for b in document_key_bounds(documents, cq, nq)]
    ranges = (_chunk_keys(i, cq, ck, nk, query_length, causal, window, query_offset, bounds) for i in range(nq))
    return sum(max(stop - start, 0) for start, stop in ranges)


def _chunk_keys(i, query_chunk, key_chunk, key_chunks, query_length, causal, window, query_offset, key_bounds):
    """`key_chunk_range` of query chunk i, within packed rows' `key_bounds` ([first], [stop] per query
    chunk, or None) unless the range is statically one chunk: that tile runs as straight-line ops
    and the document mask alone keeps it exact."""
    args = (i, query_chunk, key_chunk, key_chunks, query_length, causal, window, query_offset)
    start, stop = key_chunk_range(*args)
    if key_bounds is None or (isinstance(start, int) and isinstance(stop, int) and stop - start <= 1):
        return start, stop
    return key_chunk_range(*args, key_bounds=(key_bounds[0][i], key_bounds[1][i]))


def document_spans(documents):
    """Packed rows' document numbers [B, T] (0 = padding) -> (run, first, stop), int32 [B, T]: which
    run of one number each token is in (0, 1, ... along its row: equal runs = same document), and
    the index of that run's first token and one past its last. A token's position in its document
    is its index less `first`."""
    documents = tf.cast(documents, tf.int32)
    batch, length = tf.shape(documents)[0], tf.shape(documents)[1]
    starts = tf.concat([tf.ones([batch, 1], tf.bool), documents[:, 1:] != documents[:, :-1]], axis=1)
    run = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
    ids = run + tf.range(batch)[:, None] * length  # one segment per (row, run)
    index = tf.broadcast_to(tf.range(length)[None], tf.shape(run))
    first = tf.gather(tf.math.unsorted_segment_min(index, ids, batch * length), ids)
    stop = tf.gather(tf.math.unsorted_segment_max(index, ids, batch * length), ids) + 1
    return run, first, stop


def document_key_bounds(documents, query_chunk, query_chunks):
    """Packed rows: for each query chunk, [first, stop) of the keys its queries may see: from the
    earliest first token to the latest last token (+1) of their documents, over all batch rows.
    Padding sees no key. Two int32 [query chunks] tensors."""
    _, first, stop = document_spans(documents)
    real = tf.cast(documents, tf.int32) != 0
    length = tf.shape(first)[1]
    first = _chunked(tf.where(real, first, length), query_chunk, query_chunks, fill=length)
    stop = _chunked(tf.where(real, stop, 0), query_chunk, query_chunks, fill=0)
    return tf.reduce_min(first, axis=[1, 2]), tf.reduce_max(stop, axis=[1, 2])


def _check_documents(query_length, key_length, query_offset):
    """Documents number the positions queries and keys share: self-attention without a cache."""
    if not isinstance(query_offset, int) or query_offset != 0 or (
            isinstance(query_length, int) and isinstance(key_length, int) and query_length != key_length):
        raise ValueError("Packed rows (documents=) need self-attention over one sequence: as many queries as keys "
                         f"and query_offset 0 (no key/value cache); got {query_length} queries, {key_length} keys, "
                         f"query_offset {query_offset!r}.")


def _padding_of(documents, key_mask):
    """The keys that may be attended: `key_mask`, and with documents their non-zero numbers."""
    if documents is None:
        return key_mask
    real = tf.cast(documents, tf.int32) != 0
    return real if key_mask is None else tf.logical_and(tf.cast(key_mask, tf.bool), real)


def resolve_core(core, keep_scores, key_length, chunk_size=None) -> str:
    """The core a call runs: `core`, or for "auto" the plain one (probabilities saved for the backward
    pass: the fastest) when the caller keeps its scores for the backward (`keep_scores`: training
    under "none", or one block's replay under "full" and the fused update, whose backward follows
    it at once) and the keys are one tile (a static `key_length` up to the chunk size, where the
    chunked core's memory would be no lower); else the chunked one ("selective", past one tile,
    inference). Models and the planner both ask here."""
    if core != "auto":
        return core
    one_tile = key_length is not None and key_length <= (chunk_size or DEFAULT_CHUNK)
    return "plain" if keep_scores and one_tile else "chunked"


def check_core(core):
    if core not in CORES:
        raise ValueError(f"Unknown attention core {core!r}; known cores: {', '.join(CORES)}.")


def check_chunk_size(chunk_size, key_length=None):
    """A chunk is a positive number of positions, at most the keys' length where that is known."""
    if chunk_size is None:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"Attention chunk_size must be a positive number of positions (or None), got {chunk_size!r}.")
    if isinstance(key_length, int) and chunk_size > key_length:
        raise ValueError(
            f"Attention chunk_size {chunk_size} is larger than the key sequence length {key_length}; "
            f"use a chunk size of at most {key_length}, or None to choose it from the length."
        )


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else tf.minimum(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else tf.maximum(a, b)


def _ceil_div(a, b):
    return -(-a // b)


def _length(x, axis):
    static = x.shape[axis]
    return static if static is not None else tf.shape(x)[axis]


def _loop(start, stop, body, loop_vars):
    """`tf.while_loop` over [start, stop), or the body called once where the range is statically
    one step: a sequence that is one tile (every sequence up to the chunk size) then runs as
    straight-line ops, with none of a loop's per-iteration cost or its slower tracing."""
    if isinstance(start, int) and isinstance(stop, int) and stop - start == 1:
        return body(start, *loop_vars)
    return tf.while_loop(lambda j, *_: j < stop, body, (tf.convert_to_tensor(start), *loop_vars),
                         parallel_iterations=1)


def _tile_seed(seed, i, j):
    seed = tf.random.experimental.stateless_fold_in(seed, 0)  # site 0 of the block: attention probabilities
    return tf.random.experimental.stateless_fold_in(tf.random.experimental.stateless_fold_in(seed, i), j)


def _tile_keep(seed, i, j, shape, rate):
    """The dropout keep-mask of tile (i, j), [B, H, query chunk, key chunk] (under
    tf.distribute, this replica's rows of the whole batch's mask)."""
    return replica_uniform(shape, _tile_seed(seed, i, j)) >= rate


def _allowed(key_mask, causal, query_positions, key_positions, window=None, documents=None):
    """Which (query, key) pairs may attend: [B or 1, 1, S, T] (None = all)."""
    allowed = None
    key_mask = _padding_of(documents, key_mask)
    if key_mask is not None:
        allowed = tf.cast(key_mask, tf.bool)[:, None, None, :]
    pairs = _position_rule(query_positions, key_positions, causal, window)
    if pairs is not None:
        allowed = pairs[None, None] if allowed is None else tf.logical_and(allowed, pairs[None, None])
    if documents is not None:  # [B, 1, S, T]: the same run of one document number
        run = document_spans(documents)[0]
        allowed = tf.logical_and(allowed, run[:, None, :, None] == run[:, None, None, :])
    return allowed


def _position_rule(query_positions, key_positions, causal, window):
    """[S, T]: key j is before query i (causal) and within the window (|i - j| < window); None = all."""
    offsets = query_positions[:, None] - key_positions[None, :]
    rule = offsets >= 0 if causal else None
    if window is not None:
        near = tf.abs(offsets) < window
        rule = near if rule is None else tf.logical_and(rule, near)
    return rule


def plain_attention(query, key, value, key_mask=None, causal=False, query_offset=0, rate=0.0, seed=None,
                    chunk_size=None, window=None, scale=None, keep=None, documents=None):
    """The reference core: scores, softmax and dropout mask held whole. `keep`: that mask drawn ahead
    (`attention_keep`, held by zoo.ops.dropout.Masks), instead of drawing it here; `documents`:
    packed rows' document numbers [B, T] (0 = padding; a query sees only its own document)."""
    check_window(window)
    query, key, value = (tf.convert_to_tensor(x) for x in (query, key, value))
    if documents is not None:
        _check_documents(_length(query, 1), _length(key, 1), query_offset)
    batch, num_heads, kv_heads = tf.shape(query)[0], query.shape[2], key.shape[2]
    if kv_heads != num_heads:
        key = tf.repeat(key, num_heads // kv_heads, axis=2)
        value = tf.repeat(value, num_heads // kv_heads, axis=2)
    query_length, key_length = _length(query, 1), _length(key, 1)
    scale = _scale(scale, query.shape[-1])
    scores = tf.cast(tf.einsum("bshd,bthd->bhst", query * tf.cast(scale, query.dtype), key), tf.float32)
    allowed = _allowed(key_mask, causal, query_offset + tf.range(query_length), tf.range(key_length), window,
                       documents)
    if allowed is not None:
        scores = tf.where(allowed, scores, _MASKED)
    probs = tf.cast(tf.nn.softmax(scores, axis=-1), value.dtype)
    if rate and (seed is not None or keep is not None):
        if keep is None:
            keep = attention_keep(seed, batch, num_heads, query_length, key_length, rate, chunk_size)
        probs = tf.where(keep, probs / tf.cast(1.0 - rate, probs.dtype), tf.zeros([], probs.dtype))
    out = tf.einsum("bhst,bthd->bshd", probs, value)
    if allowed is not None:  # a query with no key to attend to outputs zeros, as in the chunked core
        has_key = tf.transpose(tf.reduce_any(allowed, axis=-1), [0, 2, 1])[..., None]  # [B or 1, S, 1, 1]
        out = tf.where(has_key, out, tf.zeros([], out.dtype))
    return out


def _scale(scale, head_dim) -> float:
    """The scores' factor: `scale`, or 1/√head_dim."""
    return float(scale) if scale is not None else 1.0 / float(head_dim) ** 0.5


def attention_keep(seed, batch, heads, query_length, key_length, rate, chunk_size=None):
    """The attention dropout's keep-mask [B, H, S, T]: the chunked core's tile masks, assembled."""
    cq, ck, nq, nk = chunk_sizes(query_length, key_length, chunk_size)
    shape = tf.stack([batch, heads, cq, ck])
    tiles = tf.map_fn(lambda ij: _tile_keep(seed, ij // nk, ij % nk, shape, rate), tf.range(nq * nk),
                      fn_output_signature=tf.TensorSpec(None, tf.bool))
    tiles = tf.reshape(tiles, tf.stack([nq, nk, batch, heads, cq, ck]))
    whole = tf.reshape(tf.transpose(tiles, [2, 3, 0, 4, 1, 5]), tf.stack([batch, heads, nq * cq, nk * ck]))
    return whole[:, :, :query_length, :key_length]


def _chunked(x, size, count, fill=0):
    """[B, L, ...] -> [count, B, size, ...], padded with `fill` at the end of L. Where the shapes are static (a
    traced sequence length), no shape is read at run time: a few ops instead of ~20, and the chunked core is cut
    this way 4-6 times in each forward and backward of every layer (a step's trace is most of its first call)."""
    static = isinstance(size, int) and isinstance(count, int) and x.shape[2:].is_fully_defined()
    if not (static and x.shape[1] == count * size):
        pad = count * size - _length(x, 1)
        x = tf.pad(x, [[0, 0], [0, pad]] + [[0, 0]] * (x.shape.rank - 2), constant_values=fill)
    if static:
        x = tf.reshape(x, [-1, count, size, *x.shape[2:]])
    else:
        x = tf.reshape(x, tf.concat([[tf.shape(x)[0], count, size], tf.shape(x)[2:]], axis=0))
    return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))


class _Tiles:
    """Queries and keys cut into chunks ([chunk index, B, chunk, ...]) and each tile's
    scores, mask and dropout: what the forward and backward passes share."""

    def __init__(self, query, key, value, key_mask, causal, query_offset, rate, seed, chunk_size, window, scale,
                 documents=None):
        self.dtype = value.dtype
        self.batch, self.static_batch = tf.shape(query)[0], query.shape[0]
        self.heads, self.kv_heads, self.head_dim = query.shape[2], key.shape[2], query.shape[3]
        self.group = self.heads // self.kv_heads
        self.query_length, self.key_length = _length(query, 1), _length(key, 1)
        self.cq, self.ck, self.nq, self.nk = chunk_sizes(self.query_length, self.key_length, chunk_size)
        self.causal, self.query_offset, self.rate, self.seed = causal, query_offset, rate, seed
        self.window = window
        self.scale = _scale(scale, self.head_dim)
        grouped = tf.reshape(query, tf.stack([self.batch, self.query_length, self.kv_heads, self.group,
                                              self.head_dim]))
        self.q = self.chunks(grouped, self.cq, self.nq)  # [nq, B, cq, KV, G, D]
        self.k = self.chunks(key, self.ck, self.nk)  # [nk, B, ck, KV, D]
        self.v = self.chunks(value, self.ck, self.nk)
        key_mask = _padding_of(documents, key_mask)
        if key_mask is None:
            key_mask = tf.ones(tf.stack([self.batch, self.key_length]), tf.bool)
        self.key_mask = self.chunks(tf.cast(key_mask, tf.bool), self.ck, self.nk)  # [nk, B, ck]; padding is False
        self.query_runs = self.key_runs = self.key_bounds = None
        if documents is not None:  # packed rows: each token's run (document), and each query chunk's keys
            _check_documents(self.query_length, self.key_length, query_offset)
            run = document_spans(documents)[0]
            self.query_runs, self.key_runs = self.chunks(run, self.cq, self.nq), self.chunks(run, self.ck, self.nk)
            self.key_bounds = document_key_bounds(documents, self.cq, self.nq)

    chunks = staticmethod(_chunked)  # [B, L, ...] -> [count, B, size, ...]

    def key_chunks_for(self, i):
        """[start, stop) of the key chunks query chunk i sees (`key_chunk_range`)."""
        return _chunk_keys(i, self.cq, self.ck, self.nk, self.query_length, self.causal, self.window,
                           self.query_offset, self.key_bounds)

    def scores(self, i, j, q):
        """Masked float32 scores of tile (i, j): [B, KV, G, cq, ck]."""
        s = tf.cast(tf.einsum("bqkgd,btkd->bkgqt", q * tf.cast(self.scale, q.dtype), self.k[j]), tf.float32)
        allowed = self.key_mask[j][:, None, None, None, :]
        pairs = _position_rule(self.query_offset + i * self.cq + tf.range(self.cq), j * self.ck + tf.range(self.ck),
                               self.causal, self.window)
        if pairs is not None:
            allowed = tf.logical_and(allowed, pairs)
        if self.query_runs is not None:  # [B, 1, 1, cq, ck]: the same document
            same = self.query_runs[i][:, :, None] == self.key_runs[j][:, None, :]
            allowed = tf.logical_and(allowed, same[:, None, None])
        return tf.where(allowed, s, _MASKED)

    def dropout_scale(self, i, j, scores):
        """keep / (1 - rate) for tile (i, j) as float32 [B, KV, G, cq, ck], or None without dropout.

        Drawn after the tile's `scores`: a draw depends only on the seed and (i, j), and
        graph-mode loops (lowered to dataflow) would otherwise draw every layer's tiles
        at once, at the start of the step, and hold them until used.
        """
        if not self.rate or self.seed is None:
            return None
        shape = tf.stack([self.batch, self.heads, self.cq, self.ck])
        with tf.control_dependencies([scores]):
            keep = _tile_keep(self.seed, i, j, shape, self.rate)
        keep = tf.reshape(keep, tf.stack([self.batch, self.kv_heads, self.group, self.cq, self.ck]))
        return tf.cast(keep, tf.float32) / (1.0 - self.rate)

    def unchunk(self, x, length):
        """[count, B, size, ...] -> [B, length, ...] (static shapes: no shape read at run time, as `_chunked`)."""
        x = tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))
        if x.shape[1:].is_fully_defined():
            whole = x.shape[1] * x.shape[2]
            x = tf.reshape(x, [-1, whole, *x.shape[3:]])
            return x if isinstance(length, int) and length == whole else x[:, :length]
        shape = tf.concat([[tf.shape(x)[0], tf.shape(x)[1] * tf.shape(x)[2]], tf.shape(x)[3:]], axis=0)
        return tf.reshape(x, shape)[:, :length]


def _forward(t: _Tiles):
    """Online softmax over key chunks, per query chunk: (float32 out [B, S, H, D], lse [nq, B, KV, G, cq])."""
    stats_shape = tf.stack([t.batch, t.kv_heads, t.group, t.cq])

    def query_chunk(i, outputs, lses):
        q = t.q[i]

        def key_chunk(j, m, total, acc):
            s = t.scores(i, j, q)
            m_new = tf.maximum(m, tf.reduce_max(s, axis=-1))
            p = tf.exp(s - m_new[..., None])
            kept = total * tf.exp(m - m_new)  # the earlier keys' share, rescaled to the new max
            total = kept + tf.reduce_sum(p, axis=-1)
            # acc stays normalised (the output so far): with one key chunk, the probabilities are rounded
            # to 16 bits exactly where the plain core rounds them.
            p = p / total[..., None]
            drop = t.dropout_scale(i, j, s)
            if drop is not None:
                p = p * drop
            pv = tf.einsum("bkgqt,btkd->bkgqd", tf.cast(p, t.dtype), t.v[j])
            return j + 1, m_new, total, acc * (kept / total)[..., None] + tf.cast(pv, tf.float32)

        m0 = tf.fill(stats_shape, float("-inf"))
        acc0 = unfolded_zeros(tf.concat([stats_shape, [t.head_dim]], 0), tf.float32, q)
        _, m, total, acc = _loop(*t.key_chunks_for(i), key_chunk, (m0, tf.zeros(stats_shape, tf.float32), acc0))
        has_key = m > _NO_KEY
        out = tf.where(has_key[..., None], acc, 0.0)  # [B, KV, G, cq, D]
        lse = tf.where(has_key, m + tf.math.log(total), float("inf"))  # +inf: the backward's exp() gives 0
        out = tf.reshape(tf.transpose(out, [0, 3, 1, 2, 4]), tf.stack([t.batch, t.cq, t.heads, t.head_dim]))
        return i + 1, outputs.write(i, out), lses.write(i, lse)

    batch, cq = t.static_batch, t.cq if isinstance(t.cq, int) else None
    outputs = tf.TensorArray(tf.float32, size=t.nq, element_shape=[batch, cq, t.heads, t.head_dim])
    lses = tf.TensorArray(tf.float32, size=t.nq, element_shape=[batch, t.kv_heads, t.group, cq])
    _, outputs, lses = _loop(0, t.nq, query_chunk, (outputs, lses))
    return t.unchunk(outputs.stack(), t.query_length), lses.stack()


def _backward(t: _Tiles, out, lse, d_out):
    """Gradients of Q, K, V, recomputing each tile's probabilities from the saved lse."""
    grouped = tf.stack([t.batch, t.query_length, t.kv_heads, t.group, t.head_dim])
    d_out = tf.reshape(d_out, grouped)
    # D_i = rowsum(dO ∘ O) = rowsum(P ∘ dP): the softmax backward's per-row term, dropout included.
    d_rows = tf.reduce_sum(tf.cast(d_out, tf.float32) * tf.reshape(out, grouped), axis=-1)
    d_rows = tf.transpose(t.chunks(d_rows, t.cq, t.nq), [0, 1, 3, 4, 2])  # [nq, B, KV, G, cq]
    d_out = t.chunks(d_out, t.cq, t.nq)  # [nq, B, cq, KV, G, D]
    zeros_kv = unfolded_zeros(tf.concat([[t.nk], tf.shape(t.k)[1:]], 0), tf.float32, d_out)

    def query_chunk(i, d_queries, d_keys, d_values):
        do, lse_i, d_row = d_out[i], lse[i], d_rows[i]
        # Graph-mode loops are lowered to dataflow, which would recompute each layer's first tiles as soon
        # as its Q and K exist (during the forward pass) and hold them until the incoming gradient arrives.
        # A data dependency on that gradient (control dependencies did not hold) keeps one tile alive.
        q = t.q[i] + 0.0 * tf.cast(tf.transpose(d_row, [0, 3, 1, 2])[..., None], t.dtype)

        def key_chunk(j, d_q, d_keys, d_values):
            s = t.scores(i, j, q)
            p = tf.exp(s - lse_i[..., None])  # the forward's probabilities, exactly
            dp = tf.cast(tf.einsum("bqkgd,btkd->bkgqt", do, t.v[j]), tf.float32)
            drop = t.dropout_scale(i, j, s)
            p_dropped = p if drop is None else p * drop
            dp = dp if drop is None else dp * drop
            ds = tf.cast(p * (dp - d_row[..., None]), t.dtype)
            d_v = tf.einsum("bkgqt,bqkgd->btkd", tf.cast(p_dropped, t.dtype), do)
            d_k = tf.einsum("bkgqt,bqkgd->btkd", ds, q) * tf.cast(t.scale, t.dtype)
            d_q = d_q + tf.cast(tf.einsum("bkgqt,btkd->bqkgd", ds, t.k[j]), tf.float32) * t.scale
            d_keys = tf.tensor_scatter_nd_add(d_keys, [[j]], tf.cast(d_k, tf.float32)[None])
            d_values = tf.tensor_scatter_nd_add(d_values, [[j]], tf.cast(d_v, tf.float32)[None])
            return j + 1, d_q, d_keys, d_values

        _, d_q, d_keys, d_values = _loop(*t.key_chunks_for(i), key_chunk,
                                         (unfolded_zeros(tf.shape(q), tf.float32, q), d_keys, d_values))
        return i + 1, d_queries.write(i, tf.cast(d_q, t.dtype)), d_keys, d_values

    d_queries = tf.TensorArray(t.dtype, size=t.nq, element_shape=t.q.shape[1:])
    _, d_queries, d_keys, d_values = _loop(0, t.nq, query_chunk, (d_queries, zeros_kv, zeros_kv))
    d_query = t.unchunk(d_queries.stack(), t.query_length)
    d_query = tf.reshape(d_query, tf.stack([t.batch, t.query_length, t.heads, t.head_dim]))
    return d_query, t.unchunk(tf.cast(d_keys, t.dtype), t.key_length), t.unchunk(tf.cast(d_values, t.dtype),
                                                                                   t.key_length)


def chunked_attention(query, key, value, key_mask=None, causal=False, query_offset=0, rate=0.0, seed=None,
                      chunk_size=None, window=None, scale=None, documents=None):
    """The memory-efficient core: O(s·chunk) working memory; saves Q, K, V, output and lse.
    `documents`: packed rows' document numbers [B, T], as `plain_attention` takes them; the tiles
    wholly across documents are skipped, forward and backward."""
    check_window(window)
    query, key, value = (tf.convert_to_tensor(x) for x in (query, key, value))
    options = (key_mask, causal, query_offset, rate, seed, chunk_size, window, scale, documents)

    @tf.custom_gradient
    def core(q, k, v):
        tiles = _Tiles(q, k, v, *options)
        # The float32 output is what the backward's rowsum(dO ∘ O) needs: from a 16-bit O it would cancel
        # badly against dP. It costs 4 bytes per output element, the size of Q in float32.
        out, lse = _forward(tiles)

        def grad(d_out):
            return _backward(_Tiles(q, k, v, *options), out, lse, d_out)

        return tf.cast(out, v.dtype), grad

    return core(query, key, value)


def attention(query, key, value, core="chunked", **kwargs):
    """Dispatch to "chunked" or "plain"; the keyword arguments are the cores' own."""
    if core not in ("chunked", "plain"):
        raise ValueError(f"attention() runs a resolved core, 'chunked' or 'plain', not {core!r}.")
    return (chunked_attention if core == "chunked" else plain_attention)(query, key, value, **kwargs)
