"""The processes tests/recipes/test_distribute.py and test_multi_worker.py start.

Devices are fixed when TensorFlow starts, and MultiWorkerMirroredStrategy must be
created before TensorFlow runs anything, so each scenario runs in a fresh process:

    python -m tests.recipes.distribute_child mirrored OUT.json
        two logical CPU devices and one MirroredStrategy(2) for the three parts below (a second
        MirroredStrategy on the same devices in one process reuses the first one's collective
        instance keys: "Shape mismatch in the collective instance"); writes one JSON report:
        "fit": per scenario, 3 optimizer steps of `fit` on one device and on two replicas, from the
            same seed on the same global batches: how far apart the weights end;
        "fused": the fused update (zoo.training.fused) on two replicas against one device, per family,
            3 steps with dropout and a triggering global clip; then a mixed_float16 step that overflows
            on one replica only: the distances and what moved;
        "optimizers": per recipe optimizer, with and without accumulation, 2 updates with different
            gradients on each replica and their sum on one device: how far apart the weights end (and
            how far plain Keras' Lion ends);
        "trained_positions": the LM head on trained positions only (tests/zoo/test_trained_positions.py) on
            two replicas against the full head on one device.
    python -m tests.recipes.distribute_child cli PAUSE_AFTER_STEP train ...
        `zoo train ...` (TF_CONFIG from the environment); past optimizer step PAUSE_AFTER_STEP
        (0: never) every batch sleeps 2 s, so that a test can kill a worker mid-run; with
        HANG_AT_STEP=N in the environment, the main thread stops for good after step N (its
        other threads, TensorFlow's heartbeats included, go on: a hung worker, not a dead one).
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def split_cpu(n):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


# name: (checkpointing, precision, accumulation_steps, LoRA): `none` under mixed_bfloat16 (bfloat16 gradients
# rounded per replica), `full` with accumulation (recomputation in a replica, keras #20582), and LoRA adapters
# (zoo.lora, every projection) under `full`. `selective` recomputes through the same wrapper as `full`
# (zoo.ops.recompute), only around the attention core, so it adds no path under a strategy; each fit traces
# anew, about 10 s, and one child process must stay short: one block each (a replica runs the same code per block).
SCENARIOS = {
    "none-bf16": ("none", "mixed_bfloat16", 1, False),
    "full-accumulation": ("full", "float32", 2, False),
    "lora-full": ("full", "float32", 1, True),
}


def _fit(cluster, recipe, dataset, steps, lora=False):
    """The trained weights, and how many frozen variables a GradientTape would still watch (LoRA:
    every copy of a frozen variable must be frozen for TensorFlow too, zoo.lora._set_trainable)."""
    import keras
    import numpy as np

    import zoo
    from recipes import build

    keras.utils.set_random_seed(0)
    with cluster.scope():
        model = build(recipe)
        if lora:  # before prepare, which builds the optimizer for the trainable variables
            zoo.lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
        model = cluster.prepare(model)
        model.fit(cluster.distribute(dataset), epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    watched_frozen = sum(c.trainable for v in model.variables if not v.trainable
                         for c in getattr(v._value, "values", (v._value,)))
    return [np.asarray(v.value, dtype="float64") for v in model.trainable_variables], watched_frozen


def fit_scenarios(one, two):
    """Per SCENARIOS entry, `fit` on one device and on two replicas: how far apart the weights end."""
    import numpy as np
    import tensorflow as tf

    import recipes
    from tests.common import TINY_DEC

    rows = np.random.default_rng(0).integers(0, TINY_DEC["vocab_size"], size=(4 * 3 * 2, 17)).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices(rows).batch(4).map(
        lambda r: ({"token_ids": r[:, :-1], "padding_mask": tf.ones_like(r[:, :-1])}, r[:, 1:]))
    report = {"replicas": two.replicas}
    for name, (policy, precision, k, lora) in SCENARIOS.items():
        recipe = recipes.get("dec-base").replace(
            model_overrides={**TINY_DEC, "dropout": 0.1, "num_layers": 1}, checkpointing=policy, precision=precision,
            accumulation_steps=k, batch_size=4, steps=3, warmup_steps=1, learning_rate=1e-3, clipnorm=1.0)
        (a, _), (b, watched_frozen) = (_fit(one, recipe, dataset, 3 * k, lora), _fit(two, recipe, dataset, 3 * k, lora))
        report[name] = {
            "max_rel": max(float(np.max(np.abs(x - y)) / np.max(np.abs(x))) for x, y in zip(a, b)),
            "norm_rel": max(float(np.linalg.norm(x - y) / np.linalg.norm(x)) for x, y in zip(a, b)),
            "trained": len(a), "watched_frozen": watched_frozen,
        }
    try:
        two.check_batch(3)
    except ValueError as error:
        report["odd_batch_error"] = str(error)
    return report


def _copies(cluster, model):
    """Per variable, each replica's copy as float64 arrays (one device: one copy)."""
    import numpy as np

    return [[np.asarray(c.numpy(), "float64") for c in cluster.strategy.experimental_local_results(v)]
            for v in model.trainable_variables]


def fused(one, two):
    import numpy as np
    import tensorflow as tf

    from tests.zoo.test_fused import CLIP, batches, build

    report = {}
    for family, tied in (("llama", True), ("bert", False)):
        runs = []
        for cluster in (one, two):
            with cluster.scope():
                model = cluster.prepare(build(family, tied=tied, fused="global", clip=CLIP, num_layers=1))
                model.run_eagerly = family == "bert"  # the traced step (merge_call rules) is the decoder's
                model.fit(cluster.distribute(batches(family, batch=4)), epochs=1, steps_per_epoch=3, verbose=0)
            runs.append((_copies(cluster, model), int(model.optimizer.iterations.numpy()),
                         [v.path for v in model.trainable_variables]))
        (a, steps_one, paths), (b, steps_two, _) = runs
        kept = [i for i, p in enumerate(paths) if "key/bias" not in p]  # its gradient is rounding noise (test_fused)
        report[family] = {
            "norm_rel": max(float(np.linalg.norm(a[i][0] - b[i][0]) / np.linalg.norm(a[i][0])) for i in kept),
            "max_rel": max(float(np.max(np.abs(a[i][0] - b[i][0])) / np.max(np.abs(a[i][0]))) for i in kept),
            "copies_equal": all(np.array_equal(c, copies[0]) for copies in b for c in copies),
            "steps": [steps_one, steps_two],
        }

    # mixed_float16: replica 1's rows weigh 1e6, so only its float16 gradients overflow.
    with two.scope():
        model = two.prepare(build("llama", precision="mixed_float16", fused="global", clip=1.0, num_layers=1))
        (x, y), = batches("llama", batch=4, steps=1).take(1)
        heavy = tf.constant([1.0, 1.0, 1e6, 1e6])
        before, scale = _copies(two, model), float(model.optimizer.dynamic_scale.numpy())
        model.fit(two.distribute(tf.data.Dataset.from_tensors((x, y, heavy))), epochs=1, steps_per_epoch=1,
                  verbose=0)
        after_skip = _copies(two, model)
        report["float16_skip"] = {
            "unchanged": all(np.array_equal(c, b[0]) for copies, b in zip(after_skip, before) for c in copies),
            "iterations": int(model.optimizer.iterations.numpy()),
            "scale": [scale, float(model.optimizer.dynamic_scale.numpy())],
        }
        model.fit(two.distribute(tf.data.Dataset.from_tensors((x, y, tf.ones([4]))).repeat()), epochs=1,
                  steps_per_epoch=2, verbose=0)  # the schedule's first rate is 0: the second step moves
        after = _copies(two, model)
        report["float16_next"] = {
            "iterations": int(model.optimizer.iterations.numpy()),
            "moved": sum(not np.array_equal(copies[0], b[0]) for copies, b in zip(after, before)),
            "variables": len(after),
            "copies_equal": all(np.array_equal(c, copies[0]) for copies in after for c in copies),
        }
    return report


def optimizers(two):
    """A kernel (3, 4) and a bias (4,), gradients of global norm ~4 on each replica: the recipe's
    global clip at 1.0 binds, so clipping each replica's gradient before summing would show."""
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

    one = tf.distribute.OneDeviceStrategy("CPU:0")
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
    return report


def mirrored(out):
    """One device against MirroredStrategy(2) on two logical CPU devices: `fit`, the fused update, the
    recipe optimizers and the trained-positions loss, under one strategy (module notes), reported in one JSON file."""
    split_cpu(2)
    import json

    from recipes import distribute

    one, two = distribute.make(None), distribute.make("mirrored", ["CPU:0", "CPU:1"])
    report, seconds = {}, {}
    from tests.zoo.test_trained_positions import mirrored_report

    for name, part in (("fit", lambda: fit_scenarios(one, two)), ("fused", lambda: fused(one, two)),
                       ("optimizers", lambda: optimizers(two.strategy)),
                       ("trained_positions", lambda: mirrored_report(two.strategy))):
        began = time.monotonic()
        report[name] = part()
        seconds[name] = round(time.monotonic() - began, 1)
    report["seconds"] = seconds  # where the child's time goes, for whoever shortens it
    with open(out, "w") as f:
        json.dump(report, f)


def cli(pause_after, *argv):
    """`zoo train ARGV`; from optimizer step `pause_after` on (0: never) each batch sleeps 2 s."""
    import time

    from recipes import runner
    from zoo.cli import main

    pause_after, hang_at = int(pause_after), int(os.environ.get("HANG_AT_STEP", 0))
    if pause_after or hang_at:
        def slow(self, batch, logs=None, _real=runner._Intervals.on_train_batch_end):
            _real(self, batch, logs)
            step = int(self.model.optimizer.iterations.numpy())
            if hang_at and step >= hang_at:
                open(os.environ["HANG_MARKER"], "w").close()  # when the hang began, for the test's clock
                time.sleep(3600)
            if pause_after and step >= pause_after:
                time.sleep(2)

        runner._Intervals.on_train_batch_end = slow
    return main(list(argv))


if __name__ == "__main__":
    if os.environ.get("ZOO_TEST_OP_STACKS", "0") != "1":  # as in the test process that starts this one
        from tests.common import one_stack_for_every_op

        one_stack_for_every_op()
    mode, *args = sys.argv[1:]
    if mode == "mirrored" and os.environ.get("ZOO_TEST_GRAPPLER", "0") != "1":  # as in the tests (tests/conftest.py)
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    sys.exit({"mirrored": mirrored}.get(mode, cli)(*args))
