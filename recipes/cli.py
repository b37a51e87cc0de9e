"""`zoo train MODEL --data FILE`: run a model's recipe from the command line.

Registered with the `zoo.commands` entry-point group (pyproject.toml), so `zoo`
itself never imports this package.
"""

import ast
import json
import math


def _override(text):
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--override takes KEY=VALUE (e.g. num_layers=2), got {text!r}.")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def register(subparsers):
    p = subparsers.add_parser("train", help="train a model with its recipe (resumes in the same --out-dir)")
    p.add_argument("model", help="a registered model (zoo list)")
    p.add_argument("--data", required=True, help=".txt (one document a line), .csv/.tsv, .jsonl, or tfds:NAME[:SPLIT]")
    p.add_argument("--out-dir", help="where checkpoints, logs and model.keras go (default: runs/MODEL)")
    p.add_argument("--recipe", help="recipe name (default: the model's own; 'classify' fine-tunes an encoder)")
    p.add_argument("--steps", type=int, help="optimizer updates (default: the recipe's)")
    p.add_argument("--text-column", help="CSV column / JSONL field / TFDS feature holding the text (default: text)")
    p.add_argument("--label-column", help="the label column, for --recipe classify")
    p.add_argument("--data-dir", help="TensorFlow Datasets data_dir (prepared; nothing is downloaded)")
    p.add_argument("--validation-every", type=int, default=0, help="hold out every n-th document for validation")
    for flag, kind in (("batch-size", int), ("sequence-length", int), ("accumulation-steps", int),
                       ("learning-rate", float), ("warmup-steps", int), ("log-every", int),
                       ("checkpoint-every", int), ("vocabulary", str), ("precision", str), ("checkpointing", str)):
        p.add_argument(f"--{flag}", type=kind, help=f"recipe field {flag.replace('-', '_')}")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="model spec override, repeatable (e.g. --override num_layers=2)")
    p.add_argument("--show", action="store_true", help="print the resolved recipe and exit")
    p.set_defaults(func=_train)


def _train(args):
    import recipes

    fields = ("batch_size", "sequence_length", "accumulation_steps", "learning_rate", "warmup_steps", "log_every",
              "checkpoint_every", "vocabulary", "precision", "checkpointing")
    changes = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    if args.override:
        changes["model_overrides"] = dict(_override(o) for o in args.override)
    recipe = recipes.get(args.recipe or args.model)
    if recipe.model != args.model:
        changes["model"] = args.model
    recipe = recipe.replace(**changes)
    if args.steps is not None:
        recipe = recipe.with_steps(args.steps)
    if args.show:
        print(json.dumps(recipe.to_dict(), indent=2))
        return 0
    result = recipes.run(
        recipe, args.data, args.out_dir or f"runs/{args.model}", column=args.text_column,
        label_column=args.label_column, data_dir=args.data_dir, validation_every=args.validation_every,
    )
    speed = None if math.isnan(result.tokens_per_second) else round(result.tokens_per_second, 1)
    print(json.dumps({"model": args.model, "steps": result.step, "final_loss": (result.history or [{}])[-1].get("loss"),
                      "tokens_per_second": speed, "peak_bytes": result.peak_bytes}))
    return 0
