"""Build enc-base with gradient checkpointing, train a few masked-LM steps on
generated tokens, and print the loss and the step's peak memory.

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

    model = zoo.get(args.model, checkpointing=args.checkpointing, task="masked_lm")
    print(f"{args.model}: {model.count_params() / 1e6:.1f}M parameters, checkpointing={model.checkpointing}")
    est = memory.estimate(args.model, b, s, "float32", args.checkpointing, task="masked_lm")
    step_estimate = est.gradients + est.activations + est.logits
    print(f"estimated: {est.total / memory.GiB:.2f} GiB in all, of which the step itself (gradients, "
          f"activations, logits) {step_estimate / memory.GiB:.2f} GiB above weights and Adam")

    rng = np.random.default_rng(0)
    n = b * args.steps
    masked = s // 8  # one position in eight (12.5%; BERT masks 15%): where the loss is taken
    x = {
        "token_ids": rng.integers(1000, model.spec.vocab_size, (n, s), dtype="int32"),
        "segment_ids": np.zeros((n, s), "int32"),
        "padding_mask": np.ones((n, s), "int32"),
        "mask_positions": np.sort(rng.choice(s, (n, masked)), axis=1).astype("int32"),
    }
    y = np.take_along_axis(x["token_ids"], x["mask_positions"], axis=1)
    x["token_ids"][np.arange(n)[:, None], x["mask_positions"]] = 103  # [MASK]

    model.compile(
        optimizer=keras.optimizers.Adam(1e-4, clipnorm=1.0),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
    )
    model.optimizer.build(model.trainable_variables)  # so the baseline holds Adam's slots too
    tf.config.experimental.reset_memory_stats("CPU:0")
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]
    history = model.fit(x, {"logits": y}, batch_size=b, epochs=1, verbose=2)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    print(f"loss after {args.steps} steps: {history.history['loss'][-1]:.4f}")
    print(f"measured: peak step memory (allocator) {(peak - base) / memory.GiB:.2f} GiB above weights and Adam")


if __name__ == "__main__":
    main()
