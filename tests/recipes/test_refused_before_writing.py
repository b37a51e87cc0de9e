"""Chat data that makes no batch is refused before anything is written into out_dir, in one line with exit code 2 (a
batch size above the rows or pairs an epoch once surfaced as a TensorFlow traceback from inside the data pipeline,
after run.json was written, which then refused the corrected command); rows with nothing to train on say what is
missing, not "raise --sequence-length" (issue 48, classes 2 and 6)."""

import json
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


def test_rows_with_no_answer_ask_for_one(checkpoint, tmp_path, capsys):
    code, out = train(checkpoint, tmp_path, "sft", [{"messages": [question(i)]} for i in range(4)])
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
