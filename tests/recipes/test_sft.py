"""Supervised fine-tuning (`zoo train --recipe sft`): TRL's row formats trained on what TRL trains
on, bad rows refused by number or dropped and counted, packed rows that never predict across
examples, the loss the mean over trained tokens whatever the other tokens' labels, a run that
resumes bitwise and answers through its template (`zoo generate RUN --chat`), a SavedModel that
keeps the template.

The checkpoint is a tiny Llama saved by zoo with the chat fixtures' byte-level BPE and the
Qwen2.5-style template (tests/fixtures/chat); the conversations are made here."""

import json
import random
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import recipes
import zoo
from recipes import conversation, sft_data
from tests.common import TINY_DEC
from zoo.chat import Chat, ChatTemplate, ChatTemplateError, ChatTokenizer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "chat"


def template_of(name):
    data = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return ChatTemplate(data["template"], data["special_tokens"])


@pytest.fixture(scope="module")
def tokenizer():
    return ChatTokenizer.from_folder(FIXTURES)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One block (what these runs show is per row, per token and per variable, not per layer): each run
    that starts from it traces ~25% faster than from two."""
    folder = tmp_path_factory.mktemp("chat-ckpt")
    keras.utils.set_random_seed(0)
    zoo.hub.save(zoo.get("dec-base", **{**TINY_DEC, "vocab_size": 1000, "num_layers": 1}), folder, overwrite=True)
    shutil.copy(FIXTURES / "tokenizer.json", folder)
    template_of("qwen2.5").save(folder)
    return folder


def conversations(count=48, seed=0):
    """Question/answer pairs of skewed lengths (a few long questions, most short)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        context = " ".join(["The capital of France is Paris."] * rng.choice([0, 0, 0, 1, 4]))
        rows.append({"messages": [{"role": "user", "content": f"{context} What is {a} plus {b}?".strip()},
                                  {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def trained_text(tokenizer, example):
    """The text of the tokens the loss is taken on."""
    return tokenizer.tokenizer.decode([int(i) for i, m in zip(example.ids, example.mask) if m],
                                      skip_special_tokens=False)


def test_each_format_trains_on_what_trl_trains_on(tokenizer):
    template = template_of("qwen2.5")
    user, answer = {"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "5."}
    cases = {
        "messages": ([{"messages": [user, answer]}], "5.<|im_end|>"),
        "prompt-completion": ([{"prompt": "Two plus three is", "completion": " five."}], " five.<|im_end|>"),
        "text": ([{"text": "Paris is in France."}], "Paris is in France.<|im_end|>"),
    }
    for kind, (rows, expected) in cases.items():
        (example,), report = sft_data.examples(kind, rows, template, tokenizer, 128)
        assert trained_text(tokenizer, example) == expected, kind
        assert report.kept == 1
    conversational = [{"prompt": [user], "completion": [answer]}]
    (example,), _ = sft_data.examples("prompt-completion", conversational, template, tokenizer, 128)
    assert trained_text(tokenizer, example) == "5.<|im_end|>"
    (everything,), _ = sft_data.examples("messages", [{"messages": [user, answer]}], template, tokenizer, 128,
                                         loss_on="all")
    assert everything.mask.all()


def test_bad_rows_are_refused_by_number_or_dropped_and_counted(tokenizer, tmp_path):
    good = conversations(3)
    with pytest.raises(ValueError, match=r"row 2: no fine-tuning fields \(found \['text_'\]\)"):
        sft_data.read_rows(write_jsonl(tmp_path / "a.jsonl", [good[0], {"text_": "x"}]))
    with pytest.raises(ValueError, match="every row must have the first row's format"):
        sft_data.read_rows(write_jsonl(tmp_path / "b.jsonl", [good[0], {"text": "x"}]))
    template = template_of("qwen2.5")
    not_a_message = [good[0], {"messages": [{"role": "user", "content": "beep"}, "boop"]}]
    with pytest.raises(ChatTemplateError, match="Row 2: Message 1 is not a {'role': ..., 'content': ...} dict"):
        sft_data.examples("messages", not_a_message, template, tokenizer, 128)
    with pytest.raises(ValueError, match="Row 1: `tools` is a string that is not JSON"):
        sft_data.examples("messages", [{**good[0], "tools": "[{"}], template, tokenizer, 128)
    alternating = [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}]
    with pytest.raises(ChatTemplateError, match="Row 1: .*refused the conversation: Conversation roles must alternate"):
        sft_data.examples("messages", alternating, template_of("gemma"), tokenizer, 128)
    long = {"messages": [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}]}
    no_answer = {"messages": [{"role": "user", "content": "hello"}]}
    empty_answer = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": ""}]}
    kept, report = sft_data.examples("messages", [good[0], long, no_answer, good[1], empty_answer], template,
                                     tokenizer, 96)
    assert (report.kept, report.too_long, report.no_trained_token, report.dropped_rows) == (3, 1, 1, [2, 3])
    assert report.longest > 96 and all(e.mask[1:].any() for e in kept)
    # the empty answer still trains its end-of-turn token, as transformers' mask has it
    assert report.trained_tokens == sum(int(e.mask[1:].sum()) for e in kept)
    lines = " ".join(report.lines(96))
    assert "Dropped 1 example(s) longer than 96" in lines and "no token to train on" in lines


def test_an_answer_that_starts_the_row_cannot_train_its_first_token(tokenizer):
    """An empty prompt and no BOS: the completion's first token sits at position 0, which nothing predicts. The
    example is kept and trains on the rest of its answer, and the report counts the token as it counts other
    drops; plain text (every token weighed, the first never trained, as any LM's) is not counted."""
    template = template_of("qwen2.5")
    rows = [{"prompt": "", "completion": "Yes, gladly."}, {"prompt": "Answer:", "completion": " Yes."}]
    (first, second), report = sft_data.examples("prompt-completion", rows, template, tokenizer, 128)
    assert first.mask.all() and not second.mask[0]
    targets = first.ids[1:][first.mask[1:] == 1]
    assert tokenizer.tokenizer.decode(targets.tolist(), skip_special_tokens=False) == "es, gladly.<|im_end|>"
    assert (report.kept, report.untrained_first_token) == (2, 1)
    assert report.trained_tokens == int(first.mask[1:].sum() + second.mask[1:].sum())
    assert "Dropped the first answer token of 1 example(s): the answer starts the sequence" in " ".join(
        report.lines(128))
    _, text = sft_data.examples("text", [{"text": "Yes."}], template, tokenizer, 128)
    assert text.untrained_first_token == 0 and "first answer token" not in " ".join(text.lines(128))


@pytest.mark.parametrize("name, case", [("qwen2.5-instruct", "tool_call_no_content"),
                                        ("qwen3", "enable_thinking_false"), ("llama3.1-8b-instruct", "date_string")])
def test_rows_carry_tools_and_template_kwargs_as_trl_reads_them(name, case):
    """TRL's `tools` (a list, or a JSON string) and `chat_template_kwargs` columns reach the stock template:
    ids and mask equal transformers' (tests/fixtures/chat/stock)."""
    stock = FIXTURES / "stock"
    data = json.loads((stock / f"{name}.json").read_text(encoding="utf-8"))
    (case,) = [c for c in data["cases"] if c["name"] == case]
    template = ChatTemplate((stock / data["template_file"]).read_text(encoding="utf-8"), data["special_tokens"])
    row = {"messages": case["messages"], "chat_template_kwargs": case["template_kwargs"]}
    if case["tools"]:
        row["tools"] = json.dumps(case["tools"])
    (example,), _ = sft_data.examples("messages", [row], template, ChatTokenizer.from_folder(stock), 4096)
    assert example.ids.tolist() == case["input_ids"]
    assert example.mask.tolist() == case["assistant_masks"]


def test_packed_rows_hold_each_example_once_and_never_predict_across_them(tokenizer):
    examples, _ = sft_data.examples("messages", conversations(40), template_of("qwen2.5"), tokenizer, 256)
    recipe = recipes.get("sft").replace(batch_size=2, sequence_length=256, packing=True)
    rows = conversation.epoch_rows(examples, 256, recipe.seed, 0, packed=True)
    assert sorted(id(e) for row in rows for e in row) == sorted(id(e) for e in examples)
    assert all(sum(len(e.ids) - 1 for e in row) <= 256 for row in rows)
    assert len(rows) < len(examples) / 2  # best-fit decreasing packs short answers together
    x, targets, weights = next(sft_data.batches(examples, recipe))
    for b in range(2):
        docs = x["padding_mask"][b]
        for number in range(1, docs.max() + 1):
            at = np.flatnonzero(docs == number)
            assert (np.diff(at) == 1).all()  # one contiguous run per example
            ids = np.concatenate([x["token_ids"][b, at], targets[b, at[-1:]]])
            match = [e for e in examples if len(e.ids) == len(ids) and (e.ids == ids).all()]
            assert match, "a packed example's inputs and targets are its own tokens, shifted by one"
            np.testing.assert_array_equal(weights[b, at] > 0, match[0].mask[1:] > 0)
    assert (weights[x["padding_mask"] == 0] == 0).all()
    # the batch's weights average the loss over its trained tokens
    np.testing.assert_allclose(weights.sum(), weights.size, rtol=1e-6)
    assert sft_data.statistics(examples, recipe)["padding_fraction"] < sft_data.statistics(
        examples, recipe.replace(packing=False))["padding_fraction"]


def test_loss_is_the_mean_over_trained_tokens_and_ignores_other_labels(tokenizer):
    """Changing a user turn's labels changes neither the loss nor the gradients (bitwise); the
    loss equals the hand-computed mean cross-entropy over the assistant tokens."""
    examples, _ = sft_data.examples("messages", conversations(8), template_of("qwen2.5"), tokenizer, 256)
    recipe = recipes.get("sft").replace(batch_size=2, sequence_length=256, packing=True)
    x, targets, weights = next(sft_data.batches(examples, recipe))
    keras.utils.set_random_seed(1)
    model = zoo.get("dec-base", **{**TINY_DEC, "vocab_size": 1000})
    model.set_packed(True)
    model.compile(loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})

    def loss_and_grads(labels):
        with tf.GradientTape() as tape:
            outputs = model.backbone(x, training=True)
            loss, _ = model.training_loss(outputs, x, labels, tf.constant(weights))
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = loss_and_grads(tf.constant(targets))
    scrambled = np.where(weights == 0, (targets + 7) % 1000, targets)
    assert (scrambled != targets).sum() > 100
    loss2, grads2 = loss_and_grads(tf.constant(scrambled))
    assert float(loss) == float(loss2)
    for g, g2 in zip(grads, grads2):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(g2))
    logits = model(x)["logits"]
    per = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True).numpy()
    trained = weights > 0
    np.testing.assert_allclose(float(loss), per[trained].mean(), rtol=1e-5)


def test_sft_run_resumes_bitwise_answers_and_exports_its_template(checkpoint, tmp_path, capsys):
    data = write_jsonl(tmp_path / "chat.jsonl", conversations(40))
    recipe = recipes.get("sft", weights=str(checkpoint)).replace(
        batch_size=2, sequence_length=192, steps=4, log_every=2, checkpoint_every=2, learning_rate=3e-3,
        precision="float32", packing=True, checkpointing="full")
    straight = recipes.run(recipe, str(data), str(tmp_path / "straight"), validation_every=5, verbose=0)
    assert [row["step"] for row in straight.history] == [2, 4] and "val_loss" in straight.history[-1]
    assert straight.data["examples_per_row"] > 1.5 and straight.data["format"] == "messages"
    half = recipes.run(recipe.with_steps(4), str(data), str(tmp_path / "resumed"), validation_every=5, verbose=0,
                       callbacks=[_StopAfter(1)])
    assert half.step == 2
    resumed = recipes.run(recipe, str(data), str(tmp_path / "resumed"), validation_every=5, verbose=0)
    assert resumed.start_step == 2
    for a, b in zip(straight.model.weights, resumed.model.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    run = tmp_path / "straight"
    chat = Chat.find(run)
    assert chat.template.source == template_of("qwen2.5").source
    assert chat.stop_ids == [tokenizer_id(chat, "<|im_end|>")]
    from zoo.cli import main

    capsys.readouterr()
    assert main(["generate", str(run), "--chat", "What is 2 plus 2?", "--max-new-tokens", "4"]) == 0
    model = zoo.load(str(run))  # attaches the run's chat as model.chat
    assert model.chat.stop_ids == chat.stop_ids
    answer = zoo.generation.generate(model, messages=[{"role": "user", "content": "What is 2 plus 2?"}],
                                     max_new_tokens=4)
    assert capsys.readouterr().out.strip() == answer.strip()
    with pytest.raises(ValueError, match=r"set_packed\(False\)"):  # the run's own model still reads documents
        zoo.export.saved_model(straight.model, tmp_path / "refused", sequence_length=64)
    export = zoo.export.saved_model(model, tmp_path / "export", sequence_length=64, generate=False)  # + model.chat
    assert ChatTemplate.find(export / "assets.extra").source == chat.template.source


class _StopAfter(keras.callbacks.Callback):
    """Stop `fit` after a number of logged intervals, as a killed run would (its checkpoint is written)."""

    def __init__(self, intervals):
        super().__init__()
        self.intervals = intervals

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.intervals:
            self.model.stop_training = True


def tokenizer_id(chat, token):
    return chat.tokenizer.token_id(token)


@pytest.mark.parametrize("name, ends", [("qwen2.5", ["<|im_end|>"]), ("llama3", ["<|eot_id|>"]),
                                        ("gemma", ["<end_of_turn>", "<eos>"])])
def test_generation_stops_at_the_templates_end_of_turn(name, ends, tokenizer):
    chat = Chat(template_of(name), tokenizer)
    assert chat.stop_ids == [tokenizer.token_id(t) for t in ends]
    messages = [{"role": "user", "content": "Hi"}]
    text = chat.template.render(messages, add_generation_prompt=True)
    assert chat.tokenizer.tokenizer.decode(chat.prompt_ids(messages).tolist(), skip_special_tokens=False) == text


def test_show_mask_prints_a_row_as_it_trains(checkpoint, tmp_path, capsys):
    """`zoo train --recipe sft --show-mask ROW` (with the run's template kwargs) draws what a row trains."""
    from zoo.cli import main

    path = write_jsonl(tmp_path / "chat.jsonl", conversations(2))
    code = main(["train", "--recipe", "sft", "--weights", str(checkpoint), "--data", str(path), "--show-mask", "2",
                 "--chat-template-kwargs", '{"enable_thinking": false}'])
    out = capsys.readouterr().out
    answer = conversations(2)[1]["messages"][1]["content"]
    assert code in (0, None) and f"<|im_start|>assistant\n⟦{answer}<|im_end|>⟧\n" in out
    assert "-- row 2:" in out and "trained" in out
    with pytest.raises(SystemExit):  # argparse's usage error
        main(["train", "--recipe", "sft", "--weights", str(checkpoint), "--data", str(path), "--show-mask", "1",
              "--chat-template-kwargs", "[1]"])
    assert "--chat-template-kwargs: takes a JSON object" in capsys.readouterr().err
