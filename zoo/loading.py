"""One way to name a model on the command line: a registered name, a `.keras` file,
a training run's folder, or a Hugging Face folder / Hub repo id."""

from pathlib import Path

import keras

from zoo import hub, lora, registry
from zoo.chat import Chat
from zoo.models import build
from zoo.reading import read_json

MODEL_FILE = "model.keras"  # what a training run (recipes) writes at the end
TOKENIZER_DIR = "tokenizer"
# A LoRA run writes its adapters (a PEFT folder) in place of model.keras, and what they go on.
ADAPTER_DIR = "adapter"
BASE_FILE = "base.json"


def base_record(weights, task, quantize=None, num_classes=None) -> dict:
    """What a LoRA run's adapters go on: the base's folder and fingerprint, its task (and classes),
    and the quantization it trained on. Written as BASE_FILE and into every checkpoint."""
    folder = hub.local_folder(weights)
    return {"weights": str(Path(folder).resolve()), "sha256": hub.weights.fingerprint(folder), "task": task,
            "num_classes": num_classes, "quantize": quantize}


def check_base(record, found=None) -> dict:
    """Refuse adapters whose base changed since they were trained (`found`: the base's record now)."""
    found = found or base_record(record["weights"], record["task"], record["quantize"], record["num_classes"])
    if found["sha256"] != record["sha256"]:
        raise ValueError(f"The base weights at {record['weights']} changed since the LoRA adapters were trained on "
                         f"them (sha256 {record['sha256'][:12]}..., now {found['sha256'][:12]}...): adapters only fit "
                         "the weights they were trained on. Put those weights back, or train again on the new ones.")
    return record


def load_lora_run(folder, merge=False):
    """A LoRA run's base with its adapters: quantized as it trained, or with the adapters merged
    into the float base (`merge`: what export and Hugging Face weights need)."""
    folder = Path(folder)
    base = check_base(read_json(folder / BASE_FILE))
    classes = {"num_classes": base["num_classes"]} if base["task"] == "classifier" else {}
    quantize = None if merge else base["quantize"]  # quantized as each tensor is read (zoo.hub.load)
    model = hub.load(base["weights"], task=base["task"], tokenizer=False, quantize=quantize, **classes)
    hub.load_adapter(model, folder / ADAPTER_DIR)
    if merge:
        lora.merge_lora(model)
    return model


def _attach_chat(model, folder):
    """A decoder's chat template and tokenizer.json as `model.chat` (zoo.chat.Chat), when the folder has
    them: what generate(messages=...) and a SavedModel export read."""
    if getattr(model, "task", None) == "causal_lm":
        model.__dict__["chat"] = Chat.of(folder)  # plain attribute: not tracked by Keras
    return model


def load(source, task=None, merge=False):
    """The model `source` names, with its tokenizer attached as `model.tokenizer` when it has one
    (and a chat checkpoint's template as `model.chat`).

    Args:
        source: a registered model name (random weights, for trying things), a `.keras`
            file, a training run's folder (`model.keras` and `tokenizer/`; a LoRA run:
            `adapter/` and `base.json`), or a Hugging Face folder or Hub repo id
            (`config.json` and safetensors).
        task: for a registered name or a Hugging Face folder, the task head to build.
        merge: a LoRA run's adapters merged into its float base (`load_lora_run`).

    Returns:
        A built zoo model.

    Example:
    >>> model = load("runs/news")          # model.keras + tokenizer/ of `zoo train`
    >>> model = load("path/to/SmolLM2")    # a Hugging Face folder
    """
    source = str(source)
    path = Path(source)
    if source.endswith(".gguf"):
        raise ValueError(hub.gguf_needs_converting(source))
    if source.endswith(".keras"):
        if not path.is_file():
            raise FileNotFoundError(f"No model file at {source}.")
        return keras.models.load_model(source)
    if path.is_dir() and ((path / MODEL_FILE).is_file() or (path / BASE_FILE).is_file()):
        lora_run = (path / BASE_FILE).is_file()
        model = load_lora_run(path, merge) if lora_run else keras.models.load_model(path / MODEL_FILE)
        if (path / TOKENIZER_DIR).is_dir():
            model.__dict__["tokenizer"] = hub.load_tokenizer(path / TOKENIZER_DIR)  # plain attribute
            _attach_chat(model, path / TOKENIZER_DIR)
        return model
    if path.is_dir() and (path / "config.json").is_file():
        return _attach_chat(hub.load(source, task=task), path)
    if source in registry.names():
        return build(registry.spec(source), task=task)
    if path.exists():
        raise FileNotFoundError(f"{source} holds neither {MODEL_FILE} (a training run) nor config.json "
                                "(a Hugging Face folder).")
    if "/" in source:  # a Hub repo id, resolved by huggingface_hub (its cache and HF_HUB_OFFLINE apply)
        return hub.load(source, task=task)
    raise ValueError(f"{source!r} is neither a registered model ({', '.join(registry.names())}), a .keras file, "
                     "a training run's folder nor a Hugging Face folder.")
