"""`recipes.run`: one entry for every recipe, on one skeleton (recipes.runner). The recipes' kinds register
themselves when imported here (recipes.documents, recipes.sft, recipes.dpo, recipes.grpo; recipes.kinds), and the
skeleton finds each run's kind through that registry: none of them imports another, nor the skeleton them."""

from recipes import documents, dpo, grpo, runner, sft  # noqa: F401  (each registers its kind)
from recipes.runner import Result


def run(recipe, data, out_dir, steps=None, column=None, label_column=None, data_dir=None,
        validation_every=0, validation_batches=8, callbacks=(), verbose="auto", hf_out=None,
        strategy=None, devices=None, merge=False, collective_timeout=None) -> Result:
    """Train `recipe` on `data` into `out_dir`, resuming what `out_dir` already holds.

    Args:
        recipe: a `Recipe` or a registered name (`recipes.get`).
        data: a .txt/.csv/.tsv/.jsonl path or tfds:NAME[:SPLIT] (see recipes.data).
        out_dir: run.json, tokenizer/, checkpoints/, logs/ and the final model.keras.
        steps: optimizer updates (default: the recipe's); the schedule is stretched
            to fit with its warmup fraction kept (`Recipe.with_steps`).
        column, label_column: the text (and, for a classifier, label) column or field.
        data_dir: TensorFlow Datasets' data_dir for a tfds: source (nothing is downloaded).
        validation_every: hold out every n-th document and report validation loss per
            interval (at most `validation_batches` batches); 0 = no validation.
        callbacks: more Keras callbacks for `fit`.
        hf_out: also write the final model as a Hugging Face folder there (with the
            tokenizer and, for a classifier, the label names as `id2label`); a LoRA
            run writes a PEFT adapter folder (with the tokenizer).
        merge: a LoRA run's `hf_out` holds the adapters merged into the float base
            (full Hugging Face weights) instead.
        strategy: None (one device), "mirrored" (the devices of this host, or `devices`)
            or "multi-worker" (the hosts of TF_CONFIG); see recipes.distribute.
        devices: for "mirrored", device names such as ["GPU:0", "GPU:1"].
        collective_timeout: for "multi-worker", seconds a step after the first may wait for
            the other workers before every process stops to be resumed (recipes.watchdog).

    Returns:
        A `Result`: steps run, per-interval history, tokens/s, peak memory, the model.

    Example:
    >>> recipe = recipes.get("classify", weights="path/to/all-MiniLM-L6-v2", steps=300)
    >>> recipes.run(recipe, "reviews.csv", "runs/reviews", label_column="label").history[-1]
    """
    return runner.run(recipe, data, out_dir, steps, column, label_column, data_dir, validation_every,
                      validation_batches, callbacks, verbose, hf_out, strategy, devices, merge, collective_timeout)
