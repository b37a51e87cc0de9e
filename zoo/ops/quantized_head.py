"""The LM head from an int8 token table, a slice of the vocabulary at a time.

Keras' int8 `ReversibleEmbedding` casts its whole [vocabulary, hidden] table to the compute dtype for every
logits matmul (`_int8_call(reverse=True)`), and its gradient holds that copy until the backward: 1 GiB in
bfloat16 for llama3.1-8b's 128,256 x 4,096 head, made again in each chunk of the loss. Here each slice of at
most SLICE_BYTES is cast in its turn, in the forward and again in the backward (recomputed, as checkpointing
recomputes a block), so one slice's cast exists at a time. The arithmetic is Keras': the matmul in the compute
dtype, then the float32 logits divided by each row's scale (Keras' int8 rows are `round(row * scale)`).
"""

import tensorflow as tf

from zoo.ops.ordering import unfolded_zeros

SLICE_BYTES = 64 * 2**20  # one slice of the table in the compute dtype


def slice_rows(vocab, width, dtype_bytes) -> int:
    """Rows of the table per slice: at most SLICE_BYTES in the compute dtype, at most the vocabulary."""
    return int(max(1, min(vocab, SLICE_BYTES // (width * dtype_bytes))))


def sliceable(layer) -> bool:
    """Whether `layer` (a ReversibleEmbedding) is int8 with float inputs to its head, as zoo.quantization makes it
    (Keras' default int8 also quantizes the head's inputs, a path left to Keras)."""
    return getattr(layer, "quantization_mode", None) == "int8" and getattr(layer, "inputs_quantizer", None) is None


def int8_logits(hidden, layer):
    """Float32 logits [..., vocab] of `hidden` [..., width] against `layer`'s int8 table (tied: its embeddings
    [vocab, width]; untied: its reverse embeddings [width, vocab]), a gradient for `hidden` only (the table is
    frozen: a quantized base)."""
    tied = layer.tie_weights
    table, scale = (layer._embeddings, layer.embeddings_scale) if tied else (
        layer.reverse_embeddings, layer.reverse_embeddings_scale)
    vocab, width, dtype = layer.input_dim, layer.output_dim, tf.as_dtype(layer.compute_dtype)
    step = slice_rows(vocab, width, dtype.size)
    bounds = [(begin, min(begin + step, vocab)) for begin in range(0, vocab, step)]

    def piece(begin, end, *deps):
        """The slice's rows in the compute dtype ([rows, width] tied, [width, rows] untied), made once `deps` exist
        (else a loss's every chunk would read and cast its first slice at the step's start), and their scales."""
        with tf.control_dependencies(deps):  # the variable's read and slice too, not only the cast
            rows = table[begin:end] if tied else table[:, begin:end]
            return tf.cast(rows, dtype), tf.cast(scale[begin:end], tf.float32)

    @tf.custom_gradient
    def logits_of(h):
        flat = tf.reshape(tf.cast(h, dtype), [-1, width])
        # Several slices' logits are written into one buffer in place (its only reader is the next write): a concat
        # of the pieces would hold them all beside its output, two copies of the logits. One slice is the logits.
        logits = flat if len(bounds) == 1 else unfolded_zeros(tf.stack([tf.shape(flat)[0], vocab]), tf.float32, flat)
        for begin, end in bounds:
            rows, scales = piece(begin, end, logits)  # the first once the hidden states exist, then in turn
            part = tf.cast(tf.matmul(flat, rows, transpose_b=tied), tf.float32) / scales
            logits = part if len(bounds) == 1 else tf.raw_ops.TensorStridedSliceUpdate(
                input=logits, begin=[0, begin], end=[0, end], strides=[1, 1], value=part, begin_mask=1, end_mask=1)
        logits = tf.reshape(logits, tf.concat([tf.shape(h)[:-1], [vocab]], 0))

        def grad(d_logits, variables=None):
            d_flat = tf.reshape(tf.cast(d_logits, tf.float32), [-1, vocab])
            d_h = None
            for begin, end in bounds:
                turn = d_flat if d_h is None else d_h  # the last slice's product: one slice's copies at a time
                rows, scales = piece(begin, end, turn)
                with tf.control_dependencies([turn]):  # a column slice is a copy: else every slice's at once
                    d_part = tf.cast(d_flat[:, begin:end] / scales, dtype)
                part = tf.cast(tf.matmul(d_part, rows, transpose_b=not tied), tf.float32)
                d_h = part if d_h is None else d_h + part
            return tf.cast(tf.reshape(d_h, tf.shape(h)), h.dtype), [None] * len(variables or [])

        return logits, grad

    return logits_of(tf.convert_to_tensor(hidden))
