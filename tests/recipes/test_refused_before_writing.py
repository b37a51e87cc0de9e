"""Chat data that makes no batch is refused before anything is written into out_dir, in one line with exit code 2 (a
batch size above the rows or pairs an epoch once surfaced as a TensorFlow traceback from inside the data pipeline,
after run.json was written, which then refused the corrected command); rows with nothing to train on say what is
missing, not "raise --sequence-length" (issue 48, classes 2 and 6)."""

import json
import re
import shutil
from pathlib import Path

import pytest

import zoo
import zoo.cli
from tests.common import TINY_DEC
from zoo.chat import ChatTemplate

FIXTURES = Path(__file__).parent.parent / "fixtures" / "chat"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama's config.json with the chat fixtures' tokenizer and Qwen2.5-style template (as
    tests/recipes/test_sft.py); no weights: every refusal here comes before they are read."""
    folder = tmp_path_factory.mktemp("chat-ckpt")
    config = zoo.hub.config_from_spec(zoo.spec("dec-base").replace(**{**TINY_DEC, "vocab_size": 1000}), "causal_lm")
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(FIXTURES / "tokenizer.json", folder)
    data = json.loads((FIXTURES / "qwen2.5.json").read_text(encoding="utf-8"))
    ChatTemplate(data["template"], data["special_tokens"]).save(folder)
    return folder


def train(checkpoint, tmp_path, recipe, rows, *flags):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    code = zoo.cli.main(["train", "--recipe", recipe, "--weights", str(checkpoint), "--data", str(data),
                         "--out-dir", str(out), "--steps", "1", "--sequence-length", "64", *flags])
    return code, out


def question(i):
    return {"role": "user", "content": f"What is {i} plus {i}?"}


@pytest.mark.parametrize("recipe, rows, message", [
    ("sft", [{"messages": [question(i), {"role": "assistant", "content": f"{2 * i}."}]} for i in range(8)],
     "8 row(s) an epoch make no batch of 16; lower --batch-size or give more rows."),
    ("dpo", [{"prompt": [question(i)], "chosen": [{"role": "assistant", "content": f"{2 * i}."}],
              "rejected": [{"role": "assistant", "content": f"{2 * i + 1}."}]} for i in range(8)],
     "8 pair(s) make no batch of 16; lower --batch-size or give more pairs."),
])
def test_no_batch_is_refused_before_out_dir_is_written(checkpoint, tmp_path, capsys, recipe, rows, message):
    code, out = train(checkpoint, tmp_path, recipe, rows, "--batch-size", "16")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"zoo train: error: {message}", err
    assert not out.exists()  # so the corrected command starts fresh


@pytest.mark.parametrize("length", ["64", "16"])  # at 16 the prompts are also too long: still not the advice
def test_rows_with_no_answer_ask_for_one(checkpoint, tmp_path, capsys, length):
    code, out = train(checkpoint, tmp_path, "sft", [{"messages": [question(i)]} for i in range(4)],
                      "--sequence-length", length)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "give rows an assistant message with an answer" in err and "--sequence-length" not in err, err
    assert not out.exists()


def test_identical_answers_are_refused_in_explicit_pairs_too(checkpoint):
    """docs/dpo.md promised it for every format; only implicit pairs (whole conversations) were refused."""
    from recipes import dpo_data
    from zoo.chat import ChatTokenizer

    tokenizer, template = ChatTokenizer.from_folder(checkpoint), ChatTemplate.of(checkpoint)
    same = [{"role": "assistant", "content": "2."}]
    for row in ({"prompt": "1 plus 1 is", "chosen": " 2.", "rejected": " 2."},
                {"prompt": [question(1)], "chosen": same, "rejected": list(same)}):
        with pytest.raises(ValueError, match=r"^Row 1: chosen and rejected are the same: there is no preference to "
                                             r"learn\.$"):
            dpo_data.pairs("explicit", [row], template, tokenizer, 64)


def pretrain(tmp_path, name, content, *flags):
    """`zoo train dec-base` on a data file written as `content` (bytes), into a fresh out_dir."""
    data = tmp_path / name
    data.write_bytes(content)
    out = tmp_path / "run"
    code = zoo.cli.main(["train", "dec-base", "--data", str(data), "--out-dir", str(out), "--steps", "1", *flags])
    return code, data, out


CONVERSATION = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
GOOD = json.dumps({"text": "A line of text."}) + "\n"


@pytest.mark.parametrize("name, content, flags, message", [
    # class 5: a column of message lists is not text (it was read as its Python repr)
    ("chat.jsonl", (GOOD + json.dumps({"text": CONVERSATION}) + "\n").encode(), (),
     r"chat.jsonl, row 2: field 'text' holds a conversation \(2 messages\), not text; pre-training reads one text "
     r"per row. Train chat rows with --recipe sft"),
    ("mixed.jsonl", (GOOD * 3 + json.dumps({"body": "no text field"}) + "\n").encode(), (),
     r"Text field \(row 4\) 'text' is not in '.*mixed.jsonl'; its columns are: body"),
    # class 3: a damaged line names the file and the line, before any model is built
    ("cut.jsonl", (GOOD * 3 + '{"text": "cut sh').encode(), (),
     r"cut.jsonl, line 4: not JSON \(Unterminated string starting at: column 10\). Fix that line, or download"),
    ("latin1.csv", "text\nA line.\nCaf\u00e9 au lait.\n".encode("latin-1"), (),
     r"latin1.csv, after line \d: not UTF-8 text \(invalid continuation byte\); save the file as UTF-8"),
])
def test_data_that_is_not_text_is_refused_by_row_before_out_dir(tmp_path, capsys, name, content, flags, message):
    code, data, out = pretrain(tmp_path, name, content, *flags)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("zoo train: error: ") and "Traceback" not in err, err
    assert re.search(message, err), err
    assert not out.exists() and data.read_bytes() == content


def test_chat_rows_that_are_not_json_name_the_line(checkpoint, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"messages": [question(1)]}) + "\n{oops\n", encoding="utf-8")
    code = zoo.cli.main(["train", "--recipe", "sft", "--weights", str(checkpoint), "--data", str(data),
                         "--out-dir", str(tmp_path / "run"), "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"{data}, line 2: not JSON (Expecting property name enclosed in double quotes" in err, err
    assert not (tmp_path / "run").exists()


def test_a_flag_of_another_recipe_is_refused_by_name(checkpoint, tmp_path, capsys):
    """The issue's example: DPO's --beta and --loss-type on an SFT run trained SFT and recorded them in run.json."""
    rows = [{"messages": [question(i), {"role": "assistant", "content": f"{2 * i}."}]} for i in range(8)]
    code, out = train(checkpoint, tmp_path, "sft", rows, "--beta", "0.5", "--loss-type", "ipo")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("zoo train: error: --beta belongs to the dpo / simpo / grpo recipes") and \
        "--recipe dpo" in err, err
    assert not out.exists()
    import recipes  # the Python API refuses what differs from the default (it cannot tell a default given by hand)

    with pytest.raises(ValueError, match="--loss-type belongs to the dpo recipe, and this run's recipe is of kind "
                                         "'documents'"):
        recipes.get("dec-base", loss_type="ipo")


def test_a_run_the_memory_cannot_hold_is_refused_before_out_dir_is_written(checkpoint, tmp_path, capsys):
    """Its process's planned peak RSS (zoo.memory.step_resident) against --memory-budget (default: the memory
    available now, on a CPU): refused in one line naming both figures and the settings that would fit, before
    out_dir or the weights are touched (issue 44: not killed by the kernel halfway through)."""
    rows = [{"messages": [question(i), {"role": "assistant", "content": f"{2 * i}."}]} for i in range(8)]
    code, out = train(checkpoint, tmp_path, "sft", rows, "--batch-size", "4", "--memory-budget", "150MiB")
    err = capsys.readouterr().err.strip()
    needed = re.search(r"needs a process of about (\d+\.\d+) GiB", err)
    assert code == 2 and err.startswith(f"zoo train: error: Training '{checkpoint}' at batch 4 x sequence 64 (none) ")
    assert needed and float(needed.group(1)) > 150 / 1024 and "0.15 GiB is available now" in err, err
    # two traced blocks of 0.10 GiB each are most of the tiny model's process: nothing fits 0.15 GiB
    assert err.endswith("Nothing fits down to 128 positions with full checkpointing, int4 and batch 1; free memory, "
                        "or use a machine with more."), err
    assert not out.exists()
    # planned 212 MiB at batch 4 (2026-12-07), 208 at batch 1: the fix named is the batch
    code, out = train(checkpoint, tmp_path, "sft", rows, "--batch-size", "4", "--memory-budget", "209MiB")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Settings that fit: batch size 1: 0.20 GiB" in err, err
    assert not out.exists()
    code, out = train(checkpoint, tmp_path, "sft", rows, "--batch-size", "1", "--memory-budget", "209MiB")
    err = capsys.readouterr().err.strip()  # it fits, and goes on to what is missing: the weights
    assert code == 2 and err.endswith("has no model.safetensors or model.safetensors.index.json."), err
