"""`zoo export MODEL --format saved_model|tflite|gguf`: the command line of `zoo.export` and
`zoo.hub.write_gguf`."""

from pathlib import Path

from zoo import export, hub
from zoo.chat import Chat
from zoo.export.tf_serving import CHAT_DIR
from zoo.hub import gguf_writer
from zoo.loading import load

FORMATS = (*export.FORMATS, "gguf")
QUANTIZE = {"saved_model": (), "tflite": export.QUANTIZATIONS, "gguf": gguf_writer.QUANTIZATIONS}
SUFFIX = {"saved_model": "_saved_model", "tflite": ".tflite", "gguf": ".gguf"}


def check_args(args):
    """Options that do not apply to the chosen format, refused with what does."""
    allowed = QUANTIZE[args.format]
    if args.quantize and args.quantize not in allowed:
        fix = f"use one of {', '.join(allowed)}" if allowed else "a SavedModel keeps the model's weights"
        raise ValueError(f"--quantize {args.quantize} does not apply to --format {args.format}; {fix}.")
    tflite_only = {"--generate": args.generate, "--prefill-length": args.prefill_length,
                   "--cache-length": args.cache_length, "--int8-mode": args.int8_mode}
    misplaced = [flag for flag, value in tflite_only.items() if value] if args.format != "tflite" else []
    if args.format == "tflite" and not args.generate:
        misplaced = [flag for flag in ("--prefill-length", "--cache-length") if tflite_only[flag]]
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)} apply to --format tflite --generate only (a prefill/decode file).")
    if args.int8_mode and (args.format, args.quantize) != ("tflite", "int8"):
        raise ValueError("--int8-mode chooses how a .tflite file's int8 weights are made; add --quantize int8.")
    if args.vocabulary and args.format != "saved_model":
        raise ValueError("--vocabulary adds a SavedModel's `text` signature; it applies to --format saved_model only.")


def _export(args):
    check_args(args)
    model = load(args.model, task=args.task, merge=True)  # a LoRA run: its adapters merged into the float base
    stem = Path(args.model.rstrip("/")).stem
    output = args.output or f"{stem}{SUFFIX[args.format]}"
    if args.format == "saved_model":
        tokenizer = None
        if args.vocabulary:
            from keras_hub.tokenizers import WordPieceTokenizer

            tokenizer = WordPieceTokenizer(vocabulary=args.vocabulary, lowercase=args.lowercase)
        chat = Chat.of(args.model) if Path(args.model).is_dir() else None
        path = export.saved_model(model, output, sequence_length=args.sequence_length, tokenizer=tokenizer,
                                  overwrite=args.overwrite, chat=chat)
        print(f"wrote {path}" + (f" (its chat template and tokenizer.json in {path / CHAT_DIR})" if chat else ""))
        if model.task == "causal_lm":
            print(f"signatures: serving_default, generate; a TensorFlow-only client: "
                  f"tf.saved_model.load({str(path)!r}).signatures['generate'](token_ids=..., padding_mask=..., "
                  "max_new_tokens=..., sampler=b'greedy', top_k=..., top_p=..., temperature=..., seed=..., "
                  "end_token_id=...) (docs/export.md)")
    elif args.format == "gguf":
        path = hub.write_gguf(model, output, quantize=args.quantize or "q8_0", name=stem, overwrite=args.overwrite)
        print(f"wrote {path}")
    elif args.generate:
        result = export.tflite_generator(model, output, quantize=args.quantize, prefill_length=args.prefill_length or
                                         128, cache_length=args.cache_length, overwrite=args.overwrite,
                                         int8_mode=args.int8_mode or "auto")
        how = f", {result.int8_mode}" if result.int8_mode else ""
        print(f"wrote {result.path} ({result.quantize}, {result.size_bytes / 2**20:.1f} MiB{how}): prefill "
              f"{result.prefill_length} and decode signatures, cache {result.cache_length} positions; run it with "
              f"zoo generate --tflite {result.path} --tokenizer FOLDER PROMPT")
    else:
        report = export.tflite(model, output, quantize=args.quantize, sequence_length=args.sequence_length or 128,
                               overwrite=args.overwrite, int8_mode=args.int8_mode or "auto")
        print(report)
    return 0


def register(subparsers):
    p = subparsers.add_parser("export", help="write a SavedModel (TF Serving), a .tflite file (devices) or a .gguf "
                              "file (llama.cpp)")
    p.add_argument("model", help="a registered name, a .keras file, a training run folder (a LoRA run's adapters are "
                   "merged into its base) or a Hugging Face folder")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--quantize", choices=sorted({q for qs in QUANTIZE.values() for q in qs}), default=None,
                   help="tflite: float16 or int8 (weights; float activations); gguf: q8_0 (default), f16 or f32")
    p.add_argument("--output", "-o", default=None, help="default: MODEL_saved_model/, MODEL.tflite or MODEL.gguf")
    p.add_argument("--task", default=None, help="for a registered name: the task head to build")
    p.add_argument("--sequence-length", type=int, default=None,
                   help="longest input served (SavedModel; default: the model's maximum) or the fixed "
                   "input length (tflite; default 128)")
    p.add_argument("--generate", action="store_true",
                   help="tflite: a decoder's prefill/decode file with its key/value cache, for on-device generation")
    p.add_argument("--prefill-length", type=int, default=None, help="--generate: prompt tokens per prefill call "
                   "(default 128; longer prompts take several calls)")
    p.add_argument("--cache-length", type=int, default=None,
                   help="--generate: positions the cache holds, prompt plus new tokens (default: the model's "
                   "maximum, at most 1024)")
    p.add_argument("--int8-mode", choices=export.INT8_MODES, default=None,
                   help="tflite --quantize int8: dynamic_range (the converter quantizes; ~8 float32 copies of the "
                   "weights in memory), stand_in (the converter sees constant stand-ins, the real weights are "
                   "quantized into its file after: the same file in a fraction of the memory) or auto (default: "
                   "dynamic_range when it fits the memory available, else stand_in)")
    p.add_argument("--vocabulary", default=None,
                   help="a WordPiece vocab.txt: adds the `text` signature (needs tensorflow-text to load)")
    p.add_argument("--lowercase", action="store_true", help="lower-case text before WordPiece")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export at the output path")
    p.set_defaults(func=_export)
