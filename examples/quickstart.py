"""Build enc-base with gradient checkpointing, train a few masked-LM steps on
generated tokens, and print the loss, the planner's estimate of the peak memory
and the peak memory measured: the same quantity, TensorFlow's allocator peak
from before the model is built (weights, AdamW's state, gradients, activations,
logits and TensorFlow's own overhead), as benchmarks/planner.py compares them.

    python examples/quickstart.py [--steps 5] [--batch-size 4] [--sequence-length 128]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import zoo
from zoo import memory


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="enc-base")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--checkpointing", default="full")
    args = parser.parse_args()
    b, s = args.batch_size, args.sequence_length

    tf.config.experimental.reset_memory_stats("CPU:0")
    start = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model = zoo.get(args.model, checkpointing=args.checkpointing, task="masked_lm")
    print(f"{args.model}: {model.count_params() / 1e6:.1f}M parameters, checkpointing={model.checkpointing}")
    est = memory.estimate(args.model, b, s, "float32", args.checkpointing, task="masked_lm", optimizer="adamw")
    print(f"estimated peak memory (zoo.memory.estimate, all of training): {est.total / memory.GiB:.2f} GiB")

    rng = np.random.default_rng(0)
    n = b * args.steps
    masked = int(s * memory.MASKED_FRACTION)  # BERT masks 15% of the positions: where the loss is taken
    x = {
        "token_ids": rng.integers(1000, model.spec.vocab_size, (n, s), dtype="int32"),
        "segment_ids": np.zeros((n, s), "int32"),
        "padding_mask": np.ones((n, s), "int32"),
        "mask_positions": np.sort(rng.choice(s, (n, masked)), axis=1).astype("int32"),
    }
    y = np.take_along_axis(x["token_ids"], x["mask_positions"], axis=1)
    x["token_ids"][np.arange(n)[:, None], x["mask_positions"]] = 103  # [MASK]

    model.compile(  # the recipes' optimizer setup: AdamW, clipped by the global norm
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.01, global_clipnorm=1.0),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
    )
    history = model.fit(x, {"logits": y}, batch_size=b, epochs=1, verbose=2)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - start
    print(f"loss after {args.steps} steps: {history.history['loss'][-1]:.4f}")
    print(f"measured peak memory (TF allocator, all of training): {peak / memory.GiB:.2f} GiB "
          f"({est.total / peak:.2f}x estimated/measured)")


if __name__ == "__main__":
    main()
