"""One way to name a model on the command line: a registered name, a `.keras` file,
a training run's folder, or a Hugging Face folder / Hub repo id."""

from pathlib import Path

import keras

from zoo import hub, registry
from zoo.models import build

MODEL_FILE = "model.keras"  # what a training run (recipes) writes at the end
TOKENIZER_DIR = "tokenizer"


def load(source, task=None):
    """The model `source` names, with its tokenizer attached as `model.tokenizer` when it has one.

    Args:
        source: a registered model name (random weights, for trying things), a `.keras`
            file, a training run's folder (`model.keras` and `tokenizer/`), or a Hugging
            Face folder or Hub repo id (`config.json` and safetensors).
        task: for a registered name or a Hugging Face folder, the task head to build.

    Returns:
        A built zoo model.

    Example:
    >>> model = load("runs/news")          # model.keras + tokenizer/ of `zoo train`
    >>> model = load("path/to/SmolLM2")    # a Hugging Face folder
    """
    source = str(source)
    path = Path(source)
    if source.endswith(".keras"):
        if not path.is_file():
            raise FileNotFoundError(f"No model file at {source}.")
        return keras.models.load_model(source)
    if path.is_dir() and (path / MODEL_FILE).is_file():
        model = keras.models.load_model(path / MODEL_FILE)
        if (path / TOKENIZER_DIR).is_dir():
            model.__dict__["tokenizer"] = hub.load_tokenizer(path / TOKENIZER_DIR)  # plain attribute
        return model
    if path.is_dir() and (path / "config.json").is_file():
        return hub.load(source, task=task)
    if source in registry.names():
        return build(registry.spec(source), task=task)
    if path.exists():
        raise FileNotFoundError(f"{source} holds neither {MODEL_FILE} (a training run) nor config.json "
                                "(a Hugging Face folder).")
    if "/" in source:  # a Hub repo id, resolved by huggingface_hub (its cache and HF_HUB_OFFLINE apply)
        return hub.load(source, task=task)
    raise ValueError(f"{source!r} is neither a registered model ({', '.join(registry.names())}), a .keras file, "
                     "a training run's folder nor a Hugging Face folder.")
