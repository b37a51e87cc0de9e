"""The memory planner: what a training step will take, before anything is built (`estimate`),
assembled from one function per part (`parts`: weights, optimizer state, gradients, activations, loss,
workspace), the configuration `checkpointing="auto"` picks under a budget (`choose`), the largest batch that
fits (`largest_batch`), what loading a checkpoint peaks at (`loading_plan`) and the step's process as the machine
sees it (`step_resident`: its peak RSS); `replicas.plan`: the same on N data-parallel replicas; `PeakMemory`:
what a block of work peaked at, by the best measure the process has (zoo.memory.measure). docs/memory.md
explains the model and its measurements."""

from zoo.memory import parts, replicas
from zoo.memory.budget import default_budget, parse_bytes
from zoo.memory.estimate import CONFIGS, GiB, MemoryEstimate, choose, estimate, largest_batch, split_config
from zoo.memory.loading import DoesNotFit, LoadingPlan, check_loading_fits, loading_peak, loading_plan
from zoo.memory.measure import PeakMemory
from zoo.memory.optimizer_state import OPTIMIZERS, RECIPE_OPTIMIZERS
from zoo.memory.parts import MASKED_FRACTION, loss_live_bytes, optimizer_state_bytes
from zoo.memory.resident import ResidentPlan, check_step_fits, step_resident

__all__ = [
    "CONFIGS", "MASKED_FRACTION", "OPTIMIZERS", "RECIPE_OPTIMIZERS", "DoesNotFit", "GiB", "LoadingPlan",
    "MemoryEstimate", "PeakMemory", "ResidentPlan", "check_loading_fits", "check_step_fits", "choose",
    "default_budget", "estimate", "largest_batch", "loading_peak", "loading_plan", "loss_live_bytes",
    "optimizer_state_bytes", "parse_bytes", "parts", "replicas", "split_config", "step_resident",
]
