"""The 3B-8B shapes of issues 36 and 44 (gemma3-4b): registered with transformers' parameter counts, and read back
from the config.json zoo writes for them as the same registered name."""

import pytest

import zoo
from zoo import hub

# tools/hf_param_counts.py (transformers 5.24, meta device) on each checkpoint's config.json values.
TRANSFORMERS_COUNTS = {
    "llama3.2-3b": 3_212_749_824, "llama3.1-8b": 8_030_261_248, "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512, "qwen3-4b": 4_022_468_096, "qwen3-8b": 8_190_735_360, "gemma3-4b": 3_880_263_168,
}


def test_counts_are_transformers():
    assert {name: zoo.spec(name).num_params() for name in TRANSFORMERS_COUNTS} == TRANSFORMERS_COUNTS


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_COUNTS))
def test_config_round_trip_names_the_shape(name):
    spec = zoo.spec(name)
    read, task, _ = hub.spec_from_config(hub.config_from_spec(spec, "causal_lm"))
    assert task == "causal_lm" and hub.match_registered(read) == name
