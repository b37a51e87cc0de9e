"""`zoo train MODEL --data FILE`: run a model's recipe from the command line.

Registered with the `zoo.commands` entry-point group (pyproject.toml), so `zoo`
itself never imports this package.
"""

import ast
import dataclasses
import json
import math
import sys
from pathlib import Path

from recipes.recipe import Recipe, refuse_if_foreign, section_of
from zoo.cli.generate import json_object


def _override(text):
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--override takes KEY=VALUE (e.g. num_layers=2), got {text!r}.")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


_TYPES = {"int": int, "float": float, "str": str, "dict": json_object}  # a field's type, as its annotation starts


def recipe_flags() -> list:
    """The `Recipe` fields that `zoo train` offers as flags (each section's `option(..., cli=True)`)."""
    return [f for f in dataclasses.fields(Recipe) if f.metadata.get("cli")]


def flag(name) -> str:
    return "--" + name.replace("_", "-")


def add_recipe_flags(parser):
    """One flag per recipe field, grouped by the `Recipe` section that defines it: its type from the field's
    annotation (a bool is a switch), its help and choices from the field's `option`, so that a new field or
    loss shows in --help with no edit here."""
    groups = {}
    for f in recipe_flags():
        section = section_of(f.name)
        if section not in groups:
            groups[section] = parser.add_argument_group(f"recipe: {section.__name__}", section.__doc__.split("\n")[0])
        kind = f.type.split("|")[0].strip()
        options = dict(f.metadata["argparse"], help=f.metadata["help"])
        if kind == "bool":
            groups[section].add_argument(flag(f.name), action="store_true", default=None, **options)
        else:
            groups[section].add_argument(flag(f.name), type=_TYPES[kind], **options)


def refuse_foreign_flags(recipe, changes):
    """A flag of a section that `recipe` does not read is refused by name even at its default value (the Recipe
    itself refuses only values away from their defaults, all the API can tell apart)."""
    for name in changes:
        refuse_if_foreign(recipe, name)


def register(subparsers):
    p = subparsers.add_parser("train", help="train a model with its recipe (resumes in the same --out-dir)")
    p.add_argument("model", nargs="?", default=None,
                   help="a registered model (zoo list); optional with --weights, which say what the model is")
    p.add_argument("--data", required=True, help=".txt (one document a line), .csv/.tsv, .jsonl, or tfds:NAME[:SPLIT]; "
                   "--recipe sft: JSONL rows of messages, prompt/completion or text")
    p.add_argument("--weights", help="start from these pretrained weights: a Hugging Face folder or Hub repo id "
                   "(their tokenizer is used)")
    p.add_argument("--out-dir", help="where checkpoints, logs and model.keras go (default: runs/MODEL)")
    p.add_argument("--hf-out", help="also write the final model as a Hugging Face folder here (a LoRA run: a PEFT "
                   "adapter folder)")
    p.add_argument("--merge", action="store_true", help="with --lora-rank and --hf-out: write the adapters merged "
                   "into the float base, as full Hugging Face weights")
    p.add_argument("--recipe", help="recipe name (default: the model's own; with --weights, 'classify' for "
                   "encoders and 'finetune-lm' for decoders, unless the model's own fine-tunes weights (the 3B-8B "
                   "checkpoints': LoRA chat fine-tuning); 'sft': chat / instruction fine-tuning of a decoder)")
    p.add_argument("--steps", type=int, help="optimizer updates (default: the recipe's)")
    p.add_argument("--text-column", help="CSV column / JSONL field / TFDS feature holding the text (default: text)")
    p.add_argument("--label-column", help="the label column, for --recipe classify")
    p.add_argument("--data-dir", help="TensorFlow Datasets data_dir (prepared; nothing is downloaded)")
    p.add_argument("--validation-every", type=int, default=0, help="hold out every n-th document for validation")
    add_recipe_flags(p)
    p.add_argument("--show-mask", type=int, metavar="ROW",
                   help="--recipe sft / dpo / simpo: print row ROW (1-based) as the template renders it, the trained "
                   "(scored) tokens between ⟦ and ⟧, and exit")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="model spec override, repeatable (e.g. --override num_layers=2)")
    p.add_argument("--strategy", choices=("mirrored", "multi-worker"),
                   help="data-parallel training: 'mirrored' over this host's devices, 'multi-worker' over the hosts "
                   "of TF_CONFIG; --batch-size is the global batch (README: Many devices, many hosts)")
    p.add_argument("--devices", type=lambda text: [d for d in text.split(",") if d],
                   help="with --strategy mirrored: comma-separated devices, e.g. GPU:0,GPU:1 (default: every GPU)")
    p.add_argument("--collective-timeout", type=float, metavar="SECONDS",
                   help="with --strategy multi-worker: a step after the first that waits longer than this for the "
                        "other workers stops every process (exit code 3), to be resumed (default: 120)")
    p.add_argument("--show", action="store_true", help="print the resolved recipe and exit")
    p.set_defaults(func=_train)


def _train(args):
    import recipes
    from recipes.distribute import WORKER_LOST_EXIT, WorkerLost

    if args.model is None and args.weights is None:
        raise ValueError("zoo train needs a model name (zoo list) or --weights to start from.")
    changes = {f.name: getattr(args, f.name) for f in recipe_flags() if getattr(args, f.name) is not None}
    if args.override:
        changes["model_overrides"] = dict(_override(o) for o in args.override)
    if args.weights:
        # a model whose own recipe fine-tunes weights (the 3B-8B checkpoints') runs it; others the kind's default
        own = args.model if args.model in recipes.names() and recipes.get(args.model).from_weights else None
        default = "classify" if args.label_column else own
        recipe = recipes.get(args.recipe or default, weights=args.weights)
        if args.model is not None:
            changes["model"] = args.model  # checked against the weights' shape
    else:
        recipe = recipes.get(args.recipe or args.model)
        if recipe.model != args.model:
            changes["model"] = args.model
    refuse_foreign_flags(recipe, changes)
    recipe = recipe.replace(**changes)
    if args.steps is not None:
        recipe = recipe.with_steps(args.steps)
    if args.show:
        print(json.dumps(recipe.to_dict(), indent=2))
        return 0
    if args.show_mask is not None:
        from recipes import dpo, sft

        show_mask = dpo.show_mask if recipe.preference else sft.show_mask
        print(show_mask(recipe, args.data, args.show_mask, args.out_dir or ""))
        return 0
    out_dir = args.out_dir or f"runs/{args.model or Path(args.weights.rstrip('/')).name}"
    try:
        result = recipes.run(
            recipe, args.data, out_dir, column=args.text_column, label_column=args.label_column,
            data_dir=args.data_dir, validation_every=args.validation_every, hf_out=args.hf_out,
            strategy=args.strategy, devices=args.devices, merge=args.merge,
            collective_timeout=args.collective_timeout,
        )
    except WorkerLost as error:
        print(f"zoo train: error: {error}", file=sys.stderr)
        return WORKER_LOST_EXIT
    speed = None if math.isnan(result.tokens_per_second) else round(result.tokens_per_second, 1)
    print(json.dumps({"model": recipe.name, "steps": result.step,
                      "final_loss": (result.history or [{}])[-1].get("loss"),
                      "tokens_per_second": speed, "peak_bytes": result.peak_bytes,
                      "peak_measure": result.peak_measure}))
    return 0


def register_eval(subparsers):
    p = subparsers.add_parser("eval", help="accuracy (classifier) or perplexity (causal LM) on a data file")
    p.add_argument("model", help="a training run folder (zoo train --out-dir), a Hugging Face folder or a .keras file")
    p.add_argument("--data", required=True, help=".txt, .csv/.tsv, .jsonl, or tfds:NAME[:SPLIT]")
    p.add_argument("--text-column", help="the text column / field (default: text)")
    p.add_argument("--label-column", help="the label column, for a classifier")
    p.add_argument("--data-dir", help="TensorFlow Datasets data_dir (prepared; nothing is downloaded)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--sequence-length", type=int, help="default: the run's training length")
    p.set_defaults(func=_eval)


def _eval(args):
    import recipes

    result = recipes.evaluate(args.model, args.data, column=args.text_column, label_column=args.label_column,
                              data_dir=args.data_dir, batch_size=args.batch_size,
                              sequence_length=args.sequence_length)
    print(result.table())
    print(json.dumps({"model": args.model, "data": args.data, **result.as_dict()}))
    return 0
