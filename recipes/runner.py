"""The training skeleton every recipe runs on (`run`), reading top to bottom: setup (the recipe, the cluster,
the recipe's kind), data (read and checked by the kind), the run's folder (run.json, the tokenizer), the model
and its optimizer (built, resumed from the last checkpoint), the loop (`fit` with validation and checkpoints),
the final model. What differs between recipes (their data, loss and metrics) is their kind's (recipes.kinds).

Everything that can be wrong with the input (file, columns, empty corpus, length,
an out_dir of another run) is checked before `out_dir` is touched. The run is one
`model.fit` over intervals of `log_every` steps (Keras "epochs"): each interval
ends with its mean loss (and validation loss), a TensorBoard summary at the true
step, and, every `checkpoint_every` steps, an atomic checkpoint of weights and
optimizer state. Started again on the same out_dir, a run restores the last
checkpoint and skips the batches already consumed, so it continues at the same
step, schedule position and data position.

Under a strategy (`strategy="mirrored"` or `"multi-worker"`, recipes.distribute) the
recipe's batch is the global batch, split across replicas; only the chief prepares
and writes out_dir, and the other workers read the chief's tokenizer and checkpoints
from it, so out_dir must be storage every host sees.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import keras
import tensorflow as tf

import zoo
from recipes import distribute, folder, kinds, optim, pretrained, state
from recipes.recipe import Recipe, get
from zoo import checks
from zoo.files import atomic_path, write_json
from zoo.loading import ADAPTER_DIR, BASE_FILE, MODEL_FILE, load_lora_run


@dataclass
class Result:
    out_dir: str
    start_step: int
    step: int
    history: list = field(default_factory=list)  # [{"step", "loss", "val_loss"?, "lr"}] per interval
    tokens_per_second: float = float("nan")
    peak_bytes: int = 0  # peak memory of training, by `peak_measure` (zoo.memory.measure)
    peak_measure: str = ""  # which figure peak_bytes is: TensorFlow's allocator peak, or peak RSS where none is kept
    max_rss_bytes: int = 0
    model: keras.Model | None = None
    data: dict | None = None  # supervised fine-tuning: rows an epoch, padding fraction (recipes.sft)


def run(recipe, data, out_dir, steps=None, column=None, label_column=None, data_dir=None,
        validation_every=0, validation_batches=8, callbacks=(), verbose="auto", hf_out=None,
        strategy=None, devices=None, merge=False, collective_timeout=None) -> Result:
    """Every recipe's run (`recipes.run`, which documents the arguments); its kind supplies data, loss, metrics."""
    # 1. Setup: the recipe stretched to `steps`, the cluster (before TensorFlow runs anything), the kind.
    recipe, cluster = begin(recipe, steps, strategy, devices, collective_timeout)
    kind = kinds.of(recipe)
    source = kinds.Source(data, column, label_column, data_dir, validation_every)
    kind.check(recipe, source)
    check_lengths(recipe)

    # 2. Data: read and checked by the kind, before out_dir is touched.
    examples = kind.read(recipe, source, out_dir)
    meta, base = folder.record(recipe, out_dir, examples.labels, merge, hf_out)
    if examples.data is not None:
        meta["data"] = examples.data
    check_memory(recipe)  # what the machine cannot hold, before anything is written, loaded or built

    # 3. The run's folder: the tokenizer (with the kind's chat files beside it) and run.json, by the chief.
    # Seed before any tokenizer exists: TensorFlow's seed call clears the eager kernel cache, and with it
    # the TF-text resource of a SentencePiece tokenizer made earlier (tf.data then fails: "Resource
    # localhost/_0_SentencepieceOp ... does not exist").
    keras.utils.set_random_seed(recipe.seed)
    tokenizer = None
    if cluster.chief:
        tokenizer = folder.write(recipe, out_dir, examples.corpus, meta, examples.beside_tokenizer)
    cluster.barrier()  # workers start once the chief's tokenizer, run.json and checkpoints are in place
    if kind.tokenizes:
        tokenizer = tokenizer or folder.chiefs_tokenizer(recipe, out_dir)

    # 4. Model and optimizer, resumed from the last checkpoint; what the kind does before the first step.
    model, start = restore(recipe, cluster, out_dir, base, len(examples.labels) if examples.labels else None)
    kind.before_fit(recipe, model, cluster, out_dir, examples)

    # 5. The loop: fit from `start`, validation and checkpoints every interval; the final model.
    train, valid = kind.datasets(recipe, examples, tokenizer, start * recipe.accumulation_steps, bool(cluster.kind))
    result = train_and_save(recipe, model, cluster, out_dir, start, cluster.distribute(train), valid,
                            validation_batches, validation_every, callbacks, verbose, base,
                            tokens_per_batch=examples.tokens_per_batch, logged=kind.logged)
    result.data = examples.data

    # 6. The Hugging Face folder, with the tokenizer (as saved with the chat files, which go beside it too).
    if hf_out and cluster.chief:
        if examples.beside_tokenizer is not None:
            tokenizer = folder.saved_tokenizer(recipe, out_dir)
        write_hf(recipe, model, out_dir, hf_out, tokenizer, examples.labels, merge)
        if examples.beside_tokenizer is not None:
            examples.beside_tokenizer(hf_out)
    return result


def begin(recipe, steps=None, strategy=None, devices=None, collective_timeout=None):
    """(recipe, cluster): the recipe stretched to `steps`, and the strategy's cluster, made first:
    a multi-worker strategy must exist before TensorFlow runs anything."""
    recipe = get(recipe) if not isinstance(recipe, Recipe) else recipe
    if recipe.lora_rank and recipe.weights is None:
        shape = f" ({recipe.name}: {recipe.spec.description})" if recipe.spec.description else ""
        raise ValueError(f"The recipe of {recipe.name!r} trains LoRA adapters, which adapt pretrained weights (a run "
                         "keeps only the adapters and a reference to them): pass weights= (--weights BASE), a Hugging "
                         f"Face folder{shape}.")
    if steps is not None and steps != recipe.steps:
        recipe = recipe.with_steps(steps)
    cluster = strategy
    if not isinstance(strategy, distribute.Cluster):
        cluster = distribute.make(strategy, devices, collective_timeout)
    cluster.check_batch(recipe.batch_size)
    return recipe, cluster


def check_lengths(recipe):
    spec = recipe.spec
    checks.sequence_length(recipe.sequence_length, spec.max_sequence_length, repr(recipe.name))
    if recipe.task == "masked_lm" and recipe.max_predictions > recipe.sequence_length - 2:
        raise ValueError(f"max_predictions={recipe.max_predictions} exceeds the {recipe.sequence_length - 2} "
                         "maskable positions of a row; lower max_predictions.")


def restore(recipe, cluster, out_dir, base=None, num_classes=None):
    """(model, first step): the recipe's model, built under the cluster's scope with its optimizer,
    and out_dir's last checkpoint restored into both (step 0 when there is none)."""
    with cluster.scope():
        model = build(recipe, num_classes)
        model.optimizer.build(model.trainable_variables)
        model = cluster.prepare(model)
        start, folder = state.restore_latest(out_dir, model, model.optimizer, base, chief=cluster.chief)
        if folder:
            print(f"Resuming {recipe.name} from step {start} ({folder}).")
    return model, start


def build(recipe, num_classes=None):
    """The recipe's model, compiled with its optimizer and loss.

    Args:
        recipe: a `Recipe`; with `weights`, the model starts from them.
        num_classes: for the classifier task (default: `model_overrides`' or 2).

    Returns:
        A compiled Keras model (float32 logits; `mixed_float16` gets Keras' dynamic
        loss scaling from compile; bfloat16 weights are built with the "bfloat16" policy); with
        `lora_rank`, LoRA on the weights, quantized first with `quantize` (zoo.lora).
    """
    recipe = choose_auto(recipe)
    overrides = dict(recipe.model_overrides)
    if recipe.task == "classifier":
        num_classes = num_classes or overrides.get("num_classes", 2)
        overrides["num_classes"] = num_classes
    if recipe.weights:
        model = pretrained.load_model(recipe, num_classes)
    else:
        model = zoo.get(recipe.model, checkpointing=recipe.checkpointing, dtype=recipe.dtype_policy,
                        task=recipe.task, **overrides)
    if recipe.quantize:
        zoo.quantization.quantize_base(model, recipe.quantize)
    if recipe.lora_rank:
        zoo.lora.enable_lora(model, recipe.lora_rank, recipe.alpha, recipe.targets)
    if recipe.task == "causal_lm":
        model.set_loss_chunk(recipe.loss_chunk)
    if recipe.fused:
        model.set_fused_update(True, recipe.fused_clip)
    if recipe.packing:
        model.set_packed(True)  # the padding mask numbers the examples of a row (recipes.sft_data)
    kind = kinds.of(recipe)
    kind.loss(model, recipe)  # preference tuning's step and reference (recipes.dpo)
    model.compile(
        optimizer=optim.optimizer(recipe, model),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        jit_compile=False,  # XLA was slower and larger on CPU (docs/design-notes.md)
        run_eagerly=kind.eager,
    )
    return model


def choose_auto(recipe) -> Recipe:
    """`checkpointing="auto"`: the fastest configuration the planner says fits the memory budget
    (none, selective, full, then full with the fused update; only fused ones when the recipe asks
    for fused); other recipes as they are."""
    if recipe.checkpointing != "auto":
        return recipe
    budget = zoo.memory.parse_bytes(recipe.memory_budget) if recipe.memory_budget else zoo.memory.default_budget()
    configs = [c for c in zoo.memory.CONFIGS if (c.endswith("+fused") or not recipe.fused)
               and not (c.endswith("+fused") and recipe.lora_rank)]
    config, estimate = zoo.memory.choose(recipe.spec, recipe.batch_size, recipe.sequence_length, budget,
                                         configs=configs, **plan_options(recipe))
    policy, _, fused = config.partition("+")
    print(f"checkpointing='auto': {config} (estimated {estimate.total / zoo.memory.GiB:.2f} GiB of a "
          f"{budget / zoo.memory.GiB:.1f} GiB budget)")
    return recipe.replace(checkpointing=policy, fused=bool(fused))


def plan_options(recipe) -> dict:
    """The planner's arguments (zoo.memory.estimate) for the recipe's step, its checkpointing aside."""
    return dict(precision=recipe.precision, task=recipe.task, optimizer=recipe.optimizer,
                accumulation_steps=recipe.accumulation_steps, weights_dtype=recipe.weights_dtype,
                loss_chunk=recipe.loss_chunk if recipe.task == "causal_lm" else None, lora_rank=recipe.lora_rank,
                lora_targets=recipe.targets, quantize=recipe.quantize, packed=recipe.packing)


def check_memory(recipe):
    """On a CPU, refuse a run whose process the machine's memory cannot hold (its planned peak RSS against the
    memory available now, or --memory-budget), before out_dir is touched or anything is loaded or built
    (zoo.memory.check_step_fits); `checkpointing="auto"` is checked at its lightest configuration. On a GPU the
    device's memory decides, which "auto" plans."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return
    available = zoo.memory.parse_bytes(recipe.memory_budget) if recipe.memory_budget else None
    policy = "full" if recipe.checkpointing == "auto" else recipe.checkpointing
    config = policy + ("+fused" if recipe.fused else "")
    zoo.memory.check_step_fits(recipe.spec, recipe.batch_size, recipe.sequence_length, available, repr(recipe.name),
                               checkpointing=config, **plan_options(recipe))


def train_and_save(recipe, model, cluster, out_dir, start, train_data, valid=None, validation_batches=8,
                   validation_every=0, callbacks=(), verbose="auto", base=None, tokens_per_batch=None,
                   logged=None) -> Result:
    """`fit` from `start` to the recipe's last step on the training batches (distributed) and the
    (undistributed) validation set, then the final model; `tokens_per_batch`: what tokens/s counts
    (default: every position of a batch); `logged(key)`: which of fit's logs the history keeps."""
    interval = math.gcd(min(recipe.log_every, recipe.steps), recipe.steps)
    result = Result(out_dir=out_dir, start_step=start, step=start, model=model)
    valid_steps = None
    if valid is not None:
        # fit keeps one validation iterator for the whole run: a known count over a repeated set
        # evaluates the same batches every interval, and never "runs out of data". The count is one pass
        # over the held-out batches; cached (a few batches), later intervals do not tokenize them again.
        valid = valid.take(validation_batches).cache()
        valid_steps = int(valid.reduce(0, lambda count, _: count + 1))
        if not valid_steps:
            raise ValueError(f"validation_every={validation_every} holds out too little text for one batch of "
                             f"{recipe.batch_size}; lower --validation-every or the batch size.")
        valid = cluster.distribute(valid.repeat())
    with cluster.writable(out_dir) as write_dir:  # out_dir on the chief, a scratch folder elsewhere
        final = _train(recipe, model, cluster, result, write_dir, train_data, valid, valid_steps, interval, start,
                       callbacks, verbose, base, tokens_per_batch, logged)
    print(f"{recipe.name}: steps {start} -> {result.step}; {result.tokens_per_second:,.0f} tokens/s; "
          f"peak memory {result.peak_bytes / 2**20:,.0f} MiB ({result.peak_measure}), "
          f"{result.max_rss_bytes / 2**20:,.0f} MiB RSS; "
          + (f"model saved to {final}" if cluster.chief else "a worker: the chief saves the model"))
    return result


def _train(recipe, model, cluster, result, write_dir, train, valid, valid_steps, interval, start, callbacks,
           verbose, base=None, tokens_per_batch=None, logged=None):
    """`fit` from `start` to the recipe's last step, then the final model.keras (a LoRA run: its
    adapters and base.json); returns its path."""
    k = recipe.accumulation_steps
    tracker = _Intervals(recipe, write_dir, interval, result, base, tokens_per_batch, logged)
    peak = zoo.memory.PeakMemory().reset()
    if start < recipe.steps:
        try:
            with cluster.scope():
                model.fit(
                    train, epochs=recipe.steps // interval, initial_epoch=start // interval,
                    steps_per_epoch=interval * k, validation_data=valid, validation_steps=valid_steps,
                    callbacks=[tracker, *cluster.callbacks(result.out_dir), *callbacks], verbose=verbose,
                    shuffle=False,  # the pipeline shuffles, seeded; fit's own shuffle only warns for a dataset
                )
        except distribute.PEER_ERRORS as error:
            if cluster.kind != "multi-worker":
                raise
            detail = (str(error).strip().splitlines() or [""])[0]
            cause = f"another worker died or became unreachable ({type(error).__name__}: {detail})"
            raise distribute.WorkerLost(distribute.lost_message(cause, result.out_dir)) from None
        if tracker.started is not None:
            result.tokens_per_second = tracker.tokens_per_second()
    peak.read()
    result.peak_bytes, result.peak_measure = peak.peak_bytes, peak.measure
    result.max_rss_bytes = zoo.memory.measure.max_rss_bytes()
    if base is not None:  # Keras' save would write merged (or integer) kernels and no adapters
        zoo.hub.save_adapter(model, os.path.join(write_dir, ADAPTER_DIR), overwrite=True, base=base["weights"])
        write_json(os.path.join(write_dir, BASE_FILE), base)
        return os.path.join(result.out_dir, ADAPTER_DIR)
    with atomic_path(os.path.join(write_dir, MODEL_FILE), overwrite=True) as tmp:
        model.save(tmp)
    return os.path.join(result.out_dir, MODEL_FILE)


class _Intervals(keras.callbacks.Callback):
    """Per-interval bookkeeping: history, TensorBoard scalars, checkpoints, throughput."""

    def __init__(self, recipe, out_dir, interval, result, base=None, tokens_per_batch=None, logged=None):
        super().__init__()
        self.recipe, self.out_dir, self.interval, self.result, self.base = recipe, out_dir, interval, result, base
        self.logged = logged or kinds.Kind().logged
        self.writer = tf.summary.create_file_writer(os.path.join(out_dir, "logs"))
        self.tokens_per_batch = tokens_per_batch or recipe.batch_size * recipe.sequence_length
        self.timed_batches, self.started, self.excluded, self.paused = 0, None, 0.0, None

    # Validation and checkpoint writing are not training: their time is excluded.
    def on_test_begin(self, logs=None):
        self.paused = time.perf_counter()

    def on_test_end(self, logs=None):
        self.excluded += time.perf_counter() - self.paused

    def on_train_batch_end(self, batch, logs=None):
        if self.started is None:  # the first batch includes tracing: time from its end
            self.started = time.perf_counter()
        else:
            self.timed_batches += 1

    def on_epoch_end(self, epoch, logs=None):
        step = (epoch + 1) * self.interval
        opt = self.model.optimizer
        lr = float(opt.learning_rate)
        row = {"step": step, "lr": lr, **{k: float(v) for k, v in (logs or {}).items() if self.logged(k)}}
        self.result.history.append(row)
        self.result.step = step
        with self.writer.as_default(step=step):
            for key, value in row.items():
                if key != "step":
                    tf.summary.scalar(key, value)
            if self.started is not None and self.timed_batches:
                tf.summary.scalar("tokens_per_second", self.tokens_per_second())
        self.writer.flush()
        every = self.recipe.checkpoint_every
        if step // every > (step - self.interval) // every or step == self.recipe.steps:
            began = time.perf_counter()
            state.save(self.out_dir, step, self.model, opt, keep=self.recipe.keep_checkpoints, base=self.base)
            self.excluded += time.perf_counter() - began

    def tokens_per_second(self):
        elapsed = time.perf_counter() - self.started - self.excluded
        return self.timed_batches * self.tokens_per_batch / elapsed if elapsed > 0 else float("nan")


def write_hf(recipe, model, out_dir, hf_out, tokenizer, labels, merge):
    """The final model as a Hugging Face folder; a LoRA run's as a PEFT adapter folder, or merged
    into its float base (never the quantized one: its merge would round once more)."""
    if not recipe.lora_rank:
        zoo.hub.save(model, hf_out, tokenizer=tokenizer, overwrite=True, labels=labels)
    elif merge:
        zoo.hub.save(load_lora_run(out_dir, merge=True), hf_out, tokenizer=tokenizer, overwrite=True, labels=labels)
    else:
        zoo.hub.save_adapter(model, hf_out, overwrite=True, tokenizer=tokenizer, base=recipe.weights)
