"""Recipes: every registered recipe trains on real text; the optimizer does what
the recipe says (schedule, clipping, loss scaling, accumulation); bad input fails
before training with nothing in out_dir changed."""

import csv
import glob
import itertools
import json
import math
import os

import keras
import numpy as np
import pytest

import recipes
import zoo
from recipes import optim, state
from tests.common import tiny_recipe
from zoo.files import write_json

ONE_LAYER = dict(num_layers=1, hidden_dim=32, num_heads=2, num_kv_heads=1, intermediate_dim=64, vocab_size=256)


def test_every_registered_model_has_a_recipe():
    for name in zoo.names():
        recipe = recipes.get(name)
        assert recipe.model == name
        assert recipe.task == ("causal_lm" if zoo.spec(name).is_decoder else "masked_lm")
        assert recipe.sequence_length <= zoo.spec(name).max_sequence_length
    assert recipes.get("classify", model="enc-mini").task == "classifier"
    with pytest.raises(ValueError, match="needs an encoder model; 'dec-base' is a llama decoder"):
        recipes.get("classify", model="dec-base")
    with pytest.raises(ValueError, match="needs a decoder model; 'modernbert-base' is a modernbert encoder"):
        recipes.get("finetune-lm", model="modernbert-base")


CONFIGURATION = ("task", "precision", "checkpointing", "optimizer", "fused", "decay")


def shrunk_configurations():
    """Recipes enough that each value of each field a shrunk run can tell apart trains once: shrinking
    makes every model the same tiny shape with one micro-batch per update, so recipes that agree on these
    fields train the same code (enc-mini as enc-base; finetune-lm as dec-base, at another learning rate).
    Fields are covered one at a time, not crossed: a checkpointing policy gives the same gradients and
    weights as none (tests/zoo/test_recompute.py: test_gradients_equal_*, test_fit_reaches_same_weights),
    so each policy trains a recipe once (none: classify; full: dec-1b, enc-1b; selective: dec-large) and
    every recipe builds with its own and takes a step in test_every_recipe.py. Recipes that only train
    pretrained weights on chat rows or pairs (sft, dpo, the 3B-8B models' LoRA) train in test_sft.py,
    test_dpo.py and test_lora_recipes.py."""
    covered, kept = set(), []
    for name in sorted(recipes.names()):
        recipe = recipes.get(name)
        values = {(field, getattr(recipe, field)) for field in CONFIGURATION}
        if not recipe.from_weights and not values <= covered:
            covered |= values
            kept.append(name)
    return kept


@pytest.mark.parametrize("name", shrunk_configurations())
def test_recipe_trains_on_real_text(name, tmp_path, recipes_news, recipes_reuters, recipes_vocab):
    """>= 20 steps of the recipe (model shrunk, its optimizer/precision/checkpointing
    kept) on the news corpus (Reuters R8 for classify): the loss falls."""
    recipe = recipes.get(name)
    family = "llama" if recipe.task == "causal_lm" else "bert"
    # The references' learning rates are for 100M+ models and 10k-step warmups; a
    # tiny model in 20 steps needs a larger one to move measurably. One block: these
    # families' blocks are all alike (the layer rhythms of the newer ones train below),
    # and each run traces ~25% faster than with two.
    recipe = tiny_recipe(name, learning_rate=max(recipe.learning_rate, 1e-3), vocabulary=recipes_vocab[family])
    recipe = recipe.replace(model_overrides={**recipe.model_overrides, "num_layers": 1})
    if recipe.task == "classifier":
        result = recipes.run(recipe, recipes_reuters, str(tmp_path), column="text", label_column="label", verbose=0)
    else:
        result = recipes.run(recipe, recipes_news, str(tmp_path), column="text", verbose=0)
    losses = [row["loss"] for row in result.history]
    assert [row["step"] for row in result.history] == [10, 20]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.05, losses
    assert os.path.isfile(tmp_path / "model.keras")
    assert [step for step, _ in state.checkpoints(str(tmp_path))] == [10, 20]
    assert result.model.checkpointing == recipe.checkpointing
    assert result.model.dtype_policy.name == recipe.precision


@pytest.mark.parametrize("name", ["modernbert-base", "gemma3-1b"])
def test_newer_families_train_with_their_recipe(name, tmp_path, recipes_news, recipes_vocab):
    """ModernBERT's masked LM takes no segment ids and trains BERT's WordPiece; Gemma 3 (sandwich norms,
    Q/K norms, a scaled embedding, local layers) trains Llama's byte-level BPE: the loss falls."""
    recipe = recipes.get(name)
    # 20 steps at 3e-3: a masked LM sees 40 predictions a step, and 10 steps at 1e-3 fell by only
    # 0.04-0.05 (failed CI at stop 28); these settings fall by ~0.35.
    recipe = tiny_recipe(name, steps=20, learning_rate=3e-3, log_every=10,
                         vocabulary=recipes_vocab[recipes.vocab.family_of(recipe.spec)])
    result = recipes.run(recipe, recipes_news, str(tmp_path), column="text", verbose=0)
    losses = [row["loss"] for row in result.history]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.05, losses
    assert result.model.spec.family == zoo.spec(name).family


def _formula(t, peak, warmup, steps, decay, floor):
    if t < warmup:
        return peak * t / warmup
    p = min(max((t - warmup) / (steps - warmup), 0.0), 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * p)) if decay == "cosine" else 1 - p
    return peak * (floor + (1 - floor) * shape)


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_schedule_matches_the_formula(decay):
    recipe = recipes.get("dec-1b", decay=decay, warmup_steps=100, steps=1000, learning_rate=4e-4, min_lr_ratio=0.1,
                         accumulation_steps=1)
    lr = optim.schedule(recipe)
    for t in (0, 1, 50, 99, 100, 101, 400, 999, 1000, 1500):
        assert float(lr(t)) == pytest.approx(_formula(t, 4e-4, 100, 1000, decay, 0.1), rel=1e-5, abs=1e-12)
    # With accumulation the optimizer counts micro-batches; the schedule counts updates.
    accumulated = optim.schedule(recipe.replace(accumulation_steps=4))
    for t in (0, 3, 4, 401, 4000):
        assert float(accumulated(t)) == pytest.approx(_formula(t // 4, 4e-4, 100, 1000, decay, 0.1), rel=1e-5)


def test_with_steps_keeps_the_warmup_fraction():
    recipe = recipes.get("enc-base").with_steps(2000)
    assert (recipe.steps, recipe.warmup_steps) == (2000, 20)  # 10k of 1M


def _adam(grads, lr, b1, b2, eps):
    m = v = 0.0
    w = np.zeros_like(grads[0])
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return w


def test_clipnorm_is_applied_to_the_global_norm():
    """Two variables with gradient norms far apart: global-norm clipping scales both by
    min(1, 1 / sqrt(|g_kernel|² + |g_bias|²)); clipping each variable on its own norm
    (Keras' `clipnorm`) would leave the small bias gradient alone. Checked against
    numpy Adam after each kind of clipping."""
    recipe = recipes.get("dec-base", warmup_steps=0, steps=10**6, weight_decay=0.0, clipnorm=1.0, epsilon=1e-8,
                         accumulation_steps=1)
    layer = keras.layers.Dense(3, kernel_initializer="zeros", bias_initializer="zeros")
    model = keras.Sequential([keras.Input((2,)), layer])
    opt = optim.optimizer(recipe, model)
    rng = np.random.default_rng(0)
    # (kernel, bias) gradients per step; norms (0.93, 0.88), (0.60, 0.29), (5.78, 0.53): in step 1 each
    # variable's norm is below 1 but their global norm (1.28) is not.
    raw = [(rng.normal(size=(2, 3)) * k, rng.normal(size=(3,)) * b) for k, b in ((1.0, 0.5), (0.2, 0.3), (3.0, 0.45))]
    raw = [tuple(g.astype("float32") for g in step) for step in raw]
    for kernel_grad, bias_grad in raw:
        opt.apply_gradients([(kernel_grad, layer.kernel), (bias_grad, layer.bias)])

    def adam(grads):
        return _adam(grads, 3e-3, recipe.beta_1, recipe.beta_2, recipe.epsilon)  # dec-base's peak lr

    def off(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    factors = [min(1.0, 1.0 / np.sqrt(sum(np.sum(g.astype("float64") ** 2) for g in step))) for step in raw]
    assert 0.7 < factors[0] < 0.8 and factors[1] == 1.0 and factors[2] < 0.2
    expected = [adam([step[i] * f for step, f in zip(raw, factors)]) for i in (0, 1)]
    per_variable = [adam([step[i] * min(1.0, 1.0 / np.linalg.norm(step[i])) for step in raw]) for i in (0, 1)]
    got = [np.asarray(layer.kernel), np.asarray(layer.bias)]
    errors = {name: off(g, e) for name, g, e in zip(("kernel", "bias"), got, expected)}
    assert max(errors.values()) < 2e-4, f"not the global-norm clip: relative error per variable {errors}"
    # The check can tell: per-variable clipping (or none) gives other weights.
    assert min(off(p, e) for p, e in zip(per_variable, expected)) > 0.05
    assert min(off(adam([step[i] for step in raw]), e) for i, e in enumerate(expected)) > 0.05


def test_weight_decay_skips_norms_and_biases():
    model = recipes.build(tiny_recipe("enc-base"))
    opt = model.optimizer
    decayed = {v.path for v in model.trainable_variables if opt._use_weight_decay(v)}
    assert decayed and all(len(v.shape) == 2 for v in model.trainable_variables if v.path in decayed)
    assert not any(("norm" in p) or p.endswith("bias") for p in decayed)


def _batches(recipe, n, seed=0):
    rng = np.random.default_rng(seed)
    vocab = recipe.spec.vocab_size
    rows = rng.integers(0, vocab, (n, recipe.batch_size, recipe.sequence_length + 1)).astype("int32")
    return [({"token_ids": r[:, :-1], "padding_mask": np.ones_like(r[:, :-1])}, r[:, 1:]) for r in rows]


def test_gradient_accumulation_equals_one_large_batch():
    """k=4 micro-batches of 2 with Keras' gradient_accumulation_steps give the same
    update as one batch of 8 (equal token counts, so the mean of means is the mean).
    Adam's epsilon is raised to 1e-3: at 1e-8 Adam's first steps are sign(g), and a
    near-zero gradient coordinate's float32 summation-order noise flips its sign."""
    base = tiny_recipe("dec-base", precision="float32", warmup_steps=0, steps=100, batch_size=2, learning_rate=1e-2,
                epsilon=1e-3, model_overrides=ONE_LAYER)
    micro = base.replace(accumulation_steps=4)
    keras.utils.set_random_seed(0)
    small, large = recipes.build(micro), recipes.build(base.replace(batch_size=8))
    large.set_weights(small.get_weights())
    start = [np.array(w) for w in small.get_weights()]
    for step in range(2):  # two full updates
        batches = _batches(micro, 4, seed=step)
        for x, y in batches:
            small.train_on_batch(x, y)
        big_x = {k: np.concatenate([x[k] for x, _ in batches]) for k in batches[0][0]}
        large.train_on_batch(big_x, np.concatenate([y for _, y in batches]))
    assert int(small.optimizer.iterations) == int(large.optimizer.iterations) == 2
    moved = max(np.abs(a - b).max() for a, b in zip(small.get_weights(), start))
    assert moved > 1e-3
    for a, b in zip(small.get_weights(), large.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_mixed_float16_scales_the_loss_and_skips_non_finite_steps():
    recipe = tiny_recipe("dec-base", precision="mixed_float16", warmup_steps=0, steps=100, model_overrides=ONE_LAYER)
    model = recipes.build(recipe)
    opt = model.optimizer
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    (x, y), = _batches(recipe, 1)
    model.train_on_batch(x, y)  # builds everything
    before = [np.array(w) for w in model.get_weights()]
    scale = float(opt.dynamic_scale)
    poisoned = np.full(y.shape, np.inf, "float32")  # an infinite loss: non-finite gradients
    model.train_on_batch(x, y, sample_weight=poisoned)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)  # the step was skipped, nothing corrupted
    assert float(opt.dynamic_scale) == scale / 2
    model.train_on_batch(x, y)
    after = model.get_weights()
    assert all(np.isfinite(w).all() for w in after)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(after, before))


# ----------------------------------------------------------------------------- bad input
def _snapshot(folder):
    return {p: open(os.path.join(folder, p), "rb").read() for p in os.listdir(folder)
            if os.path.isfile(os.path.join(folder, p))}


def test_bad_input_fails_before_training(tmp_path, recipes_news, recipes_vocab):
    recipe = tiny_recipe("enc-base", vocabulary=recipes_vocab["bert"])
    out = str(tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        recipes.run(recipe, str(tmp_path / "missing.txt"), out)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    with pytest.raises(ValueError, match="holds no text"):
        recipes.run(recipe, str(empty), out)
    with pytest.raises(ValueError, match="'body' is not in .*columns are: article_id"):
        recipes.run(recipe, recipes_news, out, column="body")
    with pytest.raises(ValueError, match="sequence_length=600 is above the 512 positions of 'enc-base'"):
        recipes.run(recipe.replace(sequence_length=600), recipes_news, out)
    assert not os.path.exists(out)

    # An out_dir holding another model's run is refused and left as it was.
    other = tiny_recipe("dec-base")
    os.makedirs(out)
    write_json(os.path.join(out, state.RUN_FILE), {
        "model": other.model, "task": other.task, "spec": other.spec.to_dict(), "recipe": other.to_dict(),
        "labels": None})
    os.makedirs(os.path.join(out, state.CHECKPOINTS, "step-000000002"))  # a run to resume, not a fresh start
    before = _snapshot(out)
    with pytest.raises(ValueError, match="holds a checkpoint of another model \\('dec-base'"):
        recipes.run(recipe, recipes_news, out, column="text")
    assert _snapshot(out) == before and sorted(os.listdir(out)) == sorted([state.RUN_FILE, state.CHECKPOINTS])


def _zoo(argv):
    """`zoo ARGV` with the train command registered as the entry point does it."""
    import argparse

    from recipes import cli

    parser = argparse.ArgumentParser(prog="zoo")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_train_and_eval_are_installed_entry_points_of_the_zoo_command():
    """The installed metadata (not pyproject's text) names the commands, and loading them
    adds working subcommands to zoo's own parser: what `zoo train` / `zoo eval` run."""
    from importlib.metadata import entry_points

    from zoo.cli import build_parser

    commands = {entry.name: entry for entry in entry_points(group="zoo.commands")}
    assert {"train", "eval"} <= set(commands)
    from recipes import cli

    assert commands["train"].load() is cli.register and commands["eval"].load() is cli.register_eval
    parser = build_parser()
    args = parser.parse_args(["train", "enc-mini", "--data", "x.txt", "--steps", "3"])
    assert args.func is cli._train and args.steps == 3
    assert parser.parse_args(["eval", "runs/x", "--data", "y.txt"]).func is cli._eval


def test_cli_train_resolves_the_recipe_and_names_bad_input(tmp_path, capsys):
    """`zoo train ... --show` prints the recipe the flags resolve to; a missing file
    fails with the path in the message (zoo.cli.main prints it and exits 2)."""
    out = str(tmp_path / "cli")
    args = ["train", "enc-mini", "--recipe", "classify", "--data", "x.csv", "--out-dir", out, "--steps", "400",
            "--batch-size", "4", "--sequence-length", "64", "--precision", "float32", "--override", "num_layers=2"]
    assert _zoo(args + ["--show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["task"], shown["model"], shown["steps"], shown["warmup_steps"]) == ("classifier", "enc-mini", 400, 40)
    assert (shown["batch_size"], shown["precision"], shown["model_overrides"]) == (4, "float32", {"num_layers": 2})
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        _zoo(["train", "dec-base", "--data", str(tmp_path / "nope.csv"), "--out-dir", out])
    assert not os.path.exists(out)


def tensorboard_scalars(logdir):
    """{tag: {step: value}} of the scalars in the TensorBoard event files under `logdir`."""
    import tensorflow as tf

    scalars = {}
    for path in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def test_zoo_train_end_to_end(tmp_path, recipes_news, capsys):
    """`zoo train` as the README runs it (zoo.cli.main in this process: the installed
    entry point is test_train_and_eval_are_installed_entry_points_of_the_zoo_command's),
    on a .tsv of 300 real news articles: a byte-level BPE vocabulary is trained on the
    corpus first, a tiny decoder trains 6 steps with every 5th document held out for
    validation. Checked: the JSON line, model.keras (loads, with the overridden shape),
    the tokenizer, TensorBoard scalars (loss, val_loss, lr, tokens/s) at every interval,
    and only the last keep_checkpoints=2 checkpoints kept."""
    from zoo.cli import main

    tsv = tmp_path / "news.tsv"
    with open(recipes_news, newline="", encoding="utf-8") as f:
        articles = list(itertools.islice(csv.DictReader(f), 300))
    with open(tsv, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["title", "body"])
        writer.writerows([a["title"], a["text"]] for a in articles)
    out = tmp_path / "run"
    shape = dict(num_layers=1, hidden_dim=32, num_heads=2, num_kv_heads=1, intermediate_dim=64, vocab_size=512)
    args = ["train", "dec-base", "--data", str(tsv), "--text-column", "body", "--out-dir", str(out), "--steps", "6",
            "--batch-size", "4", "--accumulation-steps", "1", "--sequence-length", "32", "--validation-every", "5",
            "--log-every", "2", "--checkpoint-every", "2", "--precision", "float32", "--learning-rate", "3e-3"]
    args += [arg for key, value in shape.items() for arg in ("--override", f"{key}={value}")]
    capsys.readouterr()
    code = main(args)
    stdout, stderr = capsys.readouterr()
    assert code == 0, stdout[-2000:] + stderr[-3000:]
    assert "Training a byte-level BPE vocabulary of 512 tokens on the corpus" in stdout
    line = json.loads(stdout.strip().splitlines()[-1])
    assert (line["model"], line["steps"]) == ("dec-base", 6)
    assert math.isfinite(line["final_loss"]) and line["tokens_per_second"] > 0 and line["peak_bytes"] > 0

    model = keras.models.load_model(out / "model.keras")
    assert model.task == "causal_lm" and all(getattr(model.spec, k) == v for k, v in shape.items())
    assert sorted(os.listdir(out / "tokenizer")) == ["merges.txt", "vocab.json"]
    assert json.loads((out / state.RUN_FILE).read_text())["recipe"]["steps"] == 6
    assert [step for step, _ in state.checkpoints(str(out))] == [4, 6]  # keep_checkpoints=2 pruned step 2

    scalars = tensorboard_scalars(str(out / "logs"))
    assert {"loss", "val_loss", "lr", "tokens_per_second"} <= set(scalars), sorted(scalars)
    for tag in ("loss", "val_loss", "lr"):
        assert sorted(scalars[tag]) == [2, 4, 6], (tag, scalars[tag])
        assert all(math.isfinite(v) for v in scalars[tag].values()), (tag, scalars[tag])
    assert scalars["loss"][6] == pytest.approx(line["final_loss"], rel=1e-6)


def test_run_json_of_an_older_version_reads_with_todays_task_names(tmp_path):
    """Runs written before the task names were unified ("mlm", "clm", "classify") still resume."""
    import json

    from recipes import state

    (tmp_path / state.RUN_FILE).write_text(json.dumps({"task": "mlm", "recipe": {"task": "clm"}}))
    run = state.read_run(str(tmp_path))
    assert (run["task"], run["recipe"]["task"]) == ("masked_lm", "causal_lm")
