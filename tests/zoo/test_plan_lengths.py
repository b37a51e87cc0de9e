"""`zoo plan` and `zoo.memory.estimate` refuse the sequence lengths `zoo train` refuses for the same model, with the
same message (issue 48: they planned them)."""

import pytest

import recipes
import zoo
import zoo.cli
from recipes import runner


def test_plan_and_train_refuse_the_same_length(capsys):
    limit = zoo.spec("enc-base").max_sequence_length
    assert zoo.cli.main(["plan", "enc-base", "--sequence-length", str(limit + 1)]) == 2
    planned = capsys.readouterr().err.strip().removeprefix("zoo plan: error: ")
    try:
        runner.check_lengths(recipes.get("enc-base").replace(sequence_length=limit + 1))
    except ValueError as error:
        trained = str(error)
    with pytest.raises(ValueError) as estimated:
        zoo.memory.estimate("enc-base", 1, limit + 1)
    assert planned == trained == str(estimated.value) == (
        f"sequence_length={limit + 1} is above the {limit} positions of 'enc-base'; lower --sequence-length to at "
        f"most {limit}.")
    assert zoo.cli.main(["plan", "enc-base", "--sequence-length", str(limit)]) == 0
