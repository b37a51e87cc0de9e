"""A position-wise function (a block's MLP) over chunks of positions, each recomputed in the backward.

Under "full" a block's replay records its whole forward before its backward starts, so a long sequence's MLP
intermediates ([B, S, intermediate]: gate, up, their activation and product, and TensorFlow's float32 copies of
them) are all alive at once: ~17 bytes per entry measured (docs/memory.md, the context ladder), 7.5 GiB for
llama3.1-8b's 14,336 at 32K positions, nearly as much as all 32 blocks' held inputs (8 GiB). The MLP is
position-wise, so `in_position_chunks(fn, x, chunk)` runs it a chunk of positions at a time and keeps only `x` for
its backward, which recomputes each chunk and makes its gradients at once: a chunk's intermediates instead of the
sequence's (Arctic Long Sequence Training's TiledMLP; Unsloth's tiled MLP). Each chunk waits for the last
(`after`), as the chunked loss's do (docs/design-notes.md, Chunked loss), or TensorFlow's executor would run them
side by side. The price is one more forward of the MLP per block in the backward.
"""

import tensorflow as tf
from tensorflow.python.eager import record

from zoo.ops.ordering import after

# A cap on one chunk's [chunk, width] float32 tensor per batch row (width: the MLP's intermediate size), per row so
# that the chunks are the same whether or not a traced batch size is known. Below it the MLP runs whole, as before:
# llama3.1-8b (14,336) is chunked past 2,340 positions, llama3.2-3b (8,192) past 4,096, dec-1b (5,632) past 5,957.
CHUNK_BYTES = 128 * 2**20


def position_chunk(seq, width, chunk_size=None) -> int:
    """Positions per chunk for [seq, width] float32 intermediates a row: `chunk_size`, or the fewest equal chunks
    that keep one chunk's within CHUNK_BYTES; never more than `seq` (one chunk: no chunking)."""
    if chunk_size is None:
        most = max(1, CHUNK_BYTES // max(1, 4 * width))
        chunk_size = -(-seq // -(-seq // most))  # seq split evenly: 2,048 in chunks of at most 1,771 is 2 x 1,024
    return int(max(1, min(chunk_size, seq)))


def in_position_chunks(fn, x, chunk):
    """`fn(x)` for a position-wise `fn` ([B, S, ...] -> [B, S, ...], each position on its own), `chunk` positions
    at a time, with gradients equal to `fn(x)`'s for `x` and every trainable variable `fn` reads. S must be static.
    `chunk` >= S: a plain call."""
    seq = x.shape[1]
    if seq is None or chunk >= seq:
        return fn(x)
    starts = range(0, seq, chunk)

    @tf.custom_gradient
    def chunked(x):
        with record.VariableWatcher() as watcher:  # what the first chunk reads, every chunk reads
            outputs = [fn(x[:, :chunk])]
        fn_variables = list({v.ref(): v for v in watcher.watched_variables() if v.trainable}.values())
        for start in starts[1:]:
            x_i = after(x[:, start:start + chunk], outputs[-1])  # waits for the chunk before
            with tf.control_dependencies([x_i]):  # and so do its variables' reads (an int4 kernel dequantized)
                outputs.append(fn(x_i))

        def grad(d_y, variables=None):  # `variables`: every variable the forward read (tf.custom_gradient)
            d_x, d_vars = [], []
            for start in starts:
                x_i = after(x[:, start:start + chunk], *d_x[-1:], *d_vars)
                with tf.GradientTape(watch_accessed_variables=False) as tape, tf.control_dependencies([x_i]):
                    tape.watch(x_i)
                    tape.watch(fn_variables)
                    y_i = fn(x_i)
                d_x_i, *grads = tape.gradient(y_i, [x_i, *fn_variables], output_gradients=d_y[:, start:start + chunk],
                                              unconnected_gradients="zero")
                grads = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]
                d_vars = grads if not d_vars else [total + g for total, g in zip(d_vars, grads)]
                d_x.append(d_x_i)
            mine = {v.ref(): g for v, g in zip(fn_variables, d_vars)}
            return tf.concat(d_x, axis=1), [tf.cast(mine[v.ref()], v.dtype) if v.ref() in mine else None
                                            for v in variables or []]

        return tf.concat(outputs, axis=1), grad

    return chunked(x)
