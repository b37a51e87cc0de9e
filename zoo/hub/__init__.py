"""Hugging Face format in and out: `config.json` <-> `ModelSpec`, safetensors <->
zoo variables, tokenizer files <-> keras-hub tokenizers.

    model = zoo.hub.load("sentence-transformers/all-MiniLM-L6-v2")  # or a local folder
    zoo.hub.save(model, "out/")   # what transformers' from_pretrained reads
    zoo.hub.push(model, "me/my-model")

One module per concern: `bert.py`, `llama.py`, `qwen.py` (Qwen2 and Qwen3), `gemma3.py`
and `modernbert.py` (one per family), `config.py` (config keys several families share),
`weights.py` (safetensors, streaming and shards), `tokenizers.py`, `gguf.py` (llama.cpp files in),
`gguf_writer.py` (out), `peft.py` (PEFT LoRA adapter folders).

A family module exposes:
    FAMILY, MODEL_TYPE        the zoo family and Hugging Face `model_type`
    ARCHITECTURES             Hugging Face architecture -> zoo task
    DEFAULT_ARCHITECTURE      for a config.json with a model_type and no architectures
    BASE_PREFIX               the backbone's prefix inside a task model ("bert.", "model.")
    DERIVED, KNOWN_HEADS      tensors skipped on load; heads dropped when the task lacks them
    LEGACY_NAMES              old tensor-name fragments -> current ones
    spec_from_config(config) -> ModelSpec
    config_from_spec(spec, task, num_classes=None) -> dict
    weight_map(model) -> list[weights.Entry]
and is registered in `FAMILIES` (`families.py`); nothing else in the package names a family.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from zoo import memory, quantization, registry
from zoo.files import atomic_path
from zoo.hub import weights
from zoo.hub.families import FAMILIES
from zoo.hub.families import family_of as _family_of
from zoo.hub.gguf import convert_gguf
from zoo.hub.gguf_writer import write_gguf
from zoo.hub.peft import check_plain, load_adapter, read_config, save_adapter
from zoo.hub.tokenizers import load_tokenizer, read_json, save_tokenizer
from zoo.hub.weights import INDEX, WEIGHTS, Entry
from zoo.models import build
from zoo.registry import ModelSpec

# Hugging Face architecture -> (zoo family, zoo task).
ARCHITECTURES = {arch: (name, task) for name, module in FAMILIES.items() for arch, task in module.ARCHITECTURES.items()}
_ARCH_OF = {value: arch for arch, value in ARCHITECTURES.items()}


# --- config.json <-> ModelSpec ---------------------------------------------------------
def spec_from_config(config: dict):
    """Read a Hugging Face `config.json` as the zoo spec and task it describes, so that
    a checkpoint builds the model its weights fit.

    Args:
        config: a parsed `config.json`.

    Returns:
        `(spec, task, task_args)`: a `ModelSpec`, the zoo task of the checkpoint's
        architecture ("backbone" for `BertModel`) and the task's arguments
        (`num_classes` of a classifier).

    Raises:
        ValueError: an unsupported architecture (the message lists the supported
            ones) or a setting zoo does not compute.

    Example:
    >>> spec, task, _ = spec_from_config(json.load(open("all-MiniLM-L6-v2/config.json")))
    >>> task, spec.hidden_dim
    ('backbone', 384)
    """
    archs = config.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        defaults = {module.MODEL_TYPE: module.DEFAULT_ARCHITECTURE for module in FAMILIES.values()}
        model_type = config.get("model_type")
        if archs or model_type not in defaults:
            raise ValueError(
                f"Unsupported architecture {archs or model_type!r}; supported: {', '.join(ARCHITECTURES)}."
            )
        arch = defaults[model_type]
    family, task = ARCHITECTURES[arch]
    spec = FAMILIES[family].spec_from_config(config)
    task_args = {"num_classes": len(config["id2label"])} if task == "classifier" and "id2label" in config else {}
    return spec, task, task_args


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None, dtype: str = "float32",
                     labels=None) -> dict:
    """The `config.json` transformers builds the same model from, so that a saved
    folder loads with `from_pretrained` (transformers 5 with no warning).

    Args:
        spec: a `ModelSpec`.
        task: the zoo task, which picks the architecture ("masked_lm" -> `BertForMaskedLM`).
        num_classes: a classifier's number of labels.
        dtype: the dtype of the saved tensors ("float32", "bfloat16", "float16").
        labels: a classifier's class names, in class order (`id2label`); None writes
            LABEL_0, LABEL_1, ...

    Returns:
        A dict with `architectures` first.

    Example:
    >>> config_from_spec(zoo.spec("dec-base"), "causal_lm")["architectures"]
    ['LlamaForCausalLM']
    """
    arch = _ARCH_OF[(spec.family, task)]
    config = FAMILIES[spec.family].config_from_spec(spec, task, num_classes)
    if labels is not None:
        labels = [str(label) for label in labels]
        if task != "classifier" or len(labels) != num_classes:
            raise ValueError(f"labels has {len(labels)} names; it needs one per class of a classifier "
                             f"(task {task!r}, num_classes {num_classes}).")
        config["id2label"] = {str(i): label for i, label in enumerate(labels)}
        config["label2id"] = {label: i for i, label in enumerate(labels)}
    return {"architectures": [arch], **config, "dtype": dtype}


def match_registered(spec: ModelSpec):
    """The registered name with exactly this shape (description and dropout aside), so
    that a checkpoint of a ladder shape says which one it is.

    Args:
        spec: a `ModelSpec`.

    Returns:
        A registered name ("dec-base") or None.

    Example:
    >>> match_registered(zoo.spec("dec-base").replace(dropout=0.1))
    'dec-base'
    """
    for name in registry.names():
        candidate = registry.spec(name)
        if candidate.replace(description="", dropout=spec.dropout) == spec.replace(description=""):
            return name
    return None


def weight_map(model) -> list[Entry]:
    """Every variable of a zoo backbone or task model with its Hugging Face tensor name,
    from the model's family module (the table load and save share).

    Args:
        model: a zoo model.

    Returns:
        A list of `weights.Entry` (names without the base-model prefix).

    Example:
    >>> weight_map(zoo.get("dec-base"))[0].key
    'embed_tokens.weight'
    """
    return _family_of(model).weight_map(model)


# --- reading ---------------------------------------------------------------------------
def gguf_needs_converting(path) -> str:
    """What to do with a llama.cpp file where a Hugging Face folder is read."""
    return (f"{path} is a GGUF file (llama.cpp); zoo reads Hugging Face folders. Convert it once: "
            f"python -c 'import zoo.hub; zoo.hub.convert_gguf(\"{path}\", \"{Path(path).with_suffix('')}-hf\")', "
            "then pass the folder it writes.")


def gguf_hint(folder) -> str:
    """What to do, after a space, for a folder that holds a GGUF file where config.json was looked for; else ""."""
    found = sorted(Path(folder).glob("*.gguf"))
    return f" {gguf_needs_converting(found[0])}" if found else ""


def local_folder(repo_id_or_path) -> Path:
    """A local folder as is, or a Hub repo id downloaded through `huggingface_hub` (its
    cache, `HF_HUB_OFFLINE`, `HF_TOKEN`), fetching only config, safetensors and
    tokenizer files, never pickles.

    Args:
        repo_id_or_path: a folder, or a repo id ("sentence-transformers/all-MiniLM-L6-v2").

    Returns:
        The local folder.

    Raises:
        FileNotFoundError: a path that is not a folder.
        OSError: a repo id that is neither reachable nor cached.

    Example:
    >>> local_folder("sentence-transformers/all-MiniLM-L6-v2").name  # a snapshot in the Hub cache
    """
    path = Path(os.path.expanduser(str(repo_id_or_path)))
    if path.is_dir():
        return path
    text = str(repo_id_or_path)
    if path.suffix == ".gguf":
        raise ValueError(gguf_needs_converting(path))
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise FileNotFoundError(f"{text!r} is not a folder; pass a Hugging Face model folder or a Hub repo id.")
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["config.json", "*.safetensors", INDEX, "vocab.txt", "vocab.json", "merges.txt",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    try:
        return Path(huggingface_hub.snapshot_download(text, allow_patterns=patterns))
    except LocalEntryNotFoundError as error:
        raise OSError(
            f"Cannot get {text!r}: the Hugging Face Hub is unreachable (or HF_HUB_OFFLINE is set) and the "
            f"repo is not in the local cache ({huggingface_hub.constants.HF_HUB_CACHE}). Download it on a "
            f"machine with network (`hf download {text}`) into that cache, or pass a local folder."
        ) from error


def load_weights(model, folder, strict=True) -> list[str]:
    """Stream a Hugging Face folder's safetensors into a built zoo model, one tensor at
    a time, so that loading needs about one tensor of memory beyond the model.

    Args:
        model: a zoo backbone or task model.
        folder: a Hugging Face model folder.
        strict: raise on a tensor the model has no place for (else log a warning).

    Returns:
        The head tensors the checkpoint lacks (freshly initialised, and logged).

    Raises:
        ValueError: a missing backbone tensor, an unexpected tensor or a shape
            mismatch, each named with both shapes.

    Example:
    >>> load_weights(zoo.get("enc-mini", task="classifier"), "all-MiniLM-L6-v2")
    ['classifier.weight', 'classifier.bias']
    """
    check_plain(model, "load Hugging Face weights into")
    return weights.load_into(model, folder, _family_of(model), strict)


def load(repo_id_or_path, task=None, checkpointing=None, dtype=None, name=None, tokenizer=True, adapter=None,
         quantize=None, check_memory=True, **overrides):
    """Build the zoo model a Hugging Face folder (or Hub repo id) describes and load its
    weights and tokenizer, so that published checkpoints train and serve in zoo.

    Args:
        repo_id_or_path: a local folder or a Hub repo id.
        task: None for the checkpoint's own (`BertModel` -> "backbone",
            `LlamaForCausalLM` -> "causal_lm"); another task of the family reuses the
            backbone and initialises the new head.
        checkpointing: activation recomputation, "none" | "full" | "selective".
        dtype: a Keras dtype policy name (`zoo.PRECISIONS`).
        name: a registered name the checkpoint must match in shape ("enc-mini").
        tokenizer: attach the folder's tokenizer (if any) as `model.tokenizer`.
        adapter: a PEFT LoRA adapter folder to load on top (`zoo.hub.peft.load_adapter`).
        quantize: "int8" | "int4": a frozen base stored as Keras stores a quantized one
            (`zoo.quantization.quantize_base`, bitwise the same). A decoder is built quantized and each
            kernel quantized as its tensor arrives (`zoo.quantization.quantize_into`): no float copy of the
            model at any moment. An encoder loads in float first, then quantizes.
        check_memory: refuse (`zoo.memory.DoesNotFit`), before anything is read, a load whose plan
            (`zoo.memory.loading_plan`) needs more memory than is available now, naming the settings that fit.
        **overrides: spec fields that do not change weight shapes (`dropout=0.0`),
            or `num_classes` for a classifier.

    Returns:
        A built zoo model with the checkpoint's weights.

    Example:
    >>> model = load("path/to/all-MiniLM-L6-v2", task="classifier", num_classes=8)
    >>> model.tokenizer("A man is playing a guitar.")
    """
    folder = local_folder(repo_id_or_path)
    config = read_json(folder / "config.json")
    if not config:
        raise FileNotFoundError(f"{folder} has no config.json; it is not a Hugging Face model folder."
                                + gguf_hint(folder))
    if adapter is not None:
        read_config(adapter)  # refuse an unreadable adapter before building the model
    spec, own_task, task_args = spec_from_config(config)
    if name is not None and not isinstance(name, ModelSpec):
        expected = registry.spec(name)
        diff = [f"{f}: checkpoint {ours!r}, {name} {theirs!r}" for f, ours, theirs in spec.shape_differences(expected)]
        if diff:
            raise ValueError(f"{folder} is not a {name!r} checkpoint ({'; '.join(diff)}); "
                             "call zoo.hub.load(folder) to build the shape it describes.")
        spec = spec.replace(description=expected.description)
    else:
        known = match_registered(spec)
        spec = spec.replace(description=f"{known} shape, from {folder.name}" if known else f"from {folder.name}")
    task = task or own_task
    if task == "classifier":
        task_args["num_classes"] = overrides.pop("num_classes", task_args.get("num_classes", 2))
    elif task_args and task != own_task:
        task_args = {}
    spec = spec.replace(**overrides) if overrides else spec
    streamed = quantize is not None and spec.is_decoder  # its weight map names each quantized layer's tensors
    weights.weight_files(folder)  # weights missing, pickled or cut short: refused before the model is built
    if check_memory:
        import keras

        memory.check_loading_fits(spec, task, quantize, dtype or keras.config.dtype_policy().name,
                                  label=f"{folder.name} ({spec.description})")
    model = build(spec, task=task, checkpointing=checkpointing, dtype=dtype,
                  quantize=quantize if streamed else None, **task_args)
    if streamed:
        with quantization.collect_once():  # each twin's quantize deletes its float kernel (Layer.__delattr__ collects)
            weights.load_into(model, folder, _family_of(model))
    else:
        load_weights(model, folder)
        if quantize is not None:
            quantization.quantize_base(model, quantize)
    if adapter is not None:
        load_adapter(model, adapter)
    if tokenizer:
        model.__dict__["tokenizer"] = load_tokenizer(folder)  # plain attribute: not a tracked sublayer
    return model


# --- writing ---------------------------------------------------------------------------
def save(model, folder, tokenizer=None, overwrite=False, max_shard_size=None, labels=None) -> Path:
    """Write a zoo model as a Hugging Face folder that transformers' `from_pretrained`
    reads: `config.json`, `model.safetensors` (or shards + index) and the tokenizer files.

    The folder is written atomically (a temporary sibling renamed into place): a
    failure part-way leaves an earlier folder as it was and nothing else behind.

    Args:
        model: a zoo backbone or task model.
        folder: the folder to write.
        tokenizer: a keras-hub tokenizer; None saves `model.tokenizer` if it has one.
        overwrite: replace an existing `folder` (else FileExistsError).
        max_shard_size: bytes per safetensors shard; None writes one file.
        labels: a classifier's class names in class order, written as `id2label`.

    Returns:
        `folder` as a `Path`.

    Example:
    >>> save(zoo.get("dec-base"), "out/", max_shard_size=2**30)
    PosixPath('out')
    """
    check_plain(model, "save Hugging Face weights of")
    folder = Path(folder)
    with atomic_path(folder, overwrite) as tmp:
        tmp.mkdir()
        _write(model, tmp, tokenizer if tokenizer is not None else getattr(model, "tokenizer", None),
               max_shard_size, labels)
    return folder


def _write(model, folder: Path, tokenizer, max_shard_size, labels=None):
    family = _family_of(model)
    spec = getattr(model, "backbone", model).spec
    num_classes = model.classifier.units if model.task == "classifier" else None
    config = config_from_spec(spec, model.task, num_classes, dtype=str(model.weights[0].dtype), labels=labels)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights.save_from(model, folder, family, max_shard_size)
    if tokenizer is not None:
        save_tokenizer(tokenizer, folder)


def push(model, repo_id, tokenizer=None, private=None, token=None, commit_message="Upload keras-zoo model"):
    """Save a zoo model in Hugging Face format to a temporary folder and upload it with
    `huggingface_hub`, so that sharing a model is one call.

    Args:
        model: a zoo backbone or task model.
        repo_id: the Hub repo ("me/my-model"), created if missing.
        tokenizer: as for `save`.
        private: create the repo private.
        token: a Hub token (default: `huggingface_hub`'s login or `HF_TOKEN`).
        commit_message: the upload's commit message.

    Returns:
        `huggingface_hub`'s upload result (the commit info).

    Example:
    >>> push(model, "me/smollm2-zoo")
    """
    import huggingface_hub

    api = huggingface_hub.HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save(model, Path(tmp) / "model", tokenizer=tokenizer)
        api.create_repo(repo_id, private=private, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message)


__all__ = [
    "ARCHITECTURES", "FAMILIES", "INDEX", "WEIGHTS", "Entry", "config_from_spec", "convert_gguf", "load",
    "load_adapter", "load_tokenizer", "load_weights", "match_registered", "local_folder", "push", "save",
    "save_adapter", "save_tokenizer", "spec_from_config", "weight_map", "write_gguf",
]
