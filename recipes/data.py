"""tf.data pipelines for the three tasks, from local files or TensorFlow Datasets.

Sources: a `.txt` file (one document per line), a `.csv`/`.tsv` file (a named text
column, optionally a label column), a `.jsonl` file (a named field), or
`tfds:NAME[/CONFIG][:SPLIT]` read with `tfds.load(..., data_dir=..., download=False)`
so that nothing is fetched from a hub at run time.

Tasks:
  masked_lm   WordPiece, documents concatenated and cut into [CLS] chunk [SEP] rows of
              exactly `sequence_length` (no padding), masked by keras-hub's
              `MaskedLMMaskGenerator` (15%: 80% [MASK], 10% random, 10% kept).
  causal_lm   byte-level BPE, documents joined with <|endoftext|> and cut into rows of
              `sequence_length + 1` tokens (no padding): inputs row[:-1], targets row[1:].
  classifier  WordPiece, [CLS] text [SEP] padded to `sequence_length`, labels by name.

Order is deterministic (seeded shuffle, ordered maps), so `skip(n)` puts a resumed
run at the same batch; the MLM masks are drawn by tf.text's stateful random ops
and differ between runs.
"""

import collections
import hashlib
import json
import os
import weakref

import keras_hub
import tensorflow as tf

from recipes import vocab as vocab_lib
from zoo import reading

AUTOTUNE = tf.data.AUTOTUNE


# ----------------------------------------------------------------------------- sources
def _check_file(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"Data file {path!r} does not exist; pass a .txt, .csv, .tsv or .jsonl file, "
                                "or tfds:NAME[:SPLIT].")
    if os.path.isdir(path):
        raise ValueError(f"Data path {path!r} is a folder; pass a .txt, .csv, .tsv or .jsonl file.")


def _columns_error(path, kind, column, available):
    return ValueError(f"{kind} {column!r} is not in {path!r}; its columns are: {', '.join(available)}. "
                      "Pass the right --text-column / --label-column.")


def _delimited(path, column, label_column):
    delimiter = "\t" if path.endswith((".tsv", ".tab")) else ","
    header = reading.csv_header(path, delimiter)
    if not header:
        raise ValueError(f"Data file {path!r} is empty: it has no header row and no text.")
    column = column or ("text" if "text" in header else None)
    for kind, name in (("Text column", column), ("Label column", label_column)):
        if name is not None and name not in header:
            raise _columns_error(path, kind, name, header)
    if column is None:
        raise ValueError(f"{path!r} has no 'text' column; name the text column (columns: {', '.join(header)}).")
    for _ in reading.csv_rows(path, delimiter):  # one pass now: a damaged line fails here, not mid-training
        pass

    def rows():
        for _, row in reading.csv_rows(path, delimiter):
            yield (row[column] or "",) + ((row[label_column] or "",) if label_column else ())

    return rows


def _text_of(path, number, record, name, kind):
    """A JSONL row's field as text; refused by row where it holds no text (a conversation, an object, null)."""
    value = record.get(name) if isinstance(record, dict) else None
    if isinstance(record, dict) and name not in record:
        raise _columns_error(path, f"{kind} (row {number})", name, list(record))
    if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        raise ValueError(f"{path}, row {number}: field {name!r} holds a conversation ({len(value)} messages), not "
                         "text; pre-training reads one text per row. Train chat rows with --recipe sft (or "
                         "recipes.get('sft', ...)), or name a text field with --text-column.")
    what = "not a JSON object" if not isinstance(record, dict) else f"field {name!r} holds {type(value).__name__}"
    raise ValueError(f"{path}, row {number}: {what}, not text; every row must be an object whose {name!r} is a "
                     "string (or a number).")


def _jsonl(path, column, label_column):
    column = column or "text"
    fields = [(column, "Text field")] + ([(label_column, "Label field")] if label_column else [])

    def rows():
        for number, record in reading.jsonl_records(path):
            yield tuple(_text_of(path, number, record, name, kind) for name, kind in fields)

    if not sum(1 for _ in rows()):  # one pass now: a damaged or wrong row fails here, not mid-training
        raise ValueError(f"Data file {path!r} is empty: it holds no JSON lines.")

    return rows


def _tfds(source, column, label_column, data_dir):
    import tensorflow_datasets as tfds

    name, _, split = source[len("tfds:"):].partition(":")
    try:
        ds = tfds.load(name, split=split or "train", data_dir=data_dir, download=False)
    except Exception as error:  # tfds raises several types for "not prepared"
        raise FileNotFoundError(f"TensorFlow Datasets could not load {name!r} from data_dir={data_dir!r} without "
                                f"downloading ({type(error).__name__}: {error}); prepare it there first.") from None
    column = column or "text"
    for kind, key in (("Text feature", column), ("Label feature", label_column)):
        if key is not None and key not in ds.element_spec:
            raise _columns_error(source, kind, key, list(ds.element_spec))

    def pick(example):
        text = example[column]
        if not label_column:
            return text
        label = example[label_column]
        return text, label if label.dtype == tf.string else tf.strings.as_string(label)

    return ds.map(pick)


def documents(source, column=None, label_column=None, data_dir=None) -> tf.data.Dataset:
    """Non-empty documents as a dataset of strings, or (text, label) string pairs
    when `label_column` is given. Bad paths and columns fail here, before training."""
    source = os.fspath(source)
    if source.startswith("tfds:"):
        ds = _tfds(source, column, label_column, data_dir)
    else:
        _check_file(source)
        if source.endswith((".csv", ".tsv", ".tab")):
            rows = _delimited(source, column, label_column)
        elif source.endswith(".jsonl"):
            rows = _jsonl(source, column, label_column)
        elif label_column:
            raise ValueError(f"{source!r} is plain text and has no labels; use a .csv/.tsv/.jsonl file to classify.")
        else:
            rows = None
        if rows is None:
            ds = tf.data.TextLineDataset(source)
        else:
            width = 2 if label_column else 1
            spec = tuple(tf.TensorSpec((), tf.string) for _ in range(width))
            ds = tf.data.Dataset.from_generator(rows, output_signature=spec)
            ds = ds.map(lambda *row: row if label_column else row[0])
    text_of = (lambda text, *_: text) if label_column else (lambda text: text)
    ds = ds.filter(lambda *row: tf.strings.length(tf.strings.strip(text_of(*row))) > 0)
    if not list(ds.take(1)):
        raise ValueError(f"The corpus {source!r} holds no text (every document is empty); check the file and column.")
    return ds


def split(docs: tf.data.Dataset, every: int):
    """(train, validation): every `every`-th document is held out (deterministic)."""
    if not every:
        return docs, None
    indexed = docs.enumerate()

    def strip(i, row):
        return row

    train = indexed.filter(lambda i, row: i % every != 0).map(strip)
    valid = indexed.filter(lambda i, row: i % every == 0).map(strip)
    return train, valid


def labels_of(docs: tf.data.Dataset) -> list:
    """The sorted label names of a (text, label) dataset: its classes, in a fixed order."""
    return sorted({label.decode("utf-8") for _, label in docs.as_numpy_iterator()})


# ----------------------------------------------------------------------------- tasks
_TRACED = weakref.WeakKeyDictionary()  # tokenizer -> its tf.function
_TRACED_EQUAL = collections.OrderedDict()  # BPE fingerprint -> tf.function of the first tokenizer seen with it
_KEEP_EQUAL = 4  # the last few distinct BPE tokenizers (a 128K-token vocabulary is some tens of MB)


def traced(tokenizer):
    """`tokenizer` as one tf.function shared by every pipeline that maps it (training, validation,
    evaluation): each `map` would otherwise trace keras-hub's tokenizer graph anew, ~1 s for BPE (2-3 s on 2 busy
    cores). A BPE tokenizer equal to one traced before (the next run in a notebook loads the same vocabulary anew)
    reuses that one's function: the same configuration and tables tokenize alike, and its tables are lookup tables
    the first tokenizer owns. Not SentencePiece (tf.text makes its model resource inside the graph, and a second
    dataset cannot find the first one's: "Resource ... SentencepieceOp does not exist") nor WordPiece (~0.4 s)."""
    if not isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer):
        if tokenizer not in _TRACED:
            _TRACED[tokenizer] = tf.function(tokenizer)
        return _TRACED[tokenizer]
    key = _fingerprint(tokenizer)
    if key not in _TRACED_EQUAL:
        _TRACED_EQUAL[key] = tf.function(tokenizer)
        while len(_TRACED_EQUAL) > _KEEP_EQUAL:
            _TRACED_EQUAL.popitem(last=False)
    _TRACED_EQUAL.move_to_end(key)
    return _TRACED_EQUAL[key]


def _fingerprint(tokenizer):
    """What decides a BPE tokenizer's output: its class, configuration (but its layer name), vocabulary and merges."""
    digest = hashlib.sha256(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}".encode())
    config = {k: v for k, v in tokenizer.get_config().items() if k != "name"}  # Keras numbers each new layer's name
    digest.update(json.dumps(config, sort_keys=True, default=repr).encode())
    digest.update(repr((tokenizer.vocabulary, tokenizer.merges)).encode())
    return digest.hexdigest()


def _chunks(docs, tokenizer, length, separator=None):
    """Tokenize, join documents (with `separator` between them) and cut into rows
    of exactly `length` tokens; the tail shorter than a row is dropped."""
    tokens = docs.batch(16).map(traced(tokenizer), num_parallel_calls=AUTOTUNE)
    if separator is not None:
        tokens = tokens.map(lambda t: tf.concat([t, tf.fill([t.nrows(), 1], separator)], axis=1))
    return tokens.map(lambda t: t.flat_values).unbatch().batch(length, drop_remainder=True)


def _masked_lm_rows(docs, tokenizer, recipe, ids):
    rows = _chunks(docs, tokenizer, recipe.sequence_length - 2)
    cls, sep = tf.constant([ids["cls"]]), tf.constant([ids["sep"]])
    return rows.map(lambda t: tf.concat([cls, t, sep], axis=0))


def _causal_lm_rows(docs, tokenizer, recipe, ids):
    return _chunks(docs, tokenizer, recipe.sequence_length + 1, separator=ids["eos"])


def _classify_rows(docs, tokenizer, recipe, ids, labels):
    packer = keras_hub.layers.StartEndPacker(
        sequence_length=recipe.sequence_length, start_value=ids["cls"], end_value=ids["sep"], pad_value=ids["pad"],
    )
    lookup = tf.keras.layers.StringLookup(vocabulary=labels, num_oov_indices=0) if labels else None
    tokenize = traced(tokenizer)
    return docs.map(lambda text, label: (packer(tokenize(text)), tf.cast(lookup(label), "int32")),
                    num_parallel_calls=AUTOTUNE)


def _with_segments(recipe, x):
    """BERT also takes segment ids (one segment here); ModernBERT takes none (`recipe.segments`)."""
    return {**x, "segment_ids": tf.zeros_like(x["token_ids"])} if recipe.segments else x


def _masked_lm_batch(recipe, ids, vocabulary_size):
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=vocabulary_size, mask_selection_rate=recipe.mask_rate, mask_token_id=ids["mask"],
        mask_selection_length=recipe.max_predictions, unselectable_token_ids=[ids["pad"], ids["cls"], ids["sep"]],
    )

    def features(rows):
        masked = masker(rows)
        x = {
            "token_ids": masked["token_ids"], "padding_mask": tf.ones_like(rows),
            "mask_positions": tf.cast(masked["mask_positions"], "int32"),
        }
        return _with_segments(recipe, x), tf.cast(masked["mask_ids"], "int32"), masked["mask_weights"]

    return features


def _causal_lm_batch(rows):
    x = {"token_ids": rows[:, :-1], "padding_mask": tf.ones_like(rows[:, :-1])}
    return x, rows[:, 1:]


def _classify_batch(recipe, ids):
    def features(token_ids, label):
        x = {"token_ids": token_ids, "padding_mask": tf.cast(token_ids != ids["pad"], "int32")}
        return _with_segments(recipe, x), label

    return features


def rows(recipe, tokenizer, docs, labels=None) -> tf.data.Dataset:
    """The task's unbatched examples (token rows, or (row, label) pairs)."""
    ids = vocab_lib.special_ids(tokenizer)
    if recipe.task == "masked_lm":
        return _masked_lm_rows(docs, tokenizer, recipe, ids)
    if recipe.task == "causal_lm":
        return _causal_lm_rows(docs, tokenizer, recipe, ids)
    return _classify_rows(docs, tokenizer, recipe, ids, labels)


def pipeline(recipe, tokenizer, docs, labels=None, training=True, skip=0) -> tf.data.Dataset:
    """Batches of (inputs, targets[, weights]) for `model.fit`.

    training: seeded shuffle, repeat forever and skip the first `skip`
    micro-batches (a resumed run's position). Otherwise one pass, in order.
    """
    ids = vocab_lib.special_ids(tokenizer)
    # No cache(): a corpus-sized cache costs memory, and one that a run stops reading part-way
    # (every run does) makes tf.data warn that it discards it. Each pass re-tokenizes instead.
    ds = rows(recipe, tokenizer, docs, labels)
    if training:
        ds = ds.shuffle(recipe.shuffle_buffer, seed=recipe.seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(recipe.batch_size, drop_remainder=training)
    if skip:
        ds = ds.skip(skip)
    if recipe.task == "masked_lm":
        ds = ds.map(_masked_lm_batch(recipe, ids, tokenizer.vocabulary_size()), num_parallel_calls=AUTOTUNE)
    elif recipe.task == "causal_lm":
        ds = ds.map(_causal_lm_batch, num_parallel_calls=AUTOTUNE)
    else:
        ds = ds.map(_classify_batch(recipe, ids), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)
