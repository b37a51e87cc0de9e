"""Hugging Face format in and out: `config.json` <-> `ModelSpec`, safetensors <->
zoo variables, `vocab.txt` / BPE files <-> keras-hub tokenizers.

    model = zoo.hub.load("sentence-transformers/all-MiniLM-L6-v2")  # or a local folder
    zoo.hub.save(model, "out/")   # what transformers' from_pretrained reads
    zoo.hub.push(model, "me/my-model")

One table (`weight_map`) names, for every zoo variable, its Hugging Face tensor
and whether the kernel is transposed (Hugging Face `Linear` stores [out, in],
Keras `Dense` [in, out]); load and save both read it, so they cannot drift apart.
Tensors are streamed one at a time from safetensors (never pickle), so loading
needs about one tensor of extra memory beyond the model itself.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.files import atomic_path
from zoo.models import build
from zoo.registry import ModelSpec, names
from zoo.registry import spec as registered_spec

log = logging.getLogger(__name__)

# Hugging Face architecture -> (zoo family, zoo task).
ARCHITECTURES = {
    "BertModel": ("bert", "backbone"),
    "BertForMaskedLM": ("bert", "masked_lm"),
    "BertForSequenceClassification": ("bert", "classifier"),
    "LlamaModel": ("llama", "backbone"),
    "LlamaForCausalLM": ("llama", "causal_lm"),
}
_ARCH_OF = {v: k for k, v in ARCHITECTURES.items()}
_BASE_PREFIX = {"bert": "bert.", "llama": "model."}  # the backbone inside a task model
# Tensors Hugging Face stores but rebuilds itself (buffers, tied copies): skipped on load.
_DERIVED = ("embeddings.position_ids", "rotary_emb.inv_freq", "cls.predictions.decoder.weight",
            "cls.predictions.decoder.bias")
# Heads of the family that a zoo task may not have: dropped on load, as transformers does.
_KNOWN_HEADS = {"bert": ("pooler.", "cls.", "classifier."), "llama": ("lm_head.",)}
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


# --- config.json <-> ModelSpec ---------------------------------------------------------
def spec_from_config(config: dict):
    """Map a Hugging Face `config.json` to (ModelSpec, task, task arguments)."""
    archs = config.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        model_type = config.get("model_type")
        defaults = {"bert": "BertModel", "llama": "LlamaForCausalLM"}
        if archs or model_type not in defaults:
            raise ValueError(
                f"Unsupported architecture {archs or model_type!r}; supported: {', '.join(ARCHITECTURES)}."
            )
        arch = defaults[model_type]
    family, task = ARCHITECTURES[arch]
    if family == "bert":
        act = config.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"hidden_act={act!r} is not supported; zoo BERT models use exact (erf) 'gelu'.")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("Only position_embedding_type='absolute' BERT checkpoints are supported.")
        spec = ModelSpec(
            family="bert", vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
            hidden_dim=config["hidden_size"], num_heads=config["num_attention_heads"],
            intermediate_dim=config["intermediate_size"],
            max_sequence_length=config.get("max_position_embeddings", 512),
            num_segments=config.get("type_vocab_size", 2), dropout=config.get("hidden_dropout_prob", 0.1),
            layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        )
    else:
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported; zoo Llama models use 'silu' (SwiGLU).")
        if config.get("rope_scaling"):
            raise ValueError(f"rope_scaling={config['rope_scaling']!r} is not supported; only plain RoPE.")
        for flag in ("attention_bias", "mlp_bias"):
            if config.get(flag):
                raise ValueError(f"{flag}=True is not supported; zoo Llama projections have no biases.")
        heads, hidden = config["num_attention_heads"], config["hidden_size"]
        head_dim = config.get("head_dim")
        spec = ModelSpec(
            family="llama", vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
            hidden_dim=hidden, num_heads=heads, num_kv_heads=config.get("num_key_value_heads", heads),
            head_dim=None if head_dim in (None, hidden // heads) else head_dim,
            intermediate_dim=config["intermediate_size"],
            max_sequence_length=config.get("max_position_embeddings", 2048),
            dropout=config.get("attention_dropout", 0.0), layer_norm_epsilon=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    task_args = {"num_classes": len(config["id2label"])} if task == "classifier" and "id2label" in config else {}
    return spec, task, task_args


def match_registered(spec: ModelSpec):
    """The registered name with exactly this shape (description and dropout aside), or None."""
    for name in names():
        candidate = registered_spec(name)
        if candidate.replace(description="", dropout=spec.dropout) == spec.replace(description=""):
            return name
    return None


def config_from_spec(spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
    """The `config.json` transformers builds the same model from."""
    arch = _ARCH_OF[(spec.family, task)]
    if spec.family == "bert":
        config = {
            "model_type": "bert", "vocab_size": spec.vocab_size, "num_hidden_layers": spec.num_layers,
            "hidden_size": spec.hidden_dim, "num_attention_heads": spec.num_heads,
            "intermediate_size": spec.intermediate_dim, "max_position_embeddings": spec.max_sequence_length,
            "type_vocab_size": spec.num_segments, "hidden_act": "gelu", "hidden_dropout_prob": spec.dropout,
            "attention_probs_dropout_prob": spec.dropout, "layer_norm_eps": spec.layer_norm_epsilon,
            "position_embedding_type": "absolute", "pad_token_id": 0, "initializer_range": 0.02,
        }
        if num_classes is not None:
            config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
            config["label2id"] = {f"LABEL_{i}": i for i in range(num_classes)}
    else:
        config = {
            "model_type": "llama", "vocab_size": spec.vocab_size, "num_hidden_layers": spec.num_layers,
            "hidden_size": spec.hidden_dim, "num_attention_heads": spec.num_heads,
            "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
            "intermediate_size": spec.intermediate_dim, "max_position_embeddings": spec.max_sequence_length,
            "rms_norm_eps": spec.layer_norm_epsilon, "rope_theta": spec.rope_theta, "rope_scaling": None,
            "tie_word_embeddings": spec.tie_embeddings, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "attention_dropout": spec.dropout, "initializer_range": 0.02,
        }
    return {"architectures": [arch], **config, "torch_dtype": "float32"}


# --- the weight map --------------------------------------------------------------------
@dataclass
class Entry:
    """One Hugging Face tensor: its name (without the base-model prefix), the zoo
    variable, whether it is a transposed Dense kernel, and the part it belongs to."""

    key: str
    variable: object
    transpose: bool = False
    group: str = "backbone"  # backbone | pooler | mlm | classifier | lm_head


def _dense(prefix, layer, group="backbone"):
    entries = [Entry(f"{prefix}.weight", layer.kernel, True, group)]
    if layer.use_bias:
        entries.append(Entry(f"{prefix}.bias", layer.bias, False, group))
    return entries


def _norm(prefix, layer, group="backbone"):
    entries = [Entry(f"{prefix}.weight", layer.gamma if hasattr(layer, "gamma") else layer.scale, False, group)]
    if getattr(layer, "beta", None) is not None:
        entries.append(Entry(f"{prefix}.bias", layer.beta, False, group))
    return entries


def weight_map(model) -> list[Entry]:
    """Every variable of a zoo backbone or task model with its Hugging Face name."""
    backbone = getattr(model, "backbone", model)
    spec = backbone.spec
    entries = []
    if spec.family == "bert":
        entries += [
            Entry("embeddings.word_embeddings.weight", backbone.token_embedding.embeddings),
            Entry("embeddings.position_embeddings.weight", backbone.position_embedding.position_embeddings),
            Entry("embeddings.token_type_embeddings.weight", backbone.segment_embedding.embeddings),
            *_norm("embeddings.LayerNorm", backbone.embeddings_norm),
        ]
        for i, block in enumerate(backbone.blocks):
            p, att = f"encoder.layer.{i}", block.attention
            entries += [
                *_dense(f"{p}.attention.self.query", att.query_dense),
                *_dense(f"{p}.attention.self.key", att.key_dense),
                *_dense(f"{p}.attention.self.value", att.value_dense),
                *_dense(f"{p}.attention.output.dense", att.output_dense),
                *_norm(f"{p}.attention.output.LayerNorm", block.attention_norm),
                *_dense(f"{p}.intermediate.dense", block.ffn.up),
                *_dense(f"{p}.output.dense", block.ffn.down),
                *_norm(f"{p}.output.LayerNorm", block.ffn_norm),
            ]
        if backbone.pooler is not None:
            entries += _dense("pooler.dense", backbone.pooler, "pooler")
        if hasattr(model, "head"):  # masked LM: cls.predictions (decoder tied to the embedding)
            head = model.head
            entries += [
                *_dense("cls.predictions.transform.dense", head._intermediate_dense, "mlm"),
                *_norm("cls.predictions.transform.LayerNorm", head._intermediate_layer_norm, "mlm"),
                Entry("cls.predictions.bias", head._bias, False, "mlm"),
            ]
        if hasattr(model, "classifier"):
            entries += _dense("classifier", model.classifier, "classifier")
    else:
        entries.append(Entry("embed_tokens.weight", backbone.token_embedding.embeddings))
        for i, block in enumerate(backbone.blocks):
            p, att, ffn = f"layers.{i}", block.attention, block.ffn
            entries += [
                *_dense(f"{p}.self_attn.q_proj", att.query_dense),
                *_dense(f"{p}.self_attn.k_proj", att.key_dense),
                *_dense(f"{p}.self_attn.v_proj", att.value_dense),
                *_dense(f"{p}.self_attn.o_proj", att.output_dense),
                *_dense(f"{p}.mlp.gate_proj", ffn.gate),
                *_dense(f"{p}.mlp.up_proj", ffn.up),
                *_dense(f"{p}.mlp.down_proj", ffn.down),
                *_norm(f"{p}.input_layernorm", block.attention_norm),
                *_norm(f"{p}.post_attention_layernorm", block.ffn_norm),
            ]
        entries += _norm("norm", backbone.final_norm)
        if model is not backbone and not spec.tie_embeddings:
            # ReversibleEmbedding keeps the untied head as [hidden, vocab]; HF lm_head is [vocab, hidden].
            entries.append(Entry("lm_head.weight", backbone.token_embedding.reverse_embeddings, True, "lm_head"))
    return entries


def _hf_name(entry: Entry, family: str, task: str) -> str:
    """The full tensor name in the task's Hugging Face model (`bert.`/`model.` prefixes)."""
    if task != "backbone" and entry.group in ("backbone", "pooler"):
        return _BASE_PREFIX[family] + entry.key
    return entry.key


def _normalise(key: str, family: str) -> str:
    """A checkpoint tensor name without its base-model prefix and legacy LayerNorm names."""
    prefix = _BASE_PREFIX[family]
    key = key[len(prefix):] if key.startswith(prefix) else key
    if ".LayerNorm.gamma" in key or ".LayerNorm.beta" in key:  # TF-era BERT checkpoints
        key = key.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
    return key


# --- reading ---------------------------------------------------------------------------
def resolve(repo_id_or_path) -> Path:
    """A local folder as is, or a Hub repo id through `huggingface_hub` (its cache,
    `HF_HUB_OFFLINE`, `HF_TOKEN`). Fetches only config, safetensors and tokenizer files."""
    path = Path(os.path.expanduser(str(repo_id_or_path)))
    if path.is_dir():
        return path
    text = str(repo_id_or_path)
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


def _weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> safetensors file (one file, or the shards named by the index)."""
    from safetensors import safe_open

    if (folder / INDEX).exists():
        index = json.loads((folder / INDEX).read_text())
        return {key: folder / name for key, name in index["weight_map"].items()}
    if (folder / WEIGHTS).exists():
        with safe_open(folder / WEIGHTS, framework="numpy") as f:
            return {key: folder / WEIGHTS for key in f.keys()}
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
    if pickles:
        raise ValueError(
            f"{folder} holds only {', '.join(pickles)} (PyTorch pickle), which zoo never unpickles: it can run "
            "arbitrary code. Convert it to safetensors once, where you trust the file: "
            "`transformers.AutoModel.from_pretrained(folder).save_pretrained(folder, safe_serialization=True)` "
            "(or the Hub's 'convert to safetensors' space), then load the folder again."
        )
    raise FileNotFoundError(f"{folder} has no {WEIGHTS} or {INDEX}.")


def load_weights(model, folder, strict=True) -> list[str]:
    """Stream the folder's safetensors into `model`, one tensor at a time.

    Raises on a missing backbone tensor, an unknown tensor (a warning with strict=False)
    or a shape mismatch.
    A head the checkpoint does not have (a classifier on a `BertModel`) keeps its
    fresh initialisation; its tensor names are returned (and logged)."""
    from safetensors import safe_open

    folder = Path(folder)
    backbone = getattr(model, "backbone", model)
    family = backbone.spec.family
    files = _weight_files(folder)
    available = {}
    for key, file in files.items():
        name = _normalise(key, family)
        if not name.endswith(_DERIVED):
            available[name] = (key, file)
    entries = weight_map(model)
    wanted = {e.key for e in entries}
    unexpected = sorted(k for k in available if k not in wanted and not k.startswith(_KNOWN_HEADS[family]))
    if unexpected:
        message = (f"Unexpected tensor {available[unexpected[0]][0]!r} in {folder} (and {len(unexpected) - 1} more): "
                   f"a {family} model has no such weight. Is this checkpoint the architecture its config.json says?")
        if strict:
            raise ValueError(message)
        log.warning("%s Ignored (strict=False).", message)
    groups_present = {e.group for e in entries if e.key in available}
    fresh = []
    handles = {}
    try:
        for entry in entries:
            if entry.key not in available:
                if entry.group == "backbone" or entry.group in groups_present:
                    raise ValueError(
                        f"Missing tensor {_hf_name(entry, family, model.task)!r} in {folder}: "
                        f"the model needs shape {_hf_shape(entry)}, the checkpoint has none."
                    )
                fresh.append(entry.key)
                continue
            key, file = available[entry.key]
            if file not in handles:
                handles[file] = safe_open(file, framework="numpy")
            array = handles[file].get_tensor(key)
            if tuple(array.shape) != _hf_shape(entry):
                raise ValueError(
                    f"Shape mismatch for tensor {key!r}: the checkpoint has {tuple(array.shape)}, the model needs "
                    f"{_hf_shape(entry)}. Does config.json describe these weights?"
                )
            entry.variable.assign(_cast(array.T if entry.transpose else array, entry.variable.dtype))
            del array
    finally:
        handles.clear()
    if fresh:
        log.warning("Not in the checkpoint, newly initialised: %s", ", ".join(fresh))
    return fresh


def _cast(array, dtype: str):
    """Checkpoint dtype -> variable dtype in numpy (bfloat16 through ml_dtypes)."""
    import ml_dtypes

    target = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return array if array.dtype == target else array.astype(target)


def _hf_shape(entry: Entry) -> tuple:
    shape = tuple(entry.variable.shape)
    return shape[::-1] if entry.transpose else shape


def load_tokenizer(folder):
    """The folder's tokenizer as a keras-hub tokenizer: WordPiece (`vocab.txt` or a
    WordPiece `tokenizer.json`) -> `BertTokenizer`; byte-level BPE (`vocab.json` +
    `merges.txt`, or a BPE `tokenizer.json`) -> `BytePairTokenizer`. None if absent."""
    import keras_hub

    folder = Path(folder)
    settings = _read_json(folder / "tokenizer_config.json")
    lowercase = bool(settings.get("do_lower_case", False))
    if (folder / "vocab.txt").exists():
        return keras_hub.models.BertTokenizer(vocabulary=str(folder / "vocab.txt"), lowercase=lowercase)
    if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        vocab = _read_json(folder / "vocab.json")
        merges = [m for m in (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
                  if m and not m.startswith("#version")]
        return _bpe(vocab, merges, settings.get("added_tokens_decoder", {}).values())
    if (folder / "tokenizer.json").exists():
        spec = _read_json(folder / "tokenizer.json")
        model = spec["model"]
        if model.get("type") == "WordPiece":
            vocab = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
            lower = (spec.get("normalizer") or {}).get("lowercase", lowercase)
            return keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=bool(lower))
        if model.get("type") == "BPE":
            merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
            return _bpe(model["vocab"], merges, spec.get("added_tokens", []))
        raise ValueError(f"Unsupported tokenizer model {model.get('type')!r} in {folder / 'tokenizer.json'}.")
    return None


def _bpe(vocab, merges, added):
    import keras_hub

    special = [t["content"] for t in added if t.get("special", True)] if added else []
    return keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=vocab, merges=merges, unsplittable_tokens=special or None
    )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def load(repo_id_or_path, task=None, checkpointing=None, dtype=None, name=None, tokenizer=True, **overrides):
    """Build the zoo model a Hugging Face folder (or Hub repo id) describes and load its weights.

    task: None = the checkpoint's own (BertModel -> "backbone", LlamaForCausalLM -> "causal_lm");
    another task of the family reuses the backbone and initialises the new head.
    name: a registered name the checkpoint must match in shape ("enc-mini").
    overrides: spec fields that do not change weight shapes (dropout=0.0), or num_classes.
    The tokenizer (if the folder has one) is attached as `model.tokenizer`.
    """
    folder = resolve(repo_id_or_path)
    config = _read_json(folder / "config.json")
    if not config:
        raise FileNotFoundError(f"{folder} has no config.json; it is not a Hugging Face model folder.")
    spec, own_task, task_args = spec_from_config(config)
    if name is not None and not isinstance(name, ModelSpec):
        expected = registered_spec(name)
        diff = [f"{f}: checkpoint {getattr(spec, f)!r}, {name} {getattr(expected, f)!r}"
                for f in ("family", "vocab_size", "num_layers", "hidden_dim", "num_heads", "num_kv_heads",
                          "head_dim", "intermediate_dim", "max_sequence_length", "tie_embeddings")
                if getattr(spec, f) != getattr(expected, f)]
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
    model = build(spec.replace(**overrides) if overrides else spec, task=task, checkpointing=checkpointing,
                  dtype=dtype, **task_args)
    load_weights(model, folder)
    if tokenizer:
        model.__dict__["tokenizer"] = load_tokenizer(folder)  # plain attribute: not a tracked sublayer
    return model


# --- writing ---------------------------------------------------------------------------
def save(model, folder, tokenizer=None, overwrite=False, max_shard_size=None) -> Path:
    """Write `config.json`, `model.safetensors` (or shards + index) and the tokenizer
    files in Hugging Face format, atomically (a temp sibling renamed into place)."""
    folder = Path(folder)
    with atomic_path(folder, overwrite) as tmp:
        tmp.mkdir()
        _write(model, tmp, tokenizer if tokenizer is not None else getattr(model, "tokenizer", None),
               max_shard_size)
    return folder


def _write(model, folder: Path, tokenizer, max_shard_size):
    from safetensors.numpy import save_file

    backbone = getattr(model, "backbone", model)
    spec, task = backbone.spec, model.task
    num_classes = model.classifier.units if task == "classifier" else None
    (folder / "config.json").write_text(json.dumps(config_from_spec(spec, task, num_classes), indent=2) + "\n")
    tensors = {}
    for entry in weight_map(model):
        array = np.asarray(entry.variable.numpy())
        tensors[_hf_name(entry, spec.family, task)] = np.ascontiguousarray(array.T if entry.transpose else array)
    shards = _shards(tensors, max_shard_size)
    if len(shards) == 1:
        save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    else:
        weight_map_ = {}
        for i, keys in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: tensors[k] for k in keys}, folder / name, metadata={"format": "pt"})
            weight_map_.update({k: name for k in keys})
        total = sum(a.nbytes for a in tensors.values())
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map_},
                                               indent=2) + "\n")
    if tokenizer is not None:
        save_tokenizer(tokenizer, folder)


def _shards(tensors: dict, max_shard_size):
    if not max_shard_size:
        return [list(tensors)]
    shards, current, size = [], [], 0
    for key, array in tensors.items():
        if current and size + array.nbytes > max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(key)
        size += array.nbytes
    return shards + [current]


def save_tokenizer(tokenizer, folder):
    """keras-hub tokenizer -> the files transformers' tokenizers read: `vocab.txt`
    (WordPiece) or `vocab.json` + `merges.txt` (byte-level BPE), with `tokenizer_config.json`."""
    import keras_hub

    folder = Path(folder)
    if isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        (folder / "vocab.txt").write_text("\n".join(tokenizer.get_vocabulary()) + "\n", encoding="utf-8")
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(tokenizer.lowercase)}
    elif isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer):
        (folder / "vocab.json").write_text(json.dumps(tokenizer.vocabulary, ensure_ascii=False), encoding="utf-8")
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(tokenizer.merges) + "\n", encoding="utf-8")
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": bool(tokenizer.add_prefix_space)}
        special = tokenizer.unsplittable_tokens or []
        if special:
            config["added_tokens_decoder"] = {
                str(tokenizer.vocabulary[t]): {"content": t, "special": True} for t in special
            }
    else:
        raise TypeError(f"Cannot save a {type(tokenizer).__name__}; zoo saves WordPiece and byte-level BPE tokenizers.")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def push(model, repo_id, tokenizer=None, private=None, token=None, commit_message="Upload keras-zoo model"):
    """Save the model in Hugging Face format to a temp folder and upload it with `huggingface_hub`."""
    import huggingface_hub

    api = huggingface_hub.HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save(model, Path(tmp) / "model", tokenizer=tokenizer)
        api.create_repo(repo_id, private=private, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message)


# --- GGUF (llama.cpp) -> Hugging Face folder ---------------------------------------------
_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def _unpermute_rope(weight, heads):
    """Undo llama.cpp's convert-time Q/K row permutation (its rope pairs adjacent
    dimensions; Hugging Face pairs the two halves of each head)."""
    out_dim = weight.shape[0]
    return weight.reshape(heads, out_dim // heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def convert_gguf(gguf_path, folder, overwrite=False) -> Path:
    """A llama-architecture GGUF file (any quantisation `gguf` dequantises) written as a
    Hugging Face `LlamaForCausalLM` folder: config.json, float32 model.safetensors and a
    byte-level BPE tokenizer.json."""
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    field = lambda key, default=None: reader.fields[key].contents() if key in reader.fields else default  # noqa: E731
    arch = field("general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path} is a {arch!r} GGUF; only 'llama' GGUF files convert to a zoo model.")
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    tensors = {}
    for tensor in reader.tensors:
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        name = tensor.name
        if name.startswith("blk."):
            _, layer, part, kind = name.split(".")
            if part == "attn_q":
                weight = _unpermute_rope(weight, heads)
            elif part == "attn_k":
                weight = _unpermute_rope(weight, kv_heads)
            name = f"model.layers.{layer}.{_GGUF_NAMES[part]}.{kind}"
        else:
            name = _GGUF_NAMES[name]
        tensors[name] = np.ascontiguousarray(weight)
    tokens = field("tokenizer.ggml.tokens")
    hidden = field("llama.embedding_length")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(tokens),
        "num_hidden_layers": field("llama.block_count"), "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "intermediate_size": field("llama.feed_forward_length"),
        "max_position_embeddings": field("llama.context_length"),
        "rms_norm_eps": float(f"{field('llama.attention.layer_norm_rms_epsilon'):.6g}"),  # stored as float32
        "rope_theta": float(field("llama.rope.freq_base", 10000.0)), "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in tensors, "rope_scaling": None,
        "bos_token_id": field("tokenizer.ggml.bos_token_id"), "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    if field("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path}: only byte-level BPE ('gpt2') GGUF tokenizers are converted.")
    types = field("tokenizer.ggml.token_type")
    special = [{"id": i, "content": t, "special": True} for i, (t, k) in enumerate(zip(tokens, types)) if k == 3]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": list(field("tokenizer.ggml.merges"))},
    }
    folder = Path(folder)
    with atomic_path(folder, overwrite) as tmp:
        tmp.mkdir()
        save_file(tensors, tmp / WEIGHTS, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    return folder
