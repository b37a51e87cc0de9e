"""Every registered recipe (each zoo model's own, and the fine-tuning ones) builds at a tiny shape and takes
one optimizer step on a batch of real news text made by its own data path (the corpus pipeline, chat rows or
preference pairs): the loss is finite and the weights it trains move. Recipes that train LoRA adapters on
released weights (the 3B-8B checkpoints') start from a tiny checkpoint of their model's family and shape
rules, saved once per model."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import recipes
import zoo
from recipes import data, dpo_data, sft_data, vocab
from tests.common import TINY_RECIPE, TINY_RECIPE_DEC
from zoo.chat import Encoded

ROWS, LENGTH, PROMPT = 2, 16, 8  # batch 2 x 16 tokens (chat rows: a prompt of 8): one step is tested, not learning
# One block (the families' layer rhythms train in test_recipes.py): building and stepping a model here costs
# ~0.5 s a block on 2 cores.
ONE_BLOCK, ONE_BLOCK_DEC = dict(TINY_RECIPE, num_layers=1), dict(TINY_RECIPE_DEC, num_layers=1)
SHRUNK = dict(batch_size=ROWS, sequence_length=LENGTH, accumulation_steps=1, steps=10, warmup_steps=0,
              shuffle_buffer=8, max_predictions=3, log_every=1, checkpoint_every=1)


def test_every_registered_model_has_a_recipe_of_its_own_name():
    assert set(zoo.names()) <= set(recipes.names()), sorted(set(zoo.names()) - set(recipes.names()))
    assert all(recipes.get(name).notes for name in recipes.names())  # where its settings come from


@pytest.fixture(scope="module")
def texts(recipes_news):
    """The first 16 news articles, one string each."""
    docs = data.documents(recipes_news, column="text").take(16)
    return [t.decode("utf-8") for t in docs.as_numpy_iterator()]


@pytest.fixture(scope="module")
def tokenizers(recipes_vocab):
    return {family: vocab.load(folder, family) for family, folder in recipes_vocab.items()}


@pytest.fixture(scope="module")
def checkpoint(tokenizers, tmp_path_factory):
    """checkpoint(name): a Hugging Face folder of `name`'s family at the tiny shape (random weights, the news
    vocabulary), made once per name."""
    made = {}

    def make(name):
        if name not in made:
            keras.utils.set_random_seed(0)
            model = zoo.get(name, **ONE_BLOCK_DEC)
            made[name] = zoo.hub.save(model, tmp_path_factory.mktemp(name) / "hf", tokenizer=tokenizers["llama"])
        return str(made[name])

    return make


def shrunk(name, checkpoint):
    """`name`'s recipe at the tiny shape; a LoRA recipe starts from its model's tiny checkpoint, whose own
    shape it then takes (the registered name's is 3B-8B)."""
    recipe = recipes.get(name)
    if recipe.lora_rank:
        return recipes.get(name, weights=checkpoint(recipe.model), model=None, **SHRUNK)
    shape = ONE_BLOCK_DEC if recipe.spec.is_decoder else ONE_BLOCK
    grpo = dict(max_completion_length=LENGTH - PROMPT, num_generations=2) if recipe.grpo else {}
    return recipe.replace(model_overrides=shape, **SHRUNK, **grpo)


def encoded(tokenizer, texts):
    """Prompt / completion examples of LENGTH + 1 tokens: the loss mask on the completion."""
    ids = [np.asarray(tokenizer(t))[:LENGTH + 1].astype("int32") for t in texts]
    mask = np.r_[np.zeros(PROMPT), np.ones(LENGTH + 1 - PROMPT)].astype("int8")
    return [Encoded(i, mask) for i in ids if len(i) == LENGTH + 1]


def one_batch(recipe, model, tokenizer, texts, reuters):
    """(x, y[, sample weights]) of one batch, as the recipe's own data path makes it (GRPO: prompt rows, its step
    set on the model as recipes.grpo does, with a reward that tells completions apart)."""
    if recipe.grpo:
        prompts = [np.asarray(tokenizer(t))[:PROMPT].astype("int32") for t in texts[:ROWS]]

        def score(rows, sampled):
            lengths = sampled["completion_ids"].sum(axis=1).astype("float32")  # any figure that varies
            return lengths[:, None], lengths

        zoo.grpo.set_grpo(model, zoo.grpo.GrpoStep(recipe.grpo_settings, prompts, score, ["ids"]))
        return {"rows": np.arange(ROWS, dtype="int32")}, None
    if recipe.preference:
        examples = encoded(tokenizer, texts)
        # the rejected answer: another article's continuation of the same prompt
        pairs = [dpo_data.Pair(i, a, Encoded(np.r_[a.ids[:PROMPT], b.ids[PROMPT:]], a.mask))
                 for i, (a, b) in enumerate(zip(examples[::2], examples[1::2]))]
        reference = None
        if recipe.preference_reference == "stored":  # scored by the starting weights, as recipes.dpo does
            tf.config.run_functions_eagerly(True)  # its scoring function untraced
            try:
                reference = zoo.preference.reference_logps(model, dpo_data.reference_batches(pairs, ROWS, LENGTH))
            finally:
                tf.config.run_functions_eagerly(False)
        return next(dpo_data.batches(pairs, recipe, reference=reference))
    if recipe.supervised:
        return next(sft_data.batches(encoded(tokenizer, texts), recipe))
    if recipe.task == "classifier":
        docs = data.documents(reuters, column="text", label_column="label").take(32)
        return next(iter(data.pipeline(recipe, tokenizer, docs, data.labels_of(docs))))
    return next(iter(data.pipeline(recipe, tokenizer, tf.data.Dataset.from_tensor_slices(texts))))


@pytest.fixture(scope="module")
def batches(tokenizers, texts, recipes_reuters):
    """batch(recipe, model): `one_batch`, made once per kind of batch (tokenizing in tf.data traces the
    tokenizer, seconds a pipeline); the stored DPO reference is the model's own, so scored each time. A
    masked-LM batch serves BERT (segment ids) and ModernBERT (none) alike."""
    made = {}

    def batch(recipe, model):
        kind = (recipe.task, vocab.family_of(recipe.spec), recipe.supervised, recipe.preference, recipe.grpo)
        if recipe.preference_reference == "stored" or recipe.grpo or kind not in made:
            tokenizer = tokenizers[vocab.family_of(recipe.spec)]
            made[kind] = one_batch(recipe.replace(model="enc-base") if recipe.task == "masked_lm" else recipe,
                                   model, tokenizer, texts, recipes_reuters)
        if recipe.grpo:
            return made[kind]
        x, *rest = tf.nest.map_structure(tf.convert_to_tensor, made[kind])
        if not recipe.segments:
            x = {k: v for k, v in x.items() if k != "segment_ids"}
        return (x, *rest)

    return batch


@pytest.mark.parametrize("name", sorted(recipes.names()))
def test_recipe_takes_a_step(name, checkpoint, batches):
    recipe = shrunk(name, checkpoint)
    keras.utils.set_random_seed(0)
    model = recipes.build(recipe)
    assert model.checkpointing == recipe.checkpointing  # its policy's run on real text: test_recipes.py
    batch = batches(recipe, model)
    before = [v.numpy().copy() for v in model.trainable_variables]
    x, y, *weights = batch
    model.run_eagerly = True  # the same train_step untraced: tracing costs 5-10 s a recipe on 2 cores
    loss = float(model.train_on_batch(x, y, sample_weight=weights[0] if weights else None, return_dict=True)["loss"])
    assert math.isfinite(loss), loss
    moved = [v.path for v, b in zip(model.trainable_variables, before) if not np.array_equal(v.numpy(), b)]
    assert moved, f"{name}: one step changed none of {len(before)} trained variables"
    if recipe.lora_rank:  # only the adapters train, on the frozen base in the recipe's dtype
        assert all("lora_kernel" in v.path for v in model.trainable_variables)
        assert model.dtype_policy.name == recipe.dtype_policy


def test_a_lora_recipe_needs_weights_and_names_them(tmp_path, recipes_news):
    """The 3B-8B recipes hold no weights: a run without them is refused before anything is written, naming
    the flag and the checkpoint."""
    out = tmp_path / "run"
    refusal = r"recipe of 'llama3.1-8b' trains LoRA.*--weights BASE.*meta-llama/Llama-3.1-8B shape"
    with pytest.raises(ValueError, match=refusal):
        recipes.run("llama3.1-8b", recipes_news, str(out))
    assert not out.exists()


def test_zoo_train_with_weights_runs_the_models_own_recipe(tmp_path, capsys):
    """Only config.json is read to resolve the recipe (`--show`): a folder with the real shape's config."""
    from tests.recipes.test_recipes import _zoo

    folder = tmp_path / "qwen3-8b"
    folder.mkdir()
    config = zoo.hub.config_from_spec(zoo.spec("qwen3-8b"), "causal_lm", dtype="bfloat16")
    (folder / "config.json").write_text(json.dumps(config))
    assert _zoo(["train", "qwen3-8b", "--weights", str(folder), "--data", "chat.jsonl", "--show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    own = recipes.get("qwen3-8b")
    assert (shown["model"], shown["weights"], shown["supervised"]) == ("qwen3-8b", str(folder), True)
    assert (shown["lora_rank"], shown["learning_rate"], shown["clipnorm"]) == (own.lora_rank, 1e-4, 1.0)
    # without the model's name, the checkpoint's kind decides: finetune-lm
    assert _zoo(["train", "--weights", str(folder), "--data", "c.txt", "--show"]) == 0
    assert json.loads(capsys.readouterr().out)["learning_rate"] == recipes.get("finetune-lm").learning_rate
