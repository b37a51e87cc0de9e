"""What `ReplicaContext.all_reduce` holds beyond the tensors it reduces: the planner's all-reduce buffer
(zoo.memory.replicas, docs/distributed.md: Planning memory on many devices).

    python benchmarks/allreduce_buffer.py                 # 8 x 1 MiB, 8 x 4 MiB, 2 x 8 MiB float32 tensors

Each row runs two fresh processes on two logical CPU devices under MirroredStrategy: every replica
makes a list of float32 tensors, all alive at once (as gradients are before an update), and either
sums each ("alone") or all-reduces the list first ("reduce"). The difference of TF allocator peaks,
divided by the two replicas, is what the all-reduce added per replica; TF's collective all_reduce
concatenates the list into one flat tensor (tensorflow/python/distribute/cross_device_utils.py,
`batch_all_reduce`, one pack when bytes_per_pack is 0, the default). Prints a table and one JSON line.
"""

import argparse
import json
import subprocess
import sys

MiB = 2**20


def child(mode, count, mib):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    @tf.function
    def step():
        def replica():
            context = tf.distribute.get_replica_context()
            scale = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
            tensors = [tf.random.uniform([mib * MiB // 4]) * scale for _ in range(count)]
            if mode == "reduce":
                tensors = context.all_reduce(tf.distribute.ReduceOp.SUM, tensors)
            with tf.control_dependencies(tensors):  # every tensor alive at once
                return tf.add_n([tf.reduce_sum(t) for t in tensors])

        return strategy.run(replica)

    step()  # trace and warm up
    tf.config.experimental.reset_memory_stats("CPU:0")
    step()
    print(json.dumps({"peak": tf.config.experimental.get_memory_info("CPU:0")["peak"]}))


def peak(mode, count, mib) -> int:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(count), str(mib)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default="8x1,8x4,2x8", help="COUNTxMIB tensors per replica, comma-separated")
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), int(args.child[2]))
    rows = []
    for item in args.shapes.split(","):
        count, mib = (int(v) for v in item.split("x"))
        alone, reduced = peak("alone", count, mib), peak("reduce", count, mib)
        rows.append({"tensors": count, "MiB_each": mib, "MiB_per_replica": count * mib, "peak_alone_MiB": alone / MiB,
                     "peak_reduce_MiB": reduced / MiB, "added_per_replica_MiB": (reduced - alone) / 2 / MiB})
    print(f"{'tensors':>8s} {'per replica':>12s} {'peak alone':>11s} {'peak reduce':>12s} {'added/replica':>14s}")
    for r in rows:
        print(f"{r['tensors']:>5d}x{r['MiB_each']:<2d} {r['MiB_per_replica']:>9d}MiB {r['peak_alone_MiB']:>8.0f}MiB "
              f"{r['peak_reduce_MiB']:>9.0f}MiB {r['added_per_replica_MiB']:>11.0f}MiB")
    print(json.dumps({"benchmark": "allreduce_buffer", "rows": rows}))


if __name__ == "__main__":
    main()
