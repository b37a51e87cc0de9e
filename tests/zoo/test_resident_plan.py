"""The planned peak RSS of a training step's process (zoo.memory.step_resident) against what the big steps measured
(docs/memory.md: benchmarks/big_models.py step and benchmarks/one_billion.py, one fresh process per row), and the
`zoo plan` line that shows it."""

import pytest

import zoo
from zoo import memory

GiB = memory.GiB
QLORA = dict(precision="mixed_bfloat16", checkpointing="full", lora_rank=16, lora_targets="all-linear",
             quantize="int4")
FULL_BF16 = dict(precision="bfloat16", checkpointing="full+fused", optimizer="adafactor", weights_dtype="bfloat16")

# (model, step at 1 x 2048, measured peak RSS GiB, where): each a fresh process, loading included.
MEASURED = [
    ("llama3.1-8b", QLORA, 11.42, "big_models.py step, 2026-12-06, AVX-512 EPYC"),
    ("llama3.2-3b", QLORA, 7.89, "big_models.py step, 2026-12-06, AVX-512 EPYC"),
    ("llama3.2-3b", QLORA, 6.79, "big_models.py step, 2026-12-07, AVX2-only EPYC, after the constant was fitted"),
    ("llama3.2-3b", FULL_BF16, 16.11, "one_billion.py --variants e, 2026-12-05, AVX-512 EPYC"),
]


def planned(name, step):
    e = memory.estimate(name, 1, 2048, **step)
    precision = step["weights_dtype"] if "weights_dtype" in step else step["precision"]
    return e, memory.step_resident(name, e, "causal_lm", step.get("quantize"), precision)


@pytest.mark.parametrize("name, step, measured, where", MEASURED, ids=lambda v: v if isinstance(v, str) else None)
def test_planned_rss_is_within_ten_percent_of_the_measured_step(name, step, measured, where):
    """Issue 44's bound. The allocator's plan alone is 4-5 GiB under each of these (the process's runtime, the
    model's objects and the traced step's graph are not the allocator's)."""
    e, plan = planned(name, step)
    assert abs(plan.total / GiB / measured - 1) <= 0.10, (name, plan.as_dict(), measured, where)
    assert plan.allocator == e.total and plan.total - e.total > 3 * GiB


def test_the_traced_step_grows_with_depth_not_with_the_batch():
    """What lies above the allocator is per block traced, not per token: a deeper model plans more of it, a
    bigger batch plans only its allocator's share."""
    shallow = zoo.spec("llama3.2-3b").replace(num_layers=14)
    _, deep = planned("llama3.2-3b", QLORA)
    e = memory.estimate(shallow, 1, 2048, **QLORA)
    half = memory.step_resident(shallow, e, "causal_lm", "int4", "mixed_bfloat16")
    assert deep.traced_step == 2 * half.traced_step == 28 * memory.resident.STEP_HEAP_PER_BLOCK
    wide = memory.estimate("llama3.2-3b", 4, 2048, **QLORA)
    batch4 = memory.step_resident("llama3.2-3b", wide, "causal_lm", "int4", "mixed_bfloat16")
    assert batch4.total - deep.total == wide.total - deep.allocator > 0


def test_plan_prints_the_planned_rss_and_says_when_it_is_above_the_budget(capsys):
    from zoo.cli import main

    args = ["llama3.1-8b", "--lora-rank", "16", "--quantize", "int4", "--batch-size", "1", "--sequence-length",
            "2048", "--checkpointing", "full", "--precision", "mixed_bfloat16", "--lora-targets", "all-linear"]
    _, plan = planned("llama3.1-8b", QLORA)
    assert main(["plan", *args, "--budget", "24GiB"]) == 0
    auto = capsys.readouterr().out.splitlines()[-1]
    assert auto.startswith("auto: full (") and auto.endswith(
        f"; its process's planned peak RSS {plan.total / GiB:.2f} GiB (runtime 0.70 + allocator 6.71 + model objects "
        "0.99 + traced step 3.20: 32 blocks traced into the step, ~0.10 GiB each; docs/memory.md)"), auto
    assert main(["plan", *args, "--budget", "10GiB"]) == 0  # the allocator's 6.7 GiB fits; the process does not
    auto = capsys.readouterr().out.splitlines()[-1]
    assert auto.endswith(", above the 10.00 GiB budget: a shorter sequence, a smaller batch or int4 lowers it"), auto


def test_a_step_the_memory_cannot_hold_is_refused_with_what_would_fit():
    """8B QLoRA at 32K tokens plans ~27 GiB of process: on 20 GiB it is refused, naming the longest context that
    fits; a float base at batch 4 names the combination (full + int4 + batch 1) when no single change is enough."""
    options = dict(QLORA, task="causal_lm")
    memory.check_step_fits("llama3.1-8b", 1, 2048, available=20 * GiB, **options)  # ~11 GiB: goes on
    with pytest.raises(memory.DoesNotFit) as refused:
        memory.check_step_fits("llama3.1-8b", 1, 32768, available=20 * GiB, label="8B", **options)
    message = str(refused.value)
    assert message.startswith("Training 8B at batch 1 x sequence 32768 (full) needs a process of about ")
    assert "and 20.00 GiB is available now. Settings that fit: sequence length 16384: " in message, message
    with pytest.raises(memory.DoesNotFit) as refused:
        memory.check_step_fits("llama3.1-8b", 4, 4096, available=12 * GiB, label="8B",
                               **dict(options, checkpointing="none", quantize=None))
    hint = str(refused.value).split("Settings that fit: ")[1]
    assert hint.startswith("checkpointing 'full' + quantize 'int4' + batch size 1: ") and ";" not in hint, hint
