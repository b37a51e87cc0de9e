"""Generation options no draw could use are refused with what is allowed, by `generate()` and by `zoo generate` before
it loads the model (issue 48: a temperature of -1 and a top_p of 1.5 generated text, a temperature of 0 ended in a
TensorFlow traceback), and so are the settings a sampler would ignore."""

import pytest

import zoo.cli
from zoo.generation import make_sampler

BAD = [({"sampler": "temperature", "temperature": 0.0}, "temperature must be a number above 0, got 0.0"),
       ({"sampler": "temperature", "temperature": -1.0}, "temperature must be a number above 0, got -1.0"),
       ({"sampler": "top_k", "temperature": float("nan")}, "temperature must be a number above 0, got nan"),
       ({"sampler": "top_p", "top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
       ({"sampler": "top_p", "top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
       ({"sampler": "top_k", "top_k": 0}, "top_k must be a whole number of tokens, at least 1, got 0"),
       ({"sampler": "beam"}, "Unknown sampler 'beam'; known: greedy, top_k, top_p, temperature"),
       # a setting the sampler would ignore names the samplers it belongs to
       ({"sampler": "greedy", "temperature": 0.7}, "temperature does not apply to sampler greedy, which would ignore "
                                                  "it: it is a setting of top_k and top_p and temperature"),
       ({"sampler": "top_k", "top_p": 0.5}, "top_p does not apply to sampler top_k, which would ignore it: it is a "
                                            "setting of top_p. Choose one of those samplers, or drop top_p")]


@pytest.mark.parametrize("options, message", BAD)
def test_the_api_refuses_settings_no_draw_can_use(options, message):
    with pytest.raises(ValueError, match=message):
        make_sampler(**options)


@pytest.mark.parametrize("options, message", BAD)
def test_the_cli_refuses_them_before_loading_the_model(options, message, tmp_path, capsys):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    missing = str(tmp_path / "no-such-model")  # loading it would fail with another message: the check comes first
    assert zoo.cli.main(["generate", missing, "hello", *flags]) == 2
    assert message.replace("\\", "") in capsys.readouterr().err


def test_settings_in_range_make_keras_hubs_samplers():
    assert type(make_sampler("top-p", top_p=1.0, temperature=0.5)).__name__ == "TopPSampler"
    assert type(make_sampler("top_k", top_k=1)).__name__ == "TopKSampler"


def test_a_prompt_that_fills_the_model_asks_for_a_shorter_prompt():
    import zoo
    from tests.common import TINY_DEC
    from zoo.generation import generate

    model = zoo.get("dec-base", **dict(TINY_DEC, max_sequence_length=8))
    with pytest.raises(ValueError, match="The prompt is 8 tokens, and the model has 8 positions: no room for a new "
                                         "token. Shorten the prompt to at most 7 tokens"):
        generate(model, [[1] * 8], 4)
    with pytest.raises(ValueError, match=r"\(6 tokens\) plus max_new_tokens \(4\) .* ask for at most 2 new tokens"):
        generate(model, [[1] * 6], 4)
