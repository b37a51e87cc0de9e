"""The processes tests/recipes/test_distribute.py and test_multi_worker.py start.

Devices are fixed when TensorFlow starts, and MultiWorkerMirroredStrategy must be
created before TensorFlow runs anything, so each scenario runs in a fresh process:

    python -m tests.recipes.distribute_child mirrored OUT.json
        two logical CPU devices; per scenario, 3 optimizer steps of `fit` on one device
        and under MirroredStrategy(2), from the same seed on the same global batches;
        writes how far apart the weights end.
    python -m tests.recipes.distribute_child optimizers OUT.json
        two logical CPU devices; per recipe optimizer, with and without accumulation, 2 updates
        with different gradients on each replica under MirroredStrategy(2) and their sum on one
        device; writes how far apart the weights end (and how far plain Keras' Lion ends).
    python -m tests.recipes.distribute_child cli PAUSE_AFTER_STEP train ...
        `zoo train ...` (TF_CONFIG from the environment); past optimizer step PAUSE_AFTER_STEP
        (0: never) every batch sleeps, so that a test can kill a worker mid-run.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def split_cpu(n):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


# name: (checkpointing, precision, accumulation_steps): each policy once, `full` with accumulation and
# `none` under mixed_bfloat16, as one child process must stay short (each fit traces anew).
SCENARIOS = {
    "none-bf16": ("none", "mixed_bfloat16", 1),
    "selective": ("selective", "float32", 1),
    "full-accumulation": ("full", "float32", 2),
}


def _fit(cluster, recipe, dataset, steps):
    import keras
    import numpy as np

    from recipes import build

    keras.utils.set_random_seed(0)
    with cluster.scope():
        model = cluster.prepare(build(recipe))
        model.fit(cluster.distribute(dataset), epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    return [np.asarray(v.value, dtype="float64") for v in model.trainable_variables]


def mirrored(out):
    split_cpu(2)
    import json

    import numpy as np
    import tensorflow as tf

    import recipes
    from recipes import distribute
    from tests.common import TINY_DEC

    one, two = distribute.make(None), distribute.make("mirrored", ["CPU:0", "CPU:1"])
    rows = np.random.default_rng(0).integers(0, TINY_DEC["vocab_size"], size=(4 * 3 * 2, 17)).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices(rows).batch(4).map(
        lambda r: ({"token_ids": r[:, :-1], "padding_mask": tf.ones_like(r[:, :-1])}, r[:, 1:]))
    report = {"replicas": two.replicas}
    for name, (policy, precision, k) in SCENARIOS.items():
        recipe = recipes.get("dec-base").replace(
            model_overrides={**TINY_DEC, "dropout": 0.1}, checkpointing=policy, precision=precision,
            accumulation_steps=k, batch_size=4, steps=3, warmup_steps=1, learning_rate=1e-3, clipnorm=1.0)
        a, b = _fit(one, recipe, dataset, 3 * k), _fit(two, recipe, dataset, 3 * k)
        report[name] = {
            "max_rel": max(float(np.max(np.abs(x - y)) / np.max(np.abs(x))) for x, y in zip(a, b)),
            "norm_rel": max(float(np.linalg.norm(x - y) / np.linalg.norm(x)) for x, y in zip(a, b)),
        }
    try:
        two.check_batch(3)
    except ValueError as error:
        report["odd_batch_error"] = str(error)
    with open(out, "w") as f:
        json.dump(report, f)


def optimizers(out):
    """A kernel (3, 4) and a bias (4,), gradients of global norm ~4 on each replica: the recipe's
    global clip at 1.0 binds, so clipping each replica's gradient before summing would show."""
    split_cpu(2)
    import json

    import keras
    import numpy as np
    import tensorflow as tf

    import recipes
    from recipes import optim
    from zoo.memory.optimizer_state import RECIPE_OPTIMIZERS as OPTIMIZERS

    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 4)).astype("float32"), rng.normal(size=(4,)).astype("float32")]
    # grads[micro-batch][replica] = (kernel gradient, bias gradient)
    grads = [[[(rng.normal(size=s) * 2).astype("float32") for s in ((3, 4), (4,))] for _ in range(2)]
             for _ in range(4)]

    def train(strategy, make, k):
        with strategy.scope():
            variables = [tf.Variable(w) for w in start]
            opt = make(k)
            opt.exclude_from_weight_decay(var_list=[variables[1]])  # the bias, as recipes exclude it
            opt.build(variables)  # as Keras' trainer does, outside the step function

            @tf.function
            def step(g):
                strategy.run(lambda g: opt.apply(g, variables), args=(g,))

            for micro in grads[:2 * k]:
                if strategy.num_replicas_in_sync == 1:
                    step([micro[0][i] + micro[1][i] for i in range(2)])
                else:
                    step(strategy.experimental_distribute_values_from_function(
                        lambda ctx, micro=micro: micro[ctx.replica_id_in_sync_group]))
        return [np.asarray(v.numpy(), "float64") for v in variables]

    def rel(a, b):
        return max(float(np.max(np.abs(x - y)) / np.max(np.abs(x))) for x, y in zip(a, b))

    one, two = tf.distribute.OneDeviceStrategy("CPU:0"), tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    report = {"replicas": two.num_replicas_in_sync}
    for name in OPTIMIZERS:
        def make(k, name=name):
            recipe = recipes.get("dec-base", optimizer=name, learning_rate=1e-2, warmup_steps=0, steps=10,
                                 accumulation_steps=k, clipnorm=1.0, weight_decay=0.1)
            return optim.optimizer(recipe, keras.Sequential([keras.Input((1,))]))
        for k in (1, 2):
            a = train(one, make, k)
            report[f"{name}-k{k}"] = {"rel": rel(a, train(two, make, k)), "moved": rel(start, a)}
    plain = {"learning_rate": 1e-2, "global_clipnorm": 1.0}
    report["plain-keras-lion"] = rel(train(one, lambda k: keras.optimizers.Lion(**plain), 1),
                                     train(two, lambda k: keras.optimizers.Lion(**plain), 1))
    with open(out, "w") as f:
        json.dump(report, f)


def cli(pause_after, *argv):
    """`zoo train ARGV`; from optimizer step `pause_after` on (0: never) each batch sleeps 0.5 s."""
    import time

    from recipes import runner
    from zoo.cli import main

    pause_after = int(pause_after)
    if pause_after:
        def slow(self, batch, logs=None, _real=runner._Intervals.on_train_batch_end):
            _real(self, batch, logs)
            if int(self.model.optimizer.iterations.numpy()) >= pause_after:
                time.sleep(0.5)

        runner._Intervals.on_train_batch_end = slow
    return main(list(argv))


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    sys.exit({"mirrored": mirrored, "optimizers": optimizers}.get(mode, cli)(*args))
