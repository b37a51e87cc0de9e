"""Data parallelism on this host: tokens/s and memory per process for dec-base's recipe
(shrunk, `full` checkpointing) on the news corpus, with and without the fused update,
trained on 1 device, on 2 replicas (MirroredStrategy over 2 logical CPU devices) and on
2 worker processes (MultiWorkerMirroredStrategy, TF_CONFIG on 127.0.0.1). Every variant
runs in fresh processes; the global batch and the steps are the same in all, so tokens/s
compare directly. The gradient bytes all-reduced per step are counted from the model's
trainable variables (float32 gradients: every one once; fused with the exact global clip:
twice, once in the norm pass and once in the update pass). Prints a table and one JSON line.

    python benchmarks/distributed.py [--steps 16] [--batch-size 8] [--sequence-length 128]

On a 2-core CPU expect no speed-up: the replicas share the same two cores, and every
update adds an all-reduce (in-process for mirrored, gRPC over loopback for workers).
"""

import argparse
import json
import os
import tempfile
import threading

import _harness

SHAPE = dict(num_layers=4, hidden_dim=256, num_heads=4, num_kv_heads=2, intermediate_dim=704, vocab_size=512)
VARIANTS = [  # (label, strategy, processes, fused)
    (f"{where}{', fused' if fused else ''}", strategy, processes, fused)
    for fused in (False, True)
    for where, strategy, processes in (("1 device", None, 1), ("2 replicas (mirrored)", "mirrored", 1),
                                       ("2 worker processes", "multi-worker", 2))
]


def measure(strategy, data, vocabulary, out_dir, steps, batch_size, sequence_length, fused):
    """One process's run; the mirrored variant splits the CPU into 2 logical devices first."""
    import tensorflow as tf

    if strategy == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import recipes

    recipe = recipes.get("dec-base").replace(model_overrides=SHAPE, precision="float32", vocabulary=vocabulary,
                                             lowercase=False).with_steps(steps)
    recipe = recipe.replace(batch_size=batch_size, sequence_length=sequence_length, accumulation_steps=1,
                            log_every=steps // 2, checkpoint_every=steps, shuffle_buffer=2000,
                            checkpointing="full", fused=fused)
    devices = ["CPU:0", "CPU:1"] if strategy == "mirrored" else None
    result = recipes.run(recipe, data, out_dir, column="text", strategy=strategy, devices=devices, verbose=0)
    gradient_bytes = sum(4 * v.shape.num_elements() for v in result.model.trainable_variables)
    passes = 2 if fused and recipe.clipnorm and recipe.fused_clip == "global" else 1
    return {"tokens_per_second": result.tokens_per_second, "peak_bytes": result.peak_bytes,
            "max_rss_bytes": result.max_rss_bytes, "final_loss": result.history[-1]["loss"],
            "reduced_bytes": passes * gradient_bytes if strategy else 0}


def run_variant(strategy, processes, fused, common, root):
    """[ChildRun] of the variant's processes, started together (workers wait for each other)."""
    out_dir = tempfile.mkdtemp(dir=root)
    envs = [{}]
    if strategy == "multi-worker":
        from recipes.distribute import local_tf_configs

        envs = [{"TF_CONFIG": tf_config} for tf_config in local_tf_configs(processes)]
    runs = [None] * len(envs)

    def start(i):
        runs[i] = _harness.run_child({"strategy": strategy, "out_dir": out_dir, "fused": fused, **common},
                                     timeout=900, env=envs[i])

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(envs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return runs


def main():
    from train_news import news_csv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    args = parser.parse_args()
    import recipes.data
    import recipes.vocab

    root = tempfile.mkdtemp(prefix="distributed-")
    data = news_csv()
    vocabulary = os.path.join(root, "vocab")  # one vocabulary, trained once, for every variant
    recipes.vocab.train(recipes.data.documents(data, "text"), "llama", SHAPE["vocab_size"], vocabulary,
                        lowercase=False, max_documents=600)
    common = {"data": data, "vocabulary": vocabulary, "steps": args.steps, "batch_size": args.batch_size,
              "sequence_length": args.sequence_length}
    print(f"dec-base recipe shrunk to {SHAPE}, float32, global batch {args.batch_size} x {args.sequence_length} "
          f"tokens, {args.steps} steps\n")
    print(f"{'variant':<40} {'tokens/s':>9} {'vs 1 device':>11} {'peak MiB (allocator)':>21} {'max RSS MiB':>12} "
          f"{'all-reduced MiB/step':>21}")
    summary, baseline = {"benchmark": "distributed", "shape": SHAPE, **common}, None
    del summary["data"], summary["vocabulary"]
    for label, strategy, processes, fused in VARIANTS:
        if strategy is None:
            baseline = None  # each group's ratio is to its own 1-device row
        runs = run_variant(strategy, processes, fused, common, root)
        failed = [run for run in runs if not run.ok]
        if failed:
            print(f"{label:<40} {failed[0].status}: {failed[0].error}")
            continue
        first = runs[0].result  # tokens/s of the whole run, as the chief counts it
        baseline = baseline or first["tokens_per_second"]
        peaks = "/".join(f"{r.result['peak_bytes'] / 2**20:,.0f}" for r in runs)
        rss = "/".join(f"{r.peak_rss_bytes / 2**20:,.0f}" for r in runs)
        print(f"{label:<40} {first['tokens_per_second']:>9,.0f} {first['tokens_per_second'] / baseline:>10.2f}x "
              f"{peaks:>21} {rss:>12} {first['reduced_bytes'] / 2**20:>21.2f}")
        summary[label] = {"tokens_per_second": round(first["tokens_per_second"], 1),
                          "peak_bytes": [r.result["peak_bytes"] for r in runs],
                          "peak_rss_bytes": [r.peak_rss_bytes for r in runs],
                          "final_loss": round(first["final_loss"], 5), "reduced_bytes": first["reduced_bytes"]}
    print(json.dumps(summary))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
