"""GRPO (online RL with verifiable rewards): what a LoRA GRPO step holds beside an SFT step of the same tokens,
and a real run.

    python benchmarks/grpo.py memory   [--model dec-base --prompts 2 --num-generations 8 --prompt-length 64
                                        --max-completion-length 192 --steps 2]
    python benchmarks/grpo.py real     [--steps 40 --batch-size 2 --num-generations 4 --held-out 200]

memory: each row a fresh process, LoRA r16 on every projection of an int4 base, `full` checkpointing, AdamW with
global clip 1.0, random weights of the registered shape (dec-base: SmolLM2-135M's), synthetic tokens:
  - sft: the chunked causal-LM loss on prompts x G rows of prompt + completion positions (the GRPO batch's tokens);
  - grpo: zoo.grpo's whole step on the same shape: G completions of each prompt sampled with the key/value cache
    (random weights never stop: every completion runs to the limit), the reference's log-probabilities with the
    adapters off (beta 0.04), then the update on the policy's, both a chunk of positions at a time.
Allocator peak (from before the build) against `zoo.memory.estimate` (`grpo=` for grpo), and the GRPO / SFT ratio.
real: SmolLM2-135M-Instruct (its GGUF, tools/assets.py smollm2) tuned by `zoo train --recipe grpo` with LoRA r16
on arithmetic word problems with integer answers the script generates (seeded): rewarded by
recipes.rewards:numeric_answer (the last `#### N` equals the answer) and, at weight 0.2,
recipes.rewards:final_answer_format (the reply ends on `#### N`). Held-out greedy accuracy (numeric_answer's) on
problems never trained on, before and after, with 95% Wilson intervals, and the run's reward curve.
Each part prints a table and one JSON line.
"""

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

import _harness
from _harness import GiB
from one_billion import RUNTIME_RSS

LORA = {"lora_rank": 16, "lora_targets": "all-linear", "quantize": "int4"}
INSTRUCTION = "\nEnd your reply with '#### ' and the number."
TEMPLATES = (  # (question, answer): small integers, one or two steps
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", lambda a, b, c: a + b),
    ("{name} had {a} stickers and gave {b} away. How many stickers are left?", lambda a, b, c: a - b),
    ("A box holds {c} pens. How many pens are in {b} boxes?", lambda a, b, c: b * c),
    ("{name} reads {b} pages a day for {c} days. How many pages is that?", lambda a, b, c: b * c),
    ("{name} has {a} coins, finds {b} more and spends {c}. How many coins are left?", lambda a, b, c: a + b - c),
)
NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Max", "Zoe")


def measure(kind, model, prompts, generations, prompt_length, completion_length, precision, steps):
    """One row in this (child) process: `kind` "sft" (prompts x G rows of prompt + completion positions) or "grpo"
    (zoo.grpo's step on `prompts` prompts: sampling, the reference's scores, the update)."""
    import numpy as np
    import tensorflow as tf
    from _training import compiled_model, synthetic_batch, train_steps

    import zoo

    seq, rows = prompt_length + completion_length, prompts * generations
    tf.config.experimental.reset_memory_stats("CPU:0")
    m = compiled_model(model, "full", precision, seq, optimizer="adamw", clip=1.0, **LORA)
    if kind == "sft":
        x, y = synthetic_batch(model, rows, seq)
        with _harness.PeakMemory() as mem:
            times, _, losses = train_steps(m, x, y, steps)
        sampled = None
    else:
        rng = np.random.default_rng(0)
        ids = rng.integers(3, zoo.spec(model).vocab_size, (prompts, prompt_length), dtype="int32")
        settings = zoo.grpo.Grpo(beta=0.04, num_generations=generations, max_completion_length=completion_length)

        def score(indices, sampled):  # random rewards: every group has a spread
            rewards = rng.normal(size=len(indices)).astype("float32")
            return rewards[:, None], rewards

        step = zoo.grpo.GrpoStep(settings, list(ids), score, ["random"])
        with _harness.PeakMemory() as sampled:  # the sampling phase alone (random weights run to the limit)
            zoo.grpo.sample(m, list(ids), settings, seed=0)
        times, losses = [], []
        with _harness.PeakMemory() as mem:
            for _ in range(steps):
                began = time.perf_counter()
                losses.append(float(step.train_step(m, {"rows": np.arange(prompts)})["loss"]))
                times.append(time.perf_counter() - began)
    return {"built_gib": mem.base_gib, "alloc_peak_gib": mem.peak_gib, "step_mem_gib": mem.step_gib,
            "sample_peak_gib": sampled.peak_gib if sampled else None, "peak_rss_gib": mem.rss_gib,
            "memory_measure": mem.measure, "first_step_s": times[0],
            "step_s": min(times[1:]) if len(times) > 1 else times[0], "losses": losses}


def _memory(a):
    from zoo import memory

    budget = _harness.available_bytes() - int(1.0 * GiB)
    seq, rows = a.prompt_length + a.max_completion_length, a.prompts * a.num_generations
    print(f"{a.model}, LoRA r16 all-linear on int4, full, {a.precision}: {a.prompts} prompts x {a.num_generations} "
          f"completions, {a.prompt_length} + {a.max_completion_length} positions (sft: {rows} rows x {seq})",
          flush=True)
    print(f"{'step':5s} {'est GiB':>8s} {'gen est':>8s} {'alloc':>7s} {'sample':>7s} {'ratio':>6s} {'RSS':>6s} "
          f"{'s/step':>7s}  status", flush=True)
    results = {}
    for kind in a.kinds.split(","):
        grpo = {"grpo": a.num_generations, "completion_length": a.max_completion_length} if kind == "grpo" else {}
        est = memory.estimate(a.model, a.prompts if grpo else rows, seq, a.precision, "full", task="causal_lm",
                              **grpo, **LORA)
        child = {"kind": kind, "model": a.model, "prompts": a.prompts, "generations": a.num_generations,
                 "prompt_length": a.prompt_length, "completion_length": a.max_completion_length,
                 "precision": a.precision, "steps": a.steps}
        row = {**child, "estimate_gib": est.total / GiB, "estimate": est.as_dict()}
        row.update(_harness.run_if_it_fits(child, est.total + RUNTIME_RSS, budget, timeout=a.timeout))
        results[kind] = row
        generation = est.weights + est.optimizer + est.generation
        if row["status"] == "ok":
            sample = f"{row['sample_peak_gib']:7.2f}" if row["sample_peak_gib"] is not None else f"{'-':>7s}"
            cells = (f"{row['alloc_peak_gib']:7.2f} {sample} {row['alloc_peak_gib'] * GiB / est.total:6.2f} "
                     f"{row['guard_rss_gib']:6.2f} {row['step_s']:7.1f}")
        else:
            cells = " ".join(f"{'-':>{w}s}" for w in (7, 7, 6, 6, 7))
        gen = f"{generation / GiB:8.2f}" if grpo else f"{'-':>8s}"
        print(f"{kind:5s} {est.total / GiB:8.2f} {gen} {cells}  {row['status']}", flush=True)
    ratio = None
    if len(results) == 2 and all(r["status"] == "ok" for r in results.values()):
        ratio = results["grpo"]["alloc_peak_gib"] / results["sft"]["alloc_peak_gib"]
        print(f"grpo / sft allocator peak: {ratio:.2f} (goal <= 1.3); alloc / estimate: "
              + ", ".join(f"{k} {r['alloc_peak_gib'] / r['estimate_gib']:.2f}" for k, r in results.items())
              + " (goal within 10%)")
    return {"benchmark": "grpo_memory", "budget_gib": budget / GiB, "grpo_over_sft": ratio, "results": results}


def problems(count, seed, exclude=()) -> list:
    """{"prompt": [user: a word problem + INSTRUCTION], "answer": int}, seeded; none of `exclude`'s questions."""
    rng, rows, seen = random.Random(seed), [], set(exclude)
    while len(rows) < count:
        template, answer = rng.choice(TEMPLATES)
        a, b, c = rng.randint(10, 40), rng.randint(2, 9), rng.randint(2, 9)
        question = template.format(name=rng.choice(NAMES), a=a, b=b, c=c)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"prompt": [{"role": "user", "content": question + INSTRUCTION}], "answer": answer(a, b, c)})
    return rows


def wilson(hits, n, z=1.96) -> tuple:
    """The 95% Wilson score interval of a proportion."""
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def accuracy(model, chat, rows, max_new_tokens, batch=64) -> dict:
    """Greedy answers to `rows`, scored by recipes.rewards.numeric_answer: hits, accuracy, its Wilson interval, and
    how many answers end on `#### N` (final_answer_format)."""
    import zoo
    from recipes.rewards import final_answer_format, numeric_answer

    answers = []
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        answers += zoo.generation.generate(model, messages=[r["prompt"] for r in part], chat=chat,
                                          max_new_tokens=max_new_tokens)
    hits = int(sum(numeric_answer(None, answers, [r["answer"] for r in rows])))
    formatted = int(sum(final_answer_format(None, answers)))
    low, high = wilson(hits, len(rows))
    return {"hits": hits, "n": len(rows), "accuracy": hits / len(rows), "ci95": [low, high],
            "formatted": formatted, "examples": answers[:3]}


def _real(a):
    from dpo import _scalars

    import zoo
    from zoo.chat import Chat

    began = time.perf_counter()
    work = Path(a.work or tempfile.mkdtemp(prefix="grpo-real-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "SmolLM2-135M-Instruct"
    if not folder.is_dir():
        zoo.hub.convert_gguf(_harness.fetch("smollm2")["smollm2"], folder)
    held_out = problems(a.held_out, a.seed + 1)
    train = problems(a.train_problems, a.seed, exclude={r["prompt"][0]["content"][:-len(INSTRUCTION)]
                                                        for r in held_out})
    data = work / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    chat = Chat.find(folder)
    before = accuracy(zoo.hub.load(str(folder), tokenizer=False), chat, held_out, a.max_completion_length)
    print(f"held-out greedy accuracy before: {before['accuracy']:.3f} ({before['hits']}/{before['n']})", flush=True)
    out = work / "run"
    flags = ["train", "--recipe", "grpo", "--weights", folder, "--data", data, "--out-dir", out, "--steps", a.steps,
             "--batch-size", a.batch_size, "--sequence-length", a.sequence_length, "--learning-rate", a.learning_rate,
             "--precision", "float32", "--checkpointing", a.checkpointing, "--lora-rank", 16, "--lora-targets",
             "all-linear", "--rewards", "recipes.rewards:numeric_answer,recipes.rewards:final_answer_format",
             "--reward-weights", "1,0.2", "--num-generations", a.num_generations, "--max-completion-length",
             a.max_completion_length, "--beta", a.beta, "--log-every", a.log_every, "--checkpoint-every", a.steps]
    print("zoo " + " ".join(map(str, flags)), flush=True)
    seconds, _, result = _harness.zoo_cli(*flags)
    after = accuracy(zoo.load(str(out)), chat, held_out, a.max_completion_length)
    logs = _scalars((out / "logs").glob("events.out.tfevents.*"))
    names = ("reward", "rewards/numeric_answer/mean", "rewards/final_answer_format/mean", "completions/mean_length",
             "completions/clipped_ratio", "entropy", "tokens_per_second/generation", "tokens_per_second/training")
    print(f"{a.train_problems} training problems, {a.held_out} held out; {a.steps} steps of {a.batch_size} prompts x "
          f"{a.num_generations} completions (<= {a.max_completion_length} tokens), lr {a.learning_rate}, beta "
          f"{a.beta}; training {seconds:.0f} s, the whole run {time.perf_counter() - began:.0f} s")
    print(f"{'step':>5s} {'reward':>7s} {'correct':>8s} {'format':>7s} {'length':>7s} {'cut':>5s} {'entropy':>8s} "
          f"{'gen tok/s':>9s} {'train tok/s':>11s}")
    curve = []
    for step, entry in sorted(logs.items()):
        row = {"step": step, **{k: entry.get(k, float("nan")) for k in names}}
        curve.append(row)
        print(f"{step:5d} " + " ".join(f"{row[k]:{w}.{p}f}" for k, w, p in zip(
            names, (7, 8, 7, 7, 5, 8, 9, 11), (3, 3, 3, 1, 2, 3, 0, 0))))
    print(f"{'':8s} {'accuracy':>8s} {'95% CI':>15s} {'ends #### N':>11s}")
    for name, score in (("before", before), ("after", after)):
        low, high = score["ci95"]
        print(f"{name:8s} {score['accuracy']:8.3f}   [{low:.3f}, {high:.3f}] {score['formatted']:7d}/{score['n']}")
    for name, score in (("before", before), ("after", after)):
        print(f"{name}: {score['examples'][:2]!r}")
    return {"benchmark": "grpo_real", "model": "SmolLM2-135M-Instruct", "steps": a.steps, "batch_size": a.batch_size,
            "num_generations": a.num_generations, "max_completion_length": a.max_completion_length,
            "learning_rate": a.learning_rate, "beta": a.beta, "train_seconds": seconds,
            "run_seconds": time.perf_counter() - began, "before": before, "after": after, "curve": curve,
            "tokens_per_second": result.get("tokens_per_second")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("part", choices=("memory", "real"))
    p.add_argument("--model", default="dec-base", help="memory: the registered shape (random weights)")
    p.add_argument("--prompts", type=int, default=2, help="memory: prompts per step")
    p.add_argument("--prompt-length", type=int, default=64, help="memory: prompt positions")
    p.add_argument("--precision", default="float32", help="memory: the dtype policy")
    p.add_argument("--kinds", default="sft,grpo", help="memory: the rows to measure")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--work", help="real: a folder to keep the converted model, data and run in (default: a temp one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="memory: steps per row (2); real: optimizer steps (40)")
    p.add_argument("--batch-size", type=int, default=2, help="real: prompts per step")
    p.add_argument("--num-generations", type=int, default=None, help="memory: 8; real: 4")
    p.add_argument("--max-completion-length", type=int, default=None, help="memory: 192; real: 32")
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--checkpointing", default="none")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--train-problems", type=int, default=2000)
    p.add_argument("--held-out", type=int, default=200)
    a = p.parse_args()
    if a.part == "memory":
        a.steps, a.max_completion_length = a.steps or 2, a.max_completion_length or 192
        a.num_generations = a.num_generations or 8
        result = _memory(a)
    else:
        a.steps, a.max_completion_length = a.steps or 40, a.max_completion_length or 32
        a.num_generations = a.num_generations or 4
        result = _real(a)
    print(json.dumps(result))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
