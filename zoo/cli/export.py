"""`zoo export MODEL --format saved_model|tflite`: the command line of `zoo.export`."""

from pathlib import Path

from zoo import export
from zoo.loading import load


def _export(args):
    model = load(args.model, task=args.task, merge=True)  # a LoRA run: its adapters merged into the float base
    stem = Path(args.model.rstrip("/")).stem
    if args.format == "saved_model":
        if args.quantize:
            raise ValueError("--quantize applies to --format tflite only; a SavedModel keeps the model's weights.")
        tokenizer = None
        if args.vocabulary:
            from keras_hub.tokenizers import WordPieceTokenizer

            tokenizer = WordPieceTokenizer(vocabulary=args.vocabulary, lowercase=args.lowercase)
        path = export.saved_model(model, args.output or f"{stem}_saved_model", sequence_length=args.sequence_length,
                                  tokenizer=tokenizer, overwrite=args.overwrite)
        print(f"wrote {path}")
    else:
        report = export.tflite(model, args.output or f"{stem}.tflite", quantize=args.quantize,
                               sequence_length=args.sequence_length or 128, overwrite=args.overwrite)
        print(report)
    return 0


def register(subparsers):
    p = subparsers.add_parser("export", help="write a SavedModel (TF Serving) or a .tflite file (devices)")
    p.add_argument("model", help="a registered name, a .keras file, a training run folder (a LoRA run's adapters are "
                   "merged into its base) or a Hugging Face folder")
    p.add_argument("--format", required=True, choices=export.FORMATS)
    p.add_argument("--quantize", choices=export.QUANTIZATIONS, default=None, help="tflite only")
    p.add_argument("--output", "-o", default=None, help="default: MODEL_saved_model/ or MODEL.tflite")
    p.add_argument("--task", default=None, help="for a registered name: the task head to build")
    p.add_argument("--sequence-length", type=int, default=None,
                   help="longest input served (SavedModel; default: the model's maximum) or the fixed "
                   "input length (tflite; default 128)")
    p.add_argument("--vocabulary", default=None,
                   help="a WordPiece vocab.txt: adds the `text` signature (needs tensorflow-text to load)")
    p.add_argument("--lowercase", action="store_true", help="lower-case text before WordPiece")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export at the output path")
    p.set_defaults(func=_export)
