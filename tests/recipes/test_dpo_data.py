"""Preference data (recipes/dpo_data.py): token ids and completion masks equal trl 1.16 DPOTrainer's own
(tests/fixtures/dpo_peft/data.json, made by tools/make_dpo_peft_fixtures.py), and so does the batch layout
against its collator; [P, 2, S] batches, the masks only on completions, over-long pairs dropped and counted,
every bad row refused by number, the seeded order and skip, stored reference log-probabilities aligned with
their pairs. The tokenizer and the Qwen2.5-style template are tests/fixtures/chat's."""

import json
from pathlib import Path

import numpy as np
import pytest

import recipes
from recipes import dpo_data
from zoo.chat import ChatTemplate, ChatTemplateError, ChatTokenizer

FIXTURES = Path(__file__).parent.parent / "fixtures"
USER = {"role": "user", "content": "What color is the sky?"}


def answer(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def tokenizer():
    return ChatTokenizer.from_folder(FIXTURES / "chat")


@pytest.fixture(scope="module")
def template():
    data = json.loads((FIXTURES / "chat" / "qwen2.5.json").read_text(encoding="utf-8"))
    return ChatTemplate(data["template"], data["special_tokens"])


def recipe(batch_size=2, sequence_length=48, seed=0):
    return recipes.get("sft").replace(batch_size=batch_size, sequence_length=sequence_length, seed=seed)


def plain_rows(count):
    """Pairs of distinct, uneven lengths."""
    return [{"prompt": f"Question {i}:" + " and" * (i % 3), "chosen": f" yes{'!' * i}", "rejected": " no"}
            for i in range(count)]


def scored(tokenizer, encoded):
    """The text of the tokens a sequence is scored on (the targets of weight 1)."""
    return tokenizer.tokenizer.decode([int(i) for i in encoded.ids[encoded.mask == 1]], skip_special_tokens=False)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_tokens_masks_and_batches_equal_trls(template, tokenizer):
    data = json.loads((FIXTURES / "dpo_peft" / "data.json").read_text(encoding="utf-8"))
    assert data["versions"]["trl"] == "1.16.0" and data["pad_token_id"] == 0
    for name, group in data["groups"].items():
        kind = "explicit" if "prompt" in group["rows"][0] else "implicit"
        pairs, report = dpo_data.pairs(kind, group["rows"], template, tokenizer, 512)
        assert report.kept == len(group["rows"]), name
        for pair, trl in zip(pairs, group["processed"]):
            for side, encoded in (("chosen", pair.chosen), ("rejected", pair.rejected)):
                assert encoded.ids.tolist() == trl["prompt_ids"] + trl[f"{side}_ids"], (name, pair.number, side)
                assert encoded.mask.tolist() == [0] * len(trl["prompt_ids"]) + [1] * len(trl[f"{side}_ids"])
        # TRL's collated batch (chosen rows, then rejected rows, padded with 0) is ours, shifted by one position
        batch = {k: np.asarray(v) for k, v in group["batch"].items()}
        (indices, x, y), = dpo_data.reference_batches(pairs, len(pairs), batch["input_ids"].shape[1] - 1)
        np.testing.assert_array_equal(indices, np.arange(len(pairs)))

        def ours(a):  # [P, 2, S] -> TRL's [2P, S]
            return np.concatenate([a[:, 0], a[:, 1]])

        shifted = batch["attention_mask"][:, 1:]
        np.testing.assert_array_equal(ours(x["padding_mask"]), shifted, err_msg=name)
        np.testing.assert_array_equal(ours(x["token_ids"]), batch["input_ids"][:, :-1] * shifted, err_msg=name)
        np.testing.assert_array_equal(ours(y["targets"]), batch["input_ids"][:, 1:], err_msg=name)
        np.testing.assert_array_equal(ours(y["weights"]), batch["completion_mask"][:, 1:], err_msg=name)


def test_masks_cover_the_completions_only(template, tokenizer):
    rows = [{"prompt": [USER], "chosen": answer("Blue."), "rejected": answer("Green, often.")}]
    (pair,), _ = dpo_data.pairs("explicit", rows, template, tokenizer, 256)
    # TRL scores what the whole adds after the generation prompt: the answer, its end-of-turn token and newline
    assert (scored(tokenizer, pair.chosen), scored(tokenizer, pair.rejected)) == (
        "Blue.<|im_end|>\n", "Green, often.<|im_end|>\n")
    prompt = template.render([USER], add_generation_prompt=True)
    assert tokenizer.tokenizer.decode(pair.chosen.ids[pair.chosen.mask == 0].tolist(),
                                      skip_special_tokens=False) == prompt
    plain = [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green.<|im_end|>"}]
    (pair,), _ = dpo_data.pairs("explicit", plain, template, tokenizer, 256)
    assert (scored(tokenizer, pair.chosen), scored(tokenizer, pair.rejected)) == (
        " blue.<|im_end|>", " green.<|im_end|>")  # eos appended once, as TRL appends it
    implicit = [{"chosen": [USER, *answer("Blue.")], "rejected": [USER, *answer("Green.")]}]
    (same,), _ = dpo_data.pairs("implicit", implicit, template, tokenizer, 256)
    (explicit,), _ = dpo_data.pairs("explicit", [{"prompt": [USER], "chosen": answer("Blue."),
                                                  "rejected": answer("Green.")}], template, tokenizer, 256)
    for a, b in ((same.chosen, explicit.chosen), (same.rejected, explicit.rejected)):
        assert a.ids.tolist() == b.ids.tolist() and a.mask.tolist() == b.mask.tolist()


def test_an_empty_prompt_without_bos_scores_the_answers_from_their_second_token(template, tokenizer):
    """TRL's tokens for an empty prompt (data.json's, checked above): this tokenizer, like Qwen's, adds no BOS, so
    the answers start at position 0, whose token nothing predicts. The pair is kept, scored from each answer's
    second token (as TRL scores it), and counted in the report."""
    rows = [{"prompt": "", "chosen": "Yes, gladly.", "rejected": "No."}, *plain_rows(1)]
    (pair, other), report = dpo_data.pairs("explicit", rows, template, tokenizer, 48)
    assert pair.chosen.mask.all() and pair.rejected.mask.all() and not other.chosen.mask[0]
    (_, _, y), = dpo_data.reference_batches([pair], 1, 48)
    texts = [tokenizer.tokenizer.decode(y["targets"][0, side][y["weights"][0, side] == 1].tolist(),
                                        skip_special_tokens=False) for side in (0, 1)]
    assert texts == ["es, gladly.<|im_end|>", ".<|im_end|>"]
    assert (report.kept, report.untrained_first_token) == (2, 1)
    assert "Dropped the first answer token of 1 pair(s)" in " ".join(report.lines(48))


def test_batches_are_pairs_of_rows(template, tokenizer):
    pairs, _ = dpo_data.pairs("explicit", plain_rows(5), template, tokenizer, 48)
    x, y = next(dpo_data.batches(pairs, recipe(batch_size=2, sequence_length=48)))
    assert {k: (v.shape, v.dtype.name) for k, v in {**x, **y}.items()} == {
        "token_ids": ((2, 2, 48), "int32"), "padding_mask": ((2, 2, 48), "int32"),
        "targets": ((2, 2, 48), "int32"), "weights": ((2, 2, 48), "float32")}
    by_ids = {tuple(p.chosen.ids[:-1]): p for p in pairs}
    for b in range(2):
        pair = by_ids[tuple(x["token_ids"][b, 0][x["padding_mask"][b, 0] == 1])]
        for side, encoded in enumerate((pair.chosen, pair.rejected)):
            n = len(encoded.ids) - 1
            np.testing.assert_array_equal(x["token_ids"][b, side, :n], encoded.ids[:-1])
            np.testing.assert_array_equal(y["targets"][b, side, :n], encoded.ids[1:])
            np.testing.assert_array_equal(y["weights"][b, side, :n], encoded.mask[1:])  # 0/1, not rescaled
            assert x["padding_mask"][b, side, :n].all() and not x["padding_mask"][b, side, n:].any()
            assert not x["token_ids"][b, side, n:].any() and not y["weights"][b, side, n:].any()
    ds = dpo_data.dataset(pairs, recipe(batch_size=2, sequence_length=48), reference=np.zeros((5, 2), "float32"))
    tx, ty = next(iter(ds))
    assert tuple(tx["token_ids"].shape) == (2, 2, 48) and tuple(ty["reference_logps"].shape) == (2, 2)
    np.testing.assert_array_equal(tx["token_ids"].numpy(), x["token_ids"])
    stats = dpo_data.statistics(pairs, 48)
    assert stats["pairs"] == 5 and 0 < stats["padding_fraction"] < 1 and stats["completion_tokens"] > 1


def test_long_pairs_are_dropped_and_counted(template, tokenizer):
    rows = plain_rows(3) + [{"prompt": "word " * 40, "chosen": " yes", "rejected": " no"},
                            {"prompt": "Q:", "chosen": " yes", "rejected": " no" * 40}]  # the rejected side is long
    pairs, report = dpo_data.pairs("explicit", rows, template, tokenizer, 32)
    assert [p.number for p in pairs] == [1, 2, 3]
    assert (report.rows, report.kept, report.too_long, report.dropped_rows) == (5, 3, 2, [4, 5])
    assert report.longest > 32
    assert "Dropped 2 pair(s) longer than 32 positions" in " ".join(report.lines(32))
    kept, _ = dpo_data.pairs("explicit", rows, template, tokenizer, 32, numbers=[2, 5])
    assert [p.number for p in kept] == [2]


def test_bad_rows_are_refused_with_their_number_and_the_fix(template, tokenizer, tmp_path):
    good = {"prompt": [USER], "chosen": answer("Blue."), "rejected": answer("Green.")}
    assert dpo_data.read_rows(write_jsonl(tmp_path / "ok.jsonl", [good])) == ("explicit", [good])
    with pytest.raises(ValueError, match=r"row 2: no fine-tuning fields \(found \['chosen', 'prompt'\]\).*"
                                         r"'chosen' \+ 'rejected'"):
        dpo_data.read_rows(write_jsonl(tmp_path / "a.jsonl", [good, {"prompt": "x", "chosen": "y"}]))
    with pytest.raises(ValueError, match="row 2: a 'implicit' row in a 'explicit' file"):
        dpo_data.read_rows(write_jsonl(tmp_path / "b.jsonl", [good, {"chosen": "x", "rejected": "y"}]))

    def refused(rows, match, kind="explicit", error=ValueError, **options):
        with pytest.raises(error, match=match):
            dpo_data.pairs(kind, rows, options.pop("template", template), tokenizer, 256, **options)

    plain = {"prompt": "Q:", "chosen": " yes", "rejected": " no"}
    refused([good, plain], r"Row 2: 'prompt' is a str where the file's first row makes it a list of messages")
    refused([plain, {**plain, "rejected": ""}], "Row 2: the rejected answer is empty")
    refused([{**good, "chosen": answer("")}], "Row 1: the chosen answer is empty")
    refused([{**good, "chosen": []}], "Row 1: chosen holds no message")
    refused([{**good, "rejected": [USER]}], r"Row 1: rejected's message 0 is 'user', not the assistant's.*prompt")
    refused([{**good, "prompt": []}], "Row 1: the prompt is empty")
    refused([{**good, "prompt": [{"content": "beep"}]}], "Row 1: Message 0 is not a", error=ChatTemplateError)
    refused([good], "Conversations need the checkpoint's chat template", error=ChatTemplateError, template=None)
    other = {"role": "user", "content": "What color is grass?"}
    refused([{"chosen": [USER, *answer("Blue.")], "rejected": [other, *answer("Green.")]}],
            "Row 1: chosen and rejected must be conversations that share every turn but the last", kind="implicit")
    refused([{"chosen": [USER, *answer("Blue.")], "rejected": [USER, *answer("Blue.")]}],
            "Row 1: chosen and rejected are the same", kind="implicit")
    refused([{"chosen": [USER, *answer("Blue.")], "rejected": [USER, other]}],  # the last turn is not an answer
            "Row 1: rejected's message 0 is 'user', not the assistant's", kind="implicit")
    # "sk" + "y" is one token, "sky": the answer adds no token of its own after the prompt's
    refused([{"prompt": "sk", "chosen": "y", "rejected": "ies"}], "Row 1: the chosen answer has no token to score",
            eos="")


def test_order_is_seeded_skip_resumes_and_validation_is_one_pass(template, tokenizer):
    pairs, _ = dpo_data.pairs("explicit", plain_rows(7), template, tokenizer, 48)
    index = {tuple(p.chosen.ids[:-1]): i for i, p in enumerate(pairs)}

    def stream(r, count, **options):
        out, it = [], dpo_data.batches(pairs, r, **options)
        for _ in range(count):
            x, _ = next(it)
            out.append([index[tuple(row[mask == 1])] for row, mask in zip(x["token_ids"][:, 0],
                                                                          x["padding_mask"][:, 0])])
        return out

    first = stream(recipe(batch_size=3), 6)
    assert first == stream(recipe(batch_size=3), 6)  # a function of the seed
    assert first != stream(recipe(batch_size=3, seed=1), 6)
    assert all(len(b) == 3 for b in first)  # whole batches: 7 pairs make 2 an epoch
    for epoch in range(3):
        assert len(set(first[2 * epoch] + first[2 * epoch + 1])) == 6  # no pair twice within an epoch
    assert stream(recipe(batch_size=3), 3, skip=3) == first[3:]  # a resumed run, across an epoch's end
    valid = stream(recipe(batch_size=3), 3, training=False)
    assert sorted(sum(valid, [])) == list(range(7)) and [len(b) for b in valid] == [3, 3, 1]
    with pytest.raises(StopIteration):
        stream(recipe(batch_size=3), 4, training=False)
    with pytest.raises(ValueError, match="7 pair.* make no batch of 8; lower --batch-size"):
        stream(recipe(batch_size=8), 1)


def test_reference_logps_travel_with_their_pairs(template, tokenizer):
    pairs, _ = dpo_data.pairs("explicit", plain_rows(5), template, tokenizer, 48)
    reference = np.array([[-i - 0.5, -i - 0.25] for i in range(5)], np.float32)
    index = {tuple(p.chosen.ids[:-1]): i for i, p in enumerate(pairs)}
    for training in (True, False):
        for x, y in dpo_data.batches(pairs, recipe(batch_size=2), training=training, reference=reference):
            at = [index[tuple(row[mask == 1])] for row, mask in zip(x["token_ids"][:, 0], x["padding_mask"][:, 0])]
            np.testing.assert_array_equal(y["reference_logps"], reference[at])
            assert y["reference_logps"].dtype == np.float32
            if training:
                break
    seen = []
    for indices, x, y in dpo_data.reference_batches(pairs, 2, 48):  # natural order, the last batch partial
        assert "reference_logps" not in y and x["token_ids"].shape == (len(indices), 2, 48)
        assert [index[tuple(row[mask == 1])] for row, mask in zip(x["token_ids"][:, 0],
                                                                  x["padding_mask"][:, 0])] == indices.tolist()
        seen += indices.tolist()
    assert seen == list(range(5))
    with pytest.raises(ValueError, match=r"reference holds \(4, 2\) log-probabilities; want \[5, 2\]"):
        next(dpo_data.batches(pairs, recipe(), reference=reference[:4]))


@pytest.mark.parametrize("name, case", [("llama3.1-8b-instruct", "date_string"), ("qwen2.5-instruct", "tools_no_call")])
def test_rows_carry_tools_and_template_kwargs_as_trl_reads_them(name, case):
    """TRL's `tools` and `chat_template_kwargs` columns reach the template: the chosen sequence's ids are
    transformers' for the whole conversation (tests/fixtures/chat/stock)."""
    stock = FIXTURES / "chat" / "stock"
    data = json.loads((stock / f"{name}.json").read_text(encoding="utf-8"))
    (case,) = [c for c in data["cases"] if c["name"] == case]
    template = ChatTemplate((stock / data["template_file"]).read_text(encoding="utf-8"), data["special_tokens"])
    *prompt, chosen = case["messages"]
    row = {"prompt": prompt, "chosen": [chosen], "rejected": answer("No idea."), "tools": case["tools"],
           "chat_template_kwargs": case["template_kwargs"]}
    (pair,), _ = dpo_data.pairs("explicit", [row], template, ChatTokenizer.from_folder(stock), 4096)
    assert pair.chosen.ids.tolist() == case["input_ids"]
    assert pair.chosen.mask[-1] == 1 and pair.rejected.mask[-1] == 1
