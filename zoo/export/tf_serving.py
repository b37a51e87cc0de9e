"""A SavedModel for TF Serving: the serving graph's signatures, and for decoders the
`generate` signatures (zoo.export.generate). Written to a temporary sibling and renamed
into place, so a failed export leaves nothing at `path` and an earlier one survives."""

from pathlib import Path

import keras
import tensorflow as tf

from zoo.export import generate as generate_signatures
from zoo.export.serving import check_length, exported_length, input_specs, serving_model, text_packer
from zoo.files import atomic_path, check_target

TEXT_SIGNATURE = "text"


CHAT_DIR = "assets.extra"  # TF Serving's folder for files beside the graph: a chat model's template and tokenizer


def saved_model(model, path, sequence_length=None, tokenizer=None, overwrite=False, generate=None,
                chat=None) -> Path:
    """Write `model`'s inference graph as a SavedModel for TF Serving.

    The graph is the inference one (`training=False`), so no recomputation wrapper
    is exported whatever the model's checkpointing policy, and outputs are float32.

    Args:
        model: a zoo model (`zoo.get(...)` or `keras.models.load_model("x.keras")`).
        path: the SavedModel folder (TF Serving expects `.../NAME/VERSION`).
        sequence_length: the longest token-id input served (default: the model's
            maximum); longer inputs are refused at serving time, naming the limit.
        tokenizer: a keras-hub tokenizer; adds the `text` signature (strings in,
            tokenized and packed in the graph; loading it needs `tensorflow_text`).
        overwrite: replace an existing export at `path`.
        generate: add the `generate` signature (and `generate_text` with a tokenizer):
            generation with a key/value cache inside the graph (zoo.export.generate).
            Default: for decoder language models.
        chat: a `zoo.chat.Chat` (default: the model's `chat`, attached by zoo.load): its template
            and tokenizer.json are written into `assets.extra/`, so that a serving client renders
            conversations as the model was trained to read them. With a `tokenizer` too, the
            export is refused where the graph's tokenizer splits the chat's conversations unlike
            tokenizer.json (`Chat.serving_mismatch`).

    Returns:
        `path`, written atomically (an earlier export survives a failed one).

    Example:
    >>> model = zoo.get("enc-base", task="classifier", num_classes=3)
    >>> export.saved_model(model, "exports/enc-base/1", sequence_length=128)
    """
    chat = chat if chat is not None else getattr(model, "chat", None)
    if chat is not None and tokenizer is not None:
        mismatch = chat.serving_mismatch(lambda text: tokenizer(text))
        if mismatch:
            raise ValueError(
                "The text signatures would tokenize conversations unlike the chat model was trained (Hugging Face "
                f"`tokenizers` on its tokenizer.json): {mismatch}. Export without tokenizer=: the token-id signatures, "
                f"with the template and tokenizer.json in {CHAT_DIR}/ for the client to tokenize with.")
    serving = serving_model(model)
    length = exported_length(model, sequence_length)
    generate = model.task == "causal_lm" if generate is None else generate
    if generate:
        generate_signatures.check_decoder(model)
    check_target(path, overwrite)
    pack = text_packer(model, tokenizer, length) if tokenizer is not None else None
    # Not archive.track(serving): add_endpoint saves the variables the endpoints use, and
    # tracking the model as well stores every weight twice (Keras 3.15's model.export does).
    archive = keras.export.ExportArchive()

    def serve(inputs):
        check_length(inputs["token_ids"], length)
        return serving(inputs, training=False)

    archive.add_endpoint("serving_default", serve, input_signature=[input_specs(model)])
    if pack is not None:
        if not tokenizer.built:
            tokenizer.build(None)  # keras-hub tokenizers hold their tables from __init__
        archive.track(tokenizer)

        def serve_text(text):
            return serving(pack(text), training=False)

        text_spec = tf.TensorSpec([None], tf.string, name="text")
        archive.add_endpoint(TEXT_SIGNATURE, serve_text, input_signature=[text_spec])
    if generate:
        generate_signatures.add_signatures(archive, model, tokenizer)
    with atomic_path(path, overwrite) as tmp:
        archive.write_out(str(tmp), verbose=False)
        if chat is not None:
            chat.save(tmp / CHAT_DIR)
    return Path(path)
