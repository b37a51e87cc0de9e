"""Fixtures the tests/zoo files share."""

import pytest

from tests.common import REPO

HF_FIXTURES = REPO / "tests" / "fixtures" / "hf"


@pytest.fixture(scope="module")
def loaded():
    """`loaded(name)` -> the model zoo.hub.load reads from tests/fixtures/hf/NAME (transformers' folders), once for
    the module; tests only read it."""
    from zoo import hub

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = hub.load(HF_FIXTURES / name)
        return cache[name]

    return get
