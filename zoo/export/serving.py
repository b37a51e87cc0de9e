"""The serving graph both export formats are built from: a functional Keras model over the
trained model's graph, called with `training=False` (so no recomputation wrapper is ever
traced) and with float32 outputs:

  encoders   token_ids, padding_mask, segment_ids -> sequence_output, pooled_output
             (+ the task head's `logits` when the model has one)
  decoders   token_ids, padding_mask -> next_token_logits [B, vocab] at the last
             real (non-padding) position; a decoder backbone gives sequence_output

`text_packer` tokenizes and packs strings in the graph with keras-hub (the SavedModel's
`text` signature; loading it needs `import tensorflow_text`).
"""

import keras
import tensorflow as tf
from keras import ops


# The serving graph ----------------------------------------------------------
def serving_model(model) -> keras.Model:
    """The inference graph of `model` as a functional Keras model (float32 outputs)."""
    check_exportable(model)
    inputs = dict(model.input)
    outputs = dict(model.output)
    backbone = getattr(model, "backbone", None)
    if backbone is not None:
        # The backbone's outputs as wired inside this task model (its one call site),
        # so serving computes the backbone once for all outputs.
        node = backbone._inbound_nodes[0]
        outputs.update(keras.tree.pack_sequence_as(backbone.output, node.output_tensors))
    if model.task == "causal_lm":
        # Project only the last real position: [B, H] -> [B, vocab], not [B, S, vocab].
        last = ops.maximum(ops.sum(inputs["padding_mask"], axis=1) - 1, 0)
        hidden = ops.take_along_axis(outputs["sequence_output"], last[:, None, None], axis=1)[:, 0]
        outputs = {"next_token_logits": model.lm_logits(hidden)}
    outputs = {name: ops.cast(tensor, "float32") for name, tensor in outputs.items()}
    return keras.Model(inputs, outputs, name=f"{model.name}_serving")


def check_exportable(model):
    """Refuse what is not a built zoo model, naming what to export instead."""
    if isinstance(model, keras.Model) and not model.built:
        raise ValueError(
            f"Cannot export {type(model).__name__} {model.name!r}: the model was never built. "
            "Export a model from zoo.get(...) or keras.models.load_model('model.keras')."
        )
    if not isinstance(model, keras.Model) or not hasattr(model, "spec"):
        raise ValueError(
            f"{type(model).__name__} {getattr(model, 'name', '')!r} is not a zoo model (it has no `spec`); "
            "export models built by zoo.get(...) or loaded from a .keras file saved from one."
        )
    if getattr(model, "packed", False):
        raise ValueError(f"{model.name!r} is set to train on packed rows (set_packed(True)), whose padding_mask "
                         "numbers documents; a served graph takes 0/1 padding masks. Call model.set_packed(False) "
                         "first (a saved run loads unpacked).")


def mask_count(sequence_length):
    """How many masked-LM positions a fixed-shape (TFLite) export takes: BERT's 15%."""
    return max(1, round(0.15 * sequence_length))


def input_specs(model, batch_size=None, sequence_length=None) -> dict:
    """int32 [batch, length] per input; a masked-LM model's `mask_positions` is [batch, masks]."""
    masks = sequence_length and mask_count(sequence_length)
    return {name: tf.TensorSpec([batch_size, masks if name == "mask_positions" else sequence_length], tf.int32,
                                name=name) for name in model.input}


def check_length(token_ids, limit):
    """A serving-time error naming the limit, instead of a gather out of range deep in the graph."""
    tf.debugging.assert_less_equal(
        tf.shape(token_ids)[1], limit,
        message=f"Input sequence length exceeds the exported length of {limit} tokens; "
        f"truncate inputs to {limit} tokens or export with a larger sequence_length.",
    )


def exported_length(model, sequence_length):
    """The longest input an export serves: `sequence_length` within the model's range (default its maximum)."""
    limit = model.spec.max_sequence_length
    if sequence_length is None:
        return limit
    if not 0 < sequence_length <= limit:
        raise ValueError(
            f"sequence_length={sequence_length} is outside this model's range 1..{limit}; "
            f"choose a length of at most {limit} positions."
        )
    return sequence_length


def text_packer(model, tokenizer, sequence_length):
    """strings [B] -> the model's input dict, with keras-hub's packers.

    Encoders: [CLS] text [SEP], padded with [PAD], segment 0 where the model takes segments (BERT, as
    BertTextClassifierPreprocessor; ModernBERT takes none).
    Decoders: the tokenizer's start token if it has one, padded on the right.
    """
    from keras_hub.layers import MultiSegmentPacker, StartEndPacker

    if model.task == "masked_lm":
        raise ValueError("A masked-LM model also takes mask_positions, which text alone does not give; "
                         "export its backbone (model.backbone) or a classifier for a text signature.")
    if not model.spec.is_decoder:
        ids = {}
        for token in ("[CLS]", "[SEP]", "[PAD]"):
            try:
                ids[token] = int(tokenizer.token_to_id(token))
            except (KeyError, ValueError, tf.errors.InvalidArgumentError):
                raise ValueError(f"The tokenizer's vocabulary has no {token} token, which encoder inputs need."
                                 ) from None
        packer = MultiSegmentPacker(
            sequence_length, start_value=ids["[CLS]"], end_value=ids["[SEP]"], pad_value=ids["[PAD]"]
        )

        def pack(text):
            token_ids, segment_ids = packer(tokenizer(text))
            packed = {"token_ids": token_ids, "padding_mask": ops.cast(token_ids != ids["[PAD]"], "int32")}
            return {**packed, "segment_ids": segment_ids} if "segment_ids" in model.input else packed
    else:
        pad = getattr(tokenizer, "pad_token_id", None) or 0
        packer = StartEndPacker(
            sequence_length, start_value=getattr(tokenizer, "start_token_id", None), pad_value=pad,
            return_padding_mask=True,
        )

        def pack(text):
            token_ids, padding_mask = packer(tokenizer(text))
            return {"token_ids": token_ids, "padding_mask": ops.cast(padding_mask, "int32")}
    return pack
