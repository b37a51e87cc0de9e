"""Pipeline mechanics (recipes.data, recipes.vocab). Small generated files are
used only here, to check packing, masking, batching and errors exactly; the
training tests use the real news corpus."""

import json

import numpy as np
import pytest
import tensorflow as tf

from recipes import data, vocab
from tests.common import tiny_recipe

WORDS = "the cat sat on a mat while dogs ran far away from home and birds sang".split()


def _corpus(tmp_path, n=40):
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 30)))) for _ in range(n)]
    txt = tmp_path / "corpus.txt"
    txt.write_text("\n".join(lines[:10] + [""] + lines[10:]) + "\n")  # a blank line is skipped
    return txt, lines


def test_sources_agree_and_skip_empty_documents(tmp_path):
    txt, lines = _corpus(tmp_path)
    csv_path = tmp_path / "corpus.csv"
    csv_path.write_text("id,body,label\n" + "".join(f'{i},"{t}",{"ab"[i % 2]}\n' for i, t in enumerate(lines)))
    tsv = tmp_path / "corpus.tsv"
    tsv.write_text("label\tbody\n" + "".join(f'{"ab"[i % 2]}\t{t}, and more\n' for i, t in enumerate(lines)))
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"body": t, "label": "ab"[i % 2]}) + "\n" for i, t in enumerate(lines)))
    from_txt = [t.decode() for t in data.documents(str(txt)).as_numpy_iterator()]
    from_csv = [t.decode() for t in data.documents(str(csv_path), column="body").as_numpy_iterator()]
    from_jsonl = [t.decode() for t in data.documents(str(jsonl), column="body").as_numpy_iterator()]
    assert from_txt == from_csv == from_jsonl == lines
    # .tsv: only tabs separate fields; a comma is text
    tsv_pairs = list(data.documents(str(tsv), column="body", label_column="label").as_numpy_iterator())
    assert [(t.decode(), y.decode()) for t, y in tsv_pairs] == [(f"{t}, and more", "ab"[i % 2])
                                                                for i, t in enumerate(lines)]
    pairs = list(data.documents(str(jsonl), column="body", label_column="label").as_numpy_iterator())
    assert [p[1].decode() for p in pairs[:3]] == ["a", "b", "a"]
    assert data.labels_of(data.documents(str(csv_path), column="body", label_column="label")) == ["a", "b"]
    train, valid = data.split(data.documents(str(txt)), 4)
    assert len(list(valid)) == 10 and len(list(train)) == 30


def test_bad_sources_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.csv"):
        data.documents(str(tmp_path / "nothing.csv"))
    bad = tmp_path / "c.csv"
    bad.write_text("id,title\n1,hello\n")
    with pytest.raises(ValueError, match="'text' column"):
        data.documents(str(bad))
    with pytest.raises(ValueError, match="Label column 'stars' is not in .*columns are: id, title"):
        data.documents(str(bad), column="title", label_column="stars")
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(ValueError, match="holds no text"):
        data.documents(str(blank))
    with pytest.raises(FileNotFoundError, match="could not load 'no_such_dataset'"):
        data.documents("tfds:no_such_dataset:train", data_dir=str(tmp_path))


def test_tfds_source_prepared_locally(tmp_path, recipes_vocab):
    """`tfds:NAME[:SPLIT]` with --data-dir: a dataset prepared with TensorFlow Datasets'
    own builder into a temporary data_dir (nothing downloaded), read back by name,
    with its text and ClassLabel features, and batched by the classify pipeline."""

    import tensorflow_datasets as tfds

    _, lines = _corpus(tmp_path)
    splits = {"train": lines[:30], "test": lines[30:]}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="zoo_tiny_text", version="1.0.0", data_dir=str(tmp_path / "tfds"),
        features=tfds.features.FeaturesDict({"sentence": tfds.features.Text(),
                                             "label": tfds.features.ClassLabel(names=["neg", "pos"])}),
        split_datasets={name: tf.data.Dataset.from_tensor_slices(
            {"sentence": texts, "label": [i % 2 for i in range(len(texts))]}) for name, texts in splits.items()},
        disable_shuffling=True,
    )
    source = dict(column="sentence", data_dir=str(tmp_path / "tfds"))
    train = [t.decode() for t in data.documents("tfds:zoo_tiny_text", **source).as_numpy_iterator()]
    assert train == splits["train"]  # the default split is train
    pairs = list(data.documents("tfds:zoo_tiny_text:test", label_column="label", **source).as_numpy_iterator())
    assert [(t.decode(), y.decode()) for t, y in pairs] == [(t, str(i % 2)) for i, t in enumerate(splits["test"])]
    with pytest.raises(ValueError, match="Text feature 'text' is not in 'tfds:zoo_tiny_text'.*label, sentence"):
        data.documents("tfds:zoo_tiny_text", data_dir=str(tmp_path / "tfds"))
    docs = data.documents("tfds:zoo_tiny_text:test", label_column="label", **source)
    tok = vocab.load(recipes_vocab["bert"], "bert")
    x, y = next(iter(data.pipeline(tiny_recipe("classify", batch_size=4, sequence_length=16), tok, docs,
                                   data.labels_of(docs), training=False)))
    assert x["token_ids"].shape == (4, 16) and y.numpy().tolist() == [0, 1, 0, 1]


@pytest.fixture(scope="module")
def recipes_tokenizers(recipes_vocab):
    return {family: vocab.load(path, family) for family, path in recipes_vocab.items()}


def test_clm_packing_has_no_padding_and_shifts_targets(tmp_path, recipes_tokenizers):
    txt, lines = _corpus(tmp_path)
    tok = recipes_tokenizers["llama"]
    recipe = tiny_recipe("dec-base", batch_size=4, sequence_length=16)
    ids = vocab.special_ids(tok)
    rows = np.stack(list(data.rows(recipe, tok, data.documents(str(txt))).as_numpy_iterator()))
    stream = np.concatenate([np.append(np.asarray(tok(t)), ids["eos"]) for t in lines])
    n = len(stream) // 17
    np.testing.assert_array_equal(rows, stream[: n * 17].reshape(n, 17))  # concatenate and chunk, nothing else
    x, y = next(iter(data.pipeline(recipe, tok, data.documents(str(txt)), training=False)))
    np.testing.assert_array_equal(x["token_ids"].numpy()[:, 1:], y.numpy()[:, :-1])
    assert x["padding_mask"].numpy().all() and x["token_ids"].shape == (4, 16)


def test_equal_bpe_tokenizers_share_one_traced_tokenizer(recipes_vocab, tmp_path):
    """Each run loads its vocabulary anew; an equal BPE tokenizer (same class, configuration and tables) reuses the
    first one's traced function, whose output is the new one's; other tables or another configuration do not.
    WordPiece keeps a function per tokenizer (SentencePiece must: recipes.data.traced)."""
    path = recipes_vocab["llama"]
    first, again = vocab.load(path, "llama"), vocab.load(path, "llama")
    assert first is not again and data.traced(first) is data.traced(again)
    text = tf.constant(["Hello World", "the news"])
    assert data.traced(again)(text).to_list() == again(text)  # eagerly, keras-hub returns lists
    other = vocab.train(data.documents(str(_corpus(tmp_path)[0])), "llama", 300, str(tmp_path / "other"))
    assert data.traced(other) is not data.traced(first)
    assert data.traced(other)(text).to_list() == other(text) != again(text)
    wordpiece = recipes_vocab["bert"]
    assert data.traced(vocab.load(wordpiece, "bert")) is not data.traced(vocab.load(wordpiece, "bert"))


def test_mlm_masks_only_real_tokens(tmp_path, recipes_tokenizers):
    txt, _ = _corpus(tmp_path)
    tok = recipes_tokenizers["bert"]
    recipe = tiny_recipe("enc-base", batch_size=4, sequence_length=24, max_predictions=6)
    ids = vocab.special_ids(tok)
    clean = next(iter(data.rows(recipe, tok, data.documents(str(txt))).batch(4))).numpy()
    x, y, w = next(iter(data.pipeline(recipe, tok, data.documents(str(txt)), training=False)))
    tokens, positions = x["token_ids"].numpy(), x["mask_positions"].numpy()
    assert tokens.shape == (4, 24) and positions.shape == y.shape == w.shape == (4, 6)
    assert (clean[:, 0] == ids["cls"]).all() and (clean[:, -1] == ids["sep"]).all()
    real = w.numpy() > 0
    assert real.sum() >= 4 * 2  # ~15% of 22 maskable positions per row
    picked = np.take_along_axis(clean, positions, axis=1)
    np.testing.assert_array_equal(picked[real], y.numpy()[real])  # labels are the original tokens
    assert not np.isin(picked[real], [ids["cls"], ids["sep"], ids["pad"]]).any()
    assert (np.take_along_axis(tokens, positions, axis=1)[real] == ids["mask"]).mean() > 0.5


def test_classify_batches_pad_and_label(tmp_path, recipes_tokenizers):
    path = tmp_path / "labelled.csv"
    path.write_text("text,label\nthe cat sat,pets\nstocks fell sharply today on the news,markets\nthe dog ran,pets\n")
    tok = recipes_tokenizers["bert"]
    recipe = tiny_recipe("classify", batch_size=3, sequence_length=12)
    docs = data.documents(str(path), label_column="label")
    labels = data.labels_of(docs)
    x, y = next(iter(data.pipeline(recipe, tok, docs, labels, training=False)))
    ids = vocab.special_ids(tok)
    assert labels == ["markets", "pets"] and y.numpy().tolist() == [1, 0, 1]
    lengths = x["padding_mask"].numpy().sum(1)
    assert lengths[1] > lengths[0] and (x["token_ids"].numpy()[:, 0] == ids["cls"]).all()
    assert (x["token_ids"].numpy()[x["padding_mask"].numpy() == 0] == ids["pad"]).all()


def test_skip_resumes_at_the_same_batch(tmp_path, recipes_tokenizers):
    """The training stream is deterministic (seeded shuffle, repeat): skipping n
    batches lands where an uninterrupted stream is after n batches."""
    path = tmp_path / "labelled.csv"
    _, lines = _corpus(tmp_path, n=40)
    path.write_text("text,label\n" + "".join(f"{t},{'ab'[i % 2]}\n" for i, t in enumerate(lines)))
    recipe = tiny_recipe("classify", batch_size=2, sequence_length=12, shuffle_buffer=32)
    docs = data.documents(str(path), label_column="label")
    tok = recipes_tokenizers["bert"]

    def stream(skip):
        batches = data.pipeline(recipe, tok, docs, ["a", "b"], skip=skip).take(45 - skip)
        return [x["token_ids"].numpy() for x, _ in batches]

    full, resumed = stream(0), stream(27)  # past the first epoch (20 batches): reshuffled
    assert len({r.tobytes() for r in full}) > 30  # shuffled rows, not a constant
    assert any(not np.array_equal(a, b) for a, b in zip(full[:20], full[20:40]))  # reshuffled
    for a, b in zip(full[27:], resumed):
        np.testing.assert_array_equal(a, b)


def test_trained_wordpiece_vocabulary_has_the_specials(tmp_path):
    txt, _ = _corpus(tmp_path)

    tok = vocab.train(tf.data.TextLineDataset(str(txt)), "bert", 60, str(tmp_path / "wp"))
    ids = vocab.special_ids(tok)
    assert [ids[k] for k in ("pad", "cls", "sep", "unk", "mask")] == [0, 1, 2, 3, 4]
    assert tok.vocabulary_size() <= 60 and tok.token_to_id("cat") > 4
