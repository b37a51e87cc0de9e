"""Data-parallel training on tf.distribute: which strategy, on which devices, who writes.

  "mirrored"      `MirroredStrategy` over the devices of one host (`devices=`, default: all GPUs).
  "multi-worker"  `MultiWorkerMirroredStrategy` across hosts, from the standard TF_CONFIG.

The recipe's `batch_size` is the global batch; each replica takes an equal slice. Every
process reads the same global batches and keeps its own replicas' rows (replica r:
rows [r*b, (r+1)*b)), the layout zoo's dropout assumes, so N replicas train exactly
what one device would. Only the chief writes into out_dir; other workers write into a
temporary folder that is removed (the usual tf.distribute pattern), so every process
runs the same code, collectives included.

Keras 3.15 `fit` fails under MultiWorkerMirroredStrategy in two places, both worked
around here rather than by a training loop of our own:
  * `_maybe_symbolic_build` reduces the first batch with `strategy.reduce("MEAN", dict)`,
    which the collective reduce cannot convert (keras #20329, dict inputs): the model is
    left without a recorded strategy, and `fit` runs inside `strategy.scope()`, where
    `model.distribute_strategy` still finds it. (Done under mirrored too: that build also
    draws a batch from an iterator it drops, which moves a reshuffling dataset's order.)
  * the step's logs are reduced with `strategy.reduce("MEAN", scalar, axis=0)`
    (tensorflow #72388, keras #20585): train and test steps return their logs as [1] vectors.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass

import tensorflow as tf

from recipes import watchdog
from zoo import checks

KINDS = ("mirrored", "multi-worker")
# One all-reduce waiting longer than this for a peer fails the run. It bounds the first step too, whose
# tracing can differ between hosts by minutes; later steps are bounded by --collective-timeout (recipes.watchdog).
COLLECTIVE_TIMEOUT_S = 600
WORKER_LOST_EXIT = 3  # `zoo train`'s exit code when a peer died, became unreachable or stopped
BARRIER_TIMEOUT_S = 24 * 3600  # workers wait while the chief prepares (a vocabulary can take a while)
EXAMPLE_TF_CONFIG = ('{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                     '"task": {"type": "worker", "index": 0}}')


class WorkerLost(RuntimeError):
    """A peer of a multi-worker run died or became unreachable."""


def lost_message(cause: str, out_dir: str) -> str:
    """What every process of a multi-worker run says when a peer is lost, and how to resume."""
    from recipes import state

    found = state.checkpoints(out_dir)
    last = f"step {found[-1][0]}" if found else "the start: no checkpoint was written yet"
    return (f"Multi-worker training stopped: {cause}. Every process of the run stops. Start the same command again "
            f"on every host to resume from the last checkpoint in {out_dir!r} ({last}).")


def tf_config(text: str | None = None) -> dict:
    """The TF_CONFIG cluster description, checked: a cluster of host:port lists and this task in it."""
    text = os.environ.get("TF_CONFIG") if text is None else text
    fix = f"Set it on every host, e.g. TF_CONFIG='{EXAMPLE_TF_CONFIG}' (\"index\": 1 on the second host)."
    if not text:
        raise ValueError(f"--strategy multi-worker reads the cluster from the TF_CONFIG environment variable, "
                         f"which is not set. {fix}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): {text!r}. {fix}") from None
    cluster, task = (config.get("cluster"), config.get("task")) if isinstance(config, dict) else (None, None)
    if not isinstance(cluster, dict) or not cluster or not isinstance(task, dict):
        raise ValueError(f"TF_CONFIG needs a \"cluster\" (job name -> list of host:port) and a \"task\" "
                         f"(type and index); got {text!r}. {fix}")
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses or not all(
                isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addresses):
            raise ValueError(f"TF_CONFIG cluster job {job!r} must list host:port addresses; got {addresses!r}. {fix}")
    kind, index = task.get("type"), task.get("index")
    if kind not in ("chief", "worker") or kind not in cluster:
        raise ValueError(f"TF_CONFIG task type {kind!r} is not one of the cluster's jobs "
                         f"({', '.join(j for j in cluster if j in ('chief', 'worker'))}). {fix}")
    if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise ValueError(f"TF_CONFIG task index {index!r} is outside job {kind!r}, which has "
                         f"{len(cluster[kind])} address(es): use 0 to {len(cluster[kind]) - 1}. {fix}")
    return config


def _device_name(name: str) -> str:
    """"/device:GPU:0", "/gpu:0" or "gpu:0" -> "GPU:0"."""
    kind, _, index = name.strip().strip("/").removeprefix("device:").rpartition(":")
    return f"{kind.upper()}:{index}"


def _local_devices(devices):
    existing = [_device_name(d.name) for d in tf.config.list_logical_devices()]
    wanted = [_device_name(d) for d in devices]
    missing = [d for d in wanted if d not in existing]
    if missing:
        raise ValueError(f"--devices names {', '.join(missing)}, which this machine does not have; its devices "
                         f"are: {', '.join(existing)}. Name devices from that list (e.g. --devices GPU:0,GPU:1).")
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"--devices names a device twice ({', '.join(wanted)}); name each device once.")
    return wanted


@dataclass
class Cluster:
    """Where a run trains: its strategy, and whether this process is the one that writes."""

    strategy: tf.distribute.Strategy
    kind: str | None = None  # None: one device, the default strategy
    chief: bool = True
    collective_timeout: float = watchdog.DEFAULT_TIMEOUT_S  # multi-worker: the bound on a step after the first

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def check_batch(self, batch_size: int):
        """The global batch must split evenly, so every replica's slice has the same size."""
        checks.global_batch(batch_size, self.replicas, f" of this {self.kind} run")

    @contextlib.contextmanager
    def writable(self, out_dir):
        """out_dir on the chief; elsewhere a temporary folder, removed at the end."""
        if self.chief:
            yield out_dir
            return
        scratch = tempfile.mkdtemp(prefix="recipes-worker-")
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def barrier(self):
        """Every process waits here until all have arrived (the chief's preparation is done)."""
        if self.kind != "multi-worker":
            return
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=BARRIER_TIMEOUT_S)

        def arrive():
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0), options=options)

        self.strategy.run(arrive)

    def distribute(self, dataset: tf.data.Dataset):
        """Global batches -> per-replica slices: replica r gets rows [r*b, (r+1)*b) of every batch."""
        if self.kind is None:
            return dataset

        def per_process(context):
            replicas = context.num_replicas_in_sync
            local = replicas // context.num_input_pipelines
            first = context.input_pipeline_id * local

            def slices(*batch):
                b = tf.shape(tf.nest.flatten(batch)[0])[0] // replicas
                own = tf.nest.map_structure(
                    lambda t: tf.stack([t[(first + k) * b:(first + k + 1) * b] for k in range(local)]), batch)
                return tf.data.Dataset.from_tensor_slices(own)  # local replicas take consecutive elements

            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            return dataset.flat_map(slices).prefetch(tf.data.AUTOTUNE).with_options(options)

        return self.strategy.distribute_datasets_from_function(per_process)

    def prepare(self, model):
        """Make a compiled `model`'s `fit` work under this strategy (module notes); call fit inside `scope()`."""
        if self.kind is None:
            return model
        # The symbolic build draws a batch from an iterator it then drops; with a dataset that reshuffles per
        # iteration, training then starts on the second iterator's order, not the one a single device sees.
        # Under multi-worker it also fails outright (keras #20329). Skip it: fit builds while tracing instead.
        model._distribute_strategy = None
        if not model.optimizer.built:  # what the symbolic build would have built; not in a replica's trace
            with self.scope():
                model.optimizer.build(model.trainable_variables)
        if self.kind != "multi-worker":
            return model
        for name in ("train_step", "test_step"):
            setattr(model, name, functools.partial(_logs_as_vectors, getattr(model, name)))
        return model

    def scope(self):
        return self.strategy.scope()

    def callbacks(self, out_dir) -> list:
        """`fit` callbacks the strategy needs: under multi-worker, the step watchdog (recipes.watchdog)."""
        if self.kind != "multi-worker":
            return []
        cause = (f"no step finished within --collective-timeout {self.collective_timeout:g} s: another worker stopped "
                 "responding (stopped, hung or unreachable)")
        return [watchdog.StepWatchdog(self.collective_timeout, lambda: lost_message(cause, out_dir), WORKER_LOST_EXIT)]


def _logs_as_vectors(step, data):
    """tensorflow #72388: Keras reduces logs with axis=0 under multi-worker; give them one."""
    return {key: tf.reshape(value, [1]) for key, value in step(data).items()}


@functools.cache
def _mirrored(devices):
    """One MirroredStrategy per set of devices in a process: a second one on the same devices reuses the first's
    collective instance keys and fails ("Shape mismatch in the collective instance"), so a notebook's second
    mirrored run (or a resumed one) gets the first's."""
    return tf.distribute.MirroredStrategy(list(devices) if devices else None)


def make(kind: str | None = None, devices=None, collective_timeout=None) -> Cluster:
    """The `Cluster` for `kind` (None: one device), refusing bad input before anything runs.

    `devices` (mirrored only): device names such as "GPU:0" (default: every GPU, else the CPU).
    Under multi-worker each process uses all of its host's GPUs; limit them with CUDA_VISIBLE_DEVICES.
    `collective_timeout` (multi-worker only): seconds a step after the first may wait for the other
    workers before every process stops (default: recipes.watchdog.DEFAULT_TIMEOUT_S).
    """
    if kind not in (None, "none", *KINDS):
        raise ValueError(f"Unknown strategy {kind!r}; known: {', '.join(KINDS)} (or none for one device).")
    if collective_timeout is not None:
        collective_timeout = watchdog.check_timeout(collective_timeout)
        if kind != "multi-worker":
            raise ValueError("--collective-timeout bounds how long a multi-worker step waits for the other workers; "
                             "it applies to --strategy multi-worker only (one host's devices cannot hang apart).")
    if devices and kind != "mirrored":
        raise ValueError("--devices picks the devices of a --strategy mirrored run; under multi-worker every "
                         "worker uses all its GPUs (restrict them with CUDA_VISIBLE_DEVICES), and one-device runs "
                         "use the first GPU or the CPU.")
    if kind in (None, "none"):
        return Cluster(tf.distribute.get_strategy())
    if kind == "mirrored":
        return Cluster(_mirrored(tuple(_local_devices(devices)) if devices else None), "mirrored")
    config = tf_config()
    collective_timeout = collective_timeout or watchdog.DEFAULT_TIMEOUT_S
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=max(COLLECTIVE_TIMEOUT_S, collective_timeout))
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except RuntimeError as error:
        raise ValueError(f"MultiWorkerMirroredStrategy could not start ({error}). It must be created before "
                         "TensorFlow runs anything in the process: start a fresh process (zoo train, or "
                         "recipes.run(..., strategy='multi-worker') before any other TensorFlow call).") from None
    task = config["task"]
    chief = task["type"] == "chief" or (task["type"] == "worker" and task["index"] == 0
                                        and "chief" not in config["cluster"])
    return Cluster(strategy, "multi-worker", chief, collective_timeout)


def local_tf_configs(workers: int) -> list:
    """TF_CONFIG values for `workers` processes on 127.0.0.1 (task 0 first), to try multi-worker on one
    machine: ports the OS hands out for port 0, released just before the workers bind them."""
    sockets = [socket.socket() for _ in range(workers)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    cluster = {"worker": [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]}
    for s in sockets:
        s.close()
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(workers)]


# What a peer's death looks like from the survivors: the collective is aborted or times out.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError,
               tf.errors.CancelledError, tf.errors.InternalError)
