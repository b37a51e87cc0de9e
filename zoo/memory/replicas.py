"""Data-parallel planning: what each of N replicas holds and what the all-reduce moves per step.

`--batch-size` is the GLOBAL batch, as `zoo train` reads it under a strategy (recipes.distribute):
each replica takes an equal slice, holds the full weights and optimizer state, and its peak is one
device's estimate at that slice plus the all-reduce's packed copy (`estimate(replicas=N)`). The
traffic is a ring all-reduce's. Assumptions and a paper table: docs/distributed.md (Planning memory
on many devices).
"""

from dataclasses import dataclass

from zoo import checks, registry
from zoo.memory.estimate import MemoryEstimate, estimate

# How the fused update clips (zoo.training.fused.CLIPS, and None for no global clipnorm).
FUSED_CLIPS = ("global", "per-block", None)


def per_replica_batch(global_batch: int, replicas: int, hosts: int = 1) -> int:
    """The slice of `global_batch` each replica trains, refused unless it splits evenly (replicas
    over hosts as well: every host runs the same number of replicas)."""
    checks.positive("batch_size", global_batch)
    checks.positive("replicas", replicas)
    checks.positive("hosts", hosts)
    if replicas % hosts:
        ok = ", ".join(str(h) for h in range(1, replicas + 1) if replicas % h == 0)
        raise ValueError(
            f"--replicas {replicas} does not spread evenly over --hosts {hosts}: every host runs the same number of "
            f"replicas (one per device). Use --hosts {ok}, or --replicas {hosts * (replicas // hosts + 1)}.")
    return checks.global_batch(global_batch, replicas)


def check_fused_clip(fused_clip):
    if fused_clip not in FUSED_CLIPS:
        raise ValueError(f"Unknown fused clip {fused_clip!r}; known: 'global' (exact: the gradients are "
                         "all-reduced twice), 'per-block' or None (no global clip: once).")
    return fused_clip


def reduced_bytes(e: MemoryEstimate, num_layers: int, fused_clip="global") -> int:
    """Gradient bytes handed to all_reduce per step: every trainable gradient once (`e` from
    `estimate(replicas>1)`; fused: each block's, then the embedding's and head's). The fused
    update's exact global clip reduces them twice: the norm of the SUMMED gradient is not a sum of
    the replicas' norms, so its norm pass reduces each block's gradients before the update pass does."""
    check_fused_clip(fused_clip)
    if e.gradients and not e.reduce_buffer:
        raise ValueError("reduced_bytes needs an estimate made with replicas > 1 (estimate(..., replicas=N)).")
    once = e.reduce_buffer + num_layers * e.block_reduce
    return 2 * once if e.fused and fused_clip == "global" else once


def ring_bytes(nbytes: int, replicas: int) -> int:
    """What each member of a ring all-reduce of `nbytes` sends (and receives): 2 (N-1)/N x nbytes."""
    return 2 * (replicas - 1) * nbytes // replicas


@dataclass(frozen=True)
class ReplicaPlan:
    """One data-parallel step. `estimate` is one replica's (at `batch`, the all-reduce buffer
    included); `reduced` the gradient bytes all-reduced per step; `sent` what each replica sends
    per step (ring); `network` what each host sends over its network link per step (0 on one host:
    a ring with each host's replicas adjacent leaves each host by one edge)."""

    replicas: int
    hosts: int
    batch: int
    estimate: MemoryEstimate
    reduced: int
    sent: int
    network: int

    @property
    def global_batch(self) -> int:
        return self.replicas * self.batch

    @property
    def per_replica(self) -> int:
        return self.estimate.total


def plan(spec, batch_size: int, sequence_length: int, replicas: int, hosts: int = 1, fused_clip="global",
         **kwargs) -> ReplicaPlan:
    """A data-parallel step of GLOBAL batch `batch_size` over `replicas` devices on `hosts` hosts.

    `fused_clip` counts the fused update's all-reduces ("global": twice, the default of full+fused);
    **kwargs are `estimate`'s (precision, checkpointing, optimizer, ...).

    Example:
    >>> plan("dec-1b", 16, 512, 4, precision="mixed_bfloat16", checkpointing="full+fused").per_replica / GiB
    """
    batch = per_replica_batch(batch_size, replicas, hosts)
    check_fused_clip(fused_clip)
    e = estimate(spec, batch, sequence_length, replicas=replicas, **kwargs)
    reduced = reduced_bytes(e, registry.spec(spec).num_layers, fused_clip) if replicas > 1 else 0
    sent = ring_bytes(reduced, replicas)
    return ReplicaPlan(replicas, hosts, batch, e, reduced, sent, sent if hosts > 1 else 0)
