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
from recipes import dpo_data, sft_data
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
    """completion_mask="trl": TRL's ids, masks and collated batch, exactly. By default the same ids and, for
    conversations, TRL's mask less the one token TRL scores past the answer's chat span: the "\n" this template
    writes after <|im_end|>."""
    data = json.loads((FIXTURES / "dpo_peft" / "data.json").read_text(encoding="utf-8"))
    assert data["versions"]["trl"] == "1.16.0" and data["pad_token_id"] == 0
    separators = 0
    for name, group in data["groups"].items():
        kind = "explicit" if "prompt" in group["rows"][0] else "implicit"
        pairs, report = dpo_data.pairs(kind, group["rows"], template, tokenizer, 512, completion_mask="trl")
        spans, _ = dpo_data.pairs(kind, group["rows"], template, tokenizer, 512)
        assert report.kept == len(group["rows"]), name
        for pair, own, trl in zip(pairs, spans, group["processed"]):
            for side in ("chosen", "rejected"):
                encoded, ours = getattr(pair, side), getattr(own, side)
                want = np.array([0] * len(trl["prompt_ids"]) + [1] * len(trl[f"{side}_ids"]))
                assert encoded.ids.tolist() == ours.ids.tolist() == trl["prompt_ids"] + trl[f"{side}_ids"], (
                    name, pair.number, side)
                assert encoded.mask.tolist() == want.tolist()
                if name.startswith("conversational"):
                    assert [tokenizer.tokenizer.id_to_token(int(i)) for i in ours.ids[-2:]] == ["<|im_end|>", "Ċ"]
                    want[-1], separators = 0, separators + 1
                assert ours.mask.tolist() == want.tolist(), (name, pair.number, side)
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
    assert separators == 8  # the 4 conversational pairs, both sides


def test_masks_cover_the_completions_only(template, tokenizer):
    rows = [{"prompt": [USER], "chosen": answer("Blue."), "rejected": answer("Green, often.")}]
    (pair,), _ = dpo_data.pairs("explicit", rows, template, tokenizer, 256)
    # each answer's chat span, as SFT trains it: the text and its end-of-turn token, not the newline after it
    assert (scored(tokenizer, pair.chosen), scored(tokenizer, pair.rejected)) == ("Blue.<|im_end|>",
                                                                                 "Green, often.<|im_end|>")
    prompt = template.render([USER], add_generation_prompt=True)
    first = int(np.argmax(pair.chosen.mask))
    assert tokenizer.tokenizer.decode(pair.chosen.ids[:first].tolist(), skip_special_tokens=False) == prompt
    (trl,), _ = dpo_data.pairs("explicit", rows, template, tokenizer, 256, completion_mask="trl")
    assert scored(tokenizer, trl.chosen) == "Blue.<|im_end|>\n"  # TRL's: every token after the prompt's
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
    refused([good], "Unknown completion_mask 'all'; known: spans, trl", completion_mask="all")


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
    tokenizer = ChatTokenizer.from_folder(stock)
    (pair,), _ = dpo_data.pairs("explicit", [row], template, tokenizer, 4096)
    assert pair.chosen.ids.tolist() == case["input_ids"]
    end_of_turn = template.turn_ends(tokenizer.control_tokens)[0]
    assert scored(tokenizer, pair.chosen) == chosen["content"] + end_of_turn
    assert scored(tokenizer, pair.rejected) == "No idea." + end_of_turn


STOCK = FIXTURES / "chat" / "stock"


@pytest.mark.parametrize("name", sorted(p.stem for p in STOCK.glob("*.json") if p.name != "tokenizer.json"))
def test_conversational_masks_are_the_sft_spans(name):
    """Every stock template (tests/fixtures/chat/stock), every conversation that ends with an answer: the chosen
    side of a pair whose prompt is the turns before the answer has transformers' ids, and its mask is the SFT mask
    of the same conversation (`zoo.chat.encode_chat`) on that answer's turn, which is transformers' assistant mask
    of the turn: the text and end-of-turn token; not the header, nor the separator after the end-of-turn token
    (ChatML's and Gemma's "\n", Llama 3's and Qwen3's header "\n\n" where it tokenizes with the answer, Phi-3.5's
    "\n<|endoftext|>"), which TRL's rule scores; never what the prompt rendered alone already holds."""
    from zoo.chat import encode_chat, mask_from_offsets

    data = json.loads((STOCK / f"{name}.json").read_text(encoding="utf-8"))
    template = ChatTemplate((STOCK / data["template_file"]).read_text(encoding="utf-8"), data["special_tokens"])
    twin = ChatTemplate(data["template_with_generation"], data["special_tokens"])
    tokenizer = ChatTokenizer.from_folder(STOCK)
    compared, separated, clipped = 0, 0, []
    for case in data["cases"]:
        *prompt, last = case["messages"]
        if (case["add_generation_prompt"] or "assistant_masks" not in case or last["role"] != "assistant"
                or prompt[-1]["role"] == "assistant" or not last.get("content")):
            continue
        row = {"prompt": prompt, "chosen": [last], "rejected": answer("No idea."), "tools": case["tools"],
               "chat_template_kwargs": case["template_kwargs"]}
        (pair,), _ = dpo_data.pairs("explicit", [row], template, tokenizer, 4096)
        (trl,), _ = dpo_data.pairs("explicit", [row], template, tokenizer, 4096, completion_mask="trl")
        (tagged,), _ = dpo_data.pairs("explicit", [row], twin, tokenizer, 4096)  # {% generation %} spans
        sft = encode_chat(template, tokenizer, case["messages"], tools=case["tools"], **case["template_kwargs"])
        (start, end), before = sft.spans[-1], template.render(prompt, add_generation_prompt=True, tools=case["tools"],
                                                              **case["template_kwargs"])
        prompt_end = len(before) if sft.text.startswith(before) else 0  # DeepSeek-R1's prefills `<think>\n`
        if start < prompt_end:  # the prompt's own rendering writes the turn's first token: it is not the answer's
            clipped.append(case["name"])
        last_turn = mask_from_offsets(sft.offsets, [(max(start, prompt_end), end)], len(sft.ids))
        assert pair.chosen.ids.tolist() == sft.ids.tolist() == case["input_ids"], case["name"]
        assert sft.mask.tolist() == case["assistant_masks"], case["name"]  # transformers' (tests/zoo/test_chat_stock)
        assert pair.chosen.mask.tolist() == last_turn.tolist(), (case["name"], sft.show_mask(mask=pair.chosen.mask),
                                                                 sft.show_mask(mask=last_turn))
        (completion,), _ = sft_data.examples("prompt-completion", [{**row, "completion": [last]}], template,
                                             tokenizer, 4096)  # SFT's prompt/completion row: the same function
        assert completion.mask.tolist() == pair.chosen.mask.tolist() == tagged.chosen.mask.tolist(), case["name"]
        if not any(m["role"] == "assistant" for m in prompt):  # one answer: the whole conversation's SFT mask
            assert pair.chosen.mask.tolist() == sft.mask.tolist(), case["name"]
        compared += 1
        separated += int(trl.chosen.mask.sum() > pair.chosen.mask.sum())
    assert compared >= 13, compared
    # DeepSeek-R1 closes the tool outputs as it answers: transformers' mask of the answer takes the closing token,
    # which a prompt rendered alone (with its generation prompt) already ends with, so no answer is scored on it
    assert clipped == (["tool_call_empty_content"] if name.startswith("deepseek") else [])
    # TRL's rule scores more on 8 of the 11 templates, on every such conversation (the tokens named above)
    assert separated == (0 if name in ("deepseek-r1-distill-llama-8b", "mistral-7b-instruct-v0.3", "phi-4")
                         else compared)


def test_completion_mask_is_a_recipe_setting_and_older_runs_keep_trls_rule(tmp_path):
    """`--completion-mask trl` keeps TRL's rule; a preference run.json from before the setting existed scored by
    TRL's rule, so it resumes only with it (a changed mask would mix two objectives)."""
    from recipes import state

    assert (recipes.get("dpo").completion_mask, recipes.get("simpo").replace(completion_mask="trl").completion_mask) \
        == ("spans", "trl")
    with pytest.raises(ValueError, match="Unknown completion_mask 'all'; known: spans, trl"):
        recipes.get("dpo").replace(completion_mask="all")
    for recipe, want in (({"preference": "dpo"}, "trl"), ({"supervised": True}, "spans")):
        (tmp_path / state.RUN_FILE).write_text(json.dumps({"task": "causal_lm", "recipe": recipe}))
        assert state.read_run(str(tmp_path))["recipe"]["completion_mask"] == want
