"""Recipes that start from pretrained weights (a Hugging Face folder), and `zoo eval`.

The "pretrained" folders are tiny zoo models saved with `zoo.hub.save` together with a
vocabulary trained on the news corpus, so the whole path (config -> shape, the
checkpoint's own tokenizer, weights, labels, resume, --hf-out) runs offline in seconds.
"""

import csv
import json

import keras
import numpy as np
import pytest

import recipes
import zoo
from recipes import vocab
from tests.common import REPO, TINY_RECIPE, TINY_RECIPE_DEC

# What the checkpoints' runs show (shape and labels taken, resume, LoRA) is per variable, not per layer: one
# block traces ~25% faster than two.
ONE_BLOCK, ONE_BLOCK_DEC = dict(TINY_RECIPE, num_layers=1), dict(TINY_RECIPE_DEC, num_layers=1)

FAST = dict(batch_size=4, sequence_length=32, steps=4, warmup_steps=1, log_every=2, checkpoint_every=2,
            shuffle_buffer=16, precision="float32")


def pretrained(name, family, shape, seed, vocabularies, tmp_path_factory):
    """A tiny random model of `name`'s family saved as a Hugging Face folder with a trained vocabulary."""
    keras.utils.set_random_seed(seed)
    tokenizer = vocab.load(vocabularies[family], family)
    return zoo.hub.save(zoo.get(name, **shape), tmp_path_factory.mktemp("pretrained") / family, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def bert_folder(recipes_vocab, tmp_path_factory):
    return pretrained("enc-mini", "bert", ONE_BLOCK, 1, recipes_vocab, tmp_path_factory)


@pytest.fixture(scope="module")
def llama_folder(recipes_vocab, tmp_path_factory):
    return pretrained("dec-base", "llama", ONE_BLOCK_DEC, 2, recipes_vocab, tmp_path_factory)


def test_recipe_from_weights_takes_the_checkpoints_shape_and_kind(bert_folder, llama_folder):
    classify = recipes.get(weights=str(bert_folder))
    assert (classify.task, classify.model, classify.spec.num_layers) == ("classifier", None, 1)
    lm = recipes.get(weights=str(llama_folder))
    assert (lm.task, lm.spec.num_kv_heads, lm.learning_rate) == ("causal_lm", 2, 5e-5)


def test_built_model_holds_the_checkpoints_weights(bert_folder):
    recipe = recipes.get("classify", weights=str(bert_folder), **FAST)
    model = recipes.build(recipe, num_classes=3)
    reference = zoo.hub.load(str(bert_folder))
    for ours, theirs in zip(model.backbone.weights, reference.weights):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_bad_pretrained_inputs_name_the_problem(bert_folder, recipes_vocab, recipes_reuters, tmp_path):
    with pytest.raises(ValueError, match=r"not a 'enc-base' model \(.*num_layers: checkpoint 1, enc-base 12"):
        recipes.get("enc-base", weights=str(bert_folder))
    with pytest.raises(ValueError, match="own tokenizer; drop vocabulary"):
        recipes.get("classify", weights=str(bert_folder)).replace(vocabulary=recipes_vocab["bert"])
    one_class = tmp_path / "one.csv"
    one_class.write_text("label,text\nspam,buy now\nspam,cheap pills\n")
    recipe = recipes.get("classify", weights=str(bert_folder), **FAST)
    with pytest.raises(ValueError, match=r"1 distinct label\(s\) \(\['spam'\]\).*at least 2"):
        recipes.run(recipe, str(one_class), str(tmp_path / "run"), label_column="label")
    assert not (tmp_path / "run").exists()


def test_classifier_labels_must_match_the_data(bert_folder, recipes_reuters, tmp_path):
    model = zoo.hub.load(str(bert_folder), task="classifier", num_classes=2)
    folder = zoo.hub.save(model, tmp_path / "clf", labels=["ham", "spam"])
    assert json.loads((folder / "config.json").read_text())["id2label"] == {"0": "ham", "1": "spam"}
    recipe = recipes.get("classify", weights=str(folder), **FAST)
    with pytest.raises(ValueError, match=r"trained on labels \['ham', 'spam'\].*the data has \['acq'"):
        recipes.run(recipe, recipes_reuters, str(tmp_path / "run"), label_column="label")


@pytest.fixture(scope="module")
def reuters_test(recipes_reuters, tmp_path_factory):
    """The last 64 documents of the Reuters CSV as a small labelled test file (two batches of 32)."""
    path = tmp_path_factory.mktemp("reuters") / "test.csv"
    lines = open(recipes_reuters, encoding="utf-8").read().splitlines()
    path.write_text("\n".join([lines[0], *lines[-64:]]) + "\n", encoding="utf-8")
    return str(path)


def test_classifier_fine_tune_then_eval_and_hf_out(bert_folder, recipes_reuters, reuters_test, tmp_path):
    recipe = recipes.get("classify", weights=str(bert_folder), **FAST)
    run_dir, hf_out = tmp_path / "run", tmp_path / "hf"
    result = recipes.run(recipe, recipes_reuters, str(run_dir), label_column="label", hf_out=str(hf_out))
    assert result.step == 4
    labels = json.loads((run_dir / "run.json").read_text())["labels"]
    assert (run_dir / "tokenizer" / "vocab.txt").read_text() == (bert_folder / "vocab.txt").read_text()
    config = json.loads((hf_out / "config.json").read_text())
    assert list(config["id2label"].values()) == labels  # label names from the data, kept
    evaluation = recipes.evaluate(str(run_dir), reuters_test, label_column="label")
    confusion = np.asarray(evaluation.confusion)
    assert evaluation.labels == labels and confusion.shape == (len(labels), len(labels))
    assert confusion.sum() == evaluation.examples > 0
    assert evaluation.accuracy == pytest.approx(np.trace(confusion) / confusion.sum())
    # the Hugging Face folder is the same model: the same predictions
    assert recipes.evaluate(str(hf_out), reuters_test, label_column="label",
                            sequence_length=32).confusion == evaluation.confusion


class Interrupt(keras.callbacks.Callback):
    """Stops a run like a kill would: after `step` optimizer steps, once the checkpoint is written."""

    def __init__(self, at_epoch):
        super().__init__()
        self.at_epoch = at_epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.at_epoch:
            raise KeyboardInterrupt


def test_gemma3_fine_tunes_from_a_folder_with_its_sentencepiece_tokenizer_and_resumes(recipes_news, tmp_path):
    """A Gemma 3 folder (tokenizer.model, as Google's carry it; <eos> ends each document) fine-tunes
    with `--weights`, and the run keeps the checkpoint's tokenizer file. A run of it interrupted after
    its step-2 checkpoint resumes from that checkpoint, not from the pretrained weights, to the same
    weights as the uninterrupted run (the fine-tune-from-weights path; with LoRA: test_lora_recipes.py)."""
    from zoo.hub.tokenizers import load_tokenizer

    sentencepiece = REPO / "tests" / "fixtures" / "sentencepiece"
    keras.utils.set_random_seed(0)
    model = zoo.get("gemma3-1b", task="causal_lm", **dict(ONE_BLOCK_DEC, vocab_size=336, num_kv_heads=1))
    folder = zoo.hub.save(model, tmp_path / "gemma", tokenizer=load_tokenizer(sentencepiece))
    recipe = recipes.get(weights=str(folder), **FAST)  # 4 steps, a checkpoint every 2
    assert recipe.model is None and recipe.spec.family == "gemma3"
    straight = recipes.run(recipe, recipes_news, str(tmp_path / "straight"))
    assert straight.step == 4 and all(np.isfinite(row["loss"]) for row in straight.history)
    saved = tmp_path / "straight" / "tokenizer" / "tokenizer.model"
    assert saved.read_bytes() == (sentencepiece / "tokenizer.model").read_bytes()

    with pytest.raises(KeyboardInterrupt):
        recipes.run(recipe, recipes_news, str(tmp_path / "resumed"), callbacks=[Interrupt(at_epoch=1)])
    resumed = recipes.run(recipe, recipes_news, str(tmp_path / "resumed"))
    assert (resumed.start_step, resumed.step) == (2, 4)
    for a, b in zip(straight.model.weights, resumed.model.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)


@pytest.fixture(scope="module")
def held_out(recipes_news, tmp_path_factory):
    """Four news articles as a .txt file (a document a line): a small held-out set (each model call on it is
    an eager one)."""
    path = tmp_path_factory.mktemp("held-out") / "news.txt"
    with open(recipes_news, newline="", encoding="utf-8") as f:
        texts = [row["text"].replace("\n", " ") for row, _ in zip(csv.DictReader(f), range(4))]
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return str(path)


def test_zoo_eval_perplexity_on_the_command_line(llama_folder, held_out, capsys):
    """`zoo eval` in this process (the installed entry point: test_recipes.py), which prints what
    recipes.evaluate returns."""
    from zoo.cli import main

    assert main(["eval", str(llama_folder), "--data", held_out, "--sequence-length", "32", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    line = json.loads(out.strip().splitlines()[-1])
    assert line["perplexity"] == pytest.approx(np.exp(line["loss"]), rel=1e-6) and line["tokens"] > 0
    assert 200 < line["perplexity"] < 2000  # random weights over a 512-token vocabulary: close to uniform
    assert "perplexity" in out.splitlines()[0]
