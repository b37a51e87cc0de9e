"""The memory planner: what a training step will take, before anything is built (`estimate`),
the configuration `checkpointing="auto"` picks under a budget (`choose`), and the largest batch
that fits (`largest_batch`); `replicas.plan`: the same on N data-parallel replicas. docs/memory.md
explains the model and its measurements."""

from zoo.memory import replicas
from zoo.memory.budget import default_budget, parse_bytes
from zoo.memory.estimate import (
    CONFIGS,
    MASKED_FRACTION,
    GiB,
    MemoryEstimate,
    choose,
    estimate,
    largest_batch,
    loss_live_bytes,
    optimizer_state_bytes,
    split_config,
)
from zoo.memory.optimizer_state import OPTIMIZERS, RECIPE_OPTIMIZERS

__all__ = [
    "CONFIGS", "MASKED_FRACTION", "OPTIMIZERS", "RECIPE_OPTIMIZERS", "GiB", "MemoryEstimate", "choose",
    "default_budget", "estimate", "largest_batch", "loss_live_bytes", "optimizer_state_bytes", "parse_bytes",
    "replicas", "split_config",
]
