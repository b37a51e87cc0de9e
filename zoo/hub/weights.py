"""safetensors in and out, one tensor at a time, with shards.

A family module (`zoo.hub.bert`, `zoo.hub.llama`) lists every variable of a zoo
model as an `Entry`: its Hugging Face tensor name (without the base-model prefix)
and whether the kernel is transposed (Hugging Face `Linear` stores [out, in],
Keras `Dense` [in, out]). Loading and saving both read that one list, so they
cannot drift apart. Tensors are streamed from safetensors (never pickle), so
loading needs about one tensor of memory beyond the model itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo import quantization
from zoo.reading import UnreadableFile, open_safetensors, read_json

log = logging.getLogger("zoo.hub")

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass
class Entry:
    """One Hugging Face tensor and the zoo variable that holds it: `key` without the base-model prefix,
    `transpose` for a Dense kernel (Keras [in, out], Hugging Face [out, in]), and `group` ("backbone",
    "pooler", "mlm", "classifier", "lm_head"): a missing backbone tensor is an error, a missing head is
    freshly initialised. `variable` may be a tuple: a fused tensor (ModernBERT's Wqkv, Wi) whose rows are
    the variables' (transposed) stacked in order. `module` is a projection's Keras `Dense` (what LoRA
    attaches to), else None (a fused tensor's too: several Dense layers, which zoo.lora refuses to adapt)."""

    key: str
    variable: object
    transpose: bool = False
    group: str = "backbone"
    module: object = None
    # A quantized layer's tensor (zoo.models.build(..., quantize=)): `variable` is None, and the tensor is
    # the layer's float `slot` ("kernel", "embeddings", "reverse_embeddings"), which zoo.quantization.quantize_into
    # turns into the layer's integer variables. Reading a quantized kernel would unpack a kernel-sized copy.
    layer: object = None
    slot: str = None

    @property
    def parts(self) -> tuple:
        return self.variable if isinstance(self.variable, tuple) else (self.variable,)

    def to_hf(self):
        """The tensor as the Hugging Face file holds it (numpy)."""
        arrays = [np.asarray(v.numpy()) for v in self.parts]
        arrays = [a.T if self.transpose else a for a in arrays]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)

    def assign(self, array):
        """Load the Hugging Face tensor `array` into the variable(s)."""
        start = 0
        for v in self.parts:
            rows = v.shape[-1] if self.transpose else v.shape[0]
            part = array[start:start + rows]
            start += rows
            v.assign(cast(part.T if self.transpose else part, v.dtype))


def _quantized(layer, key, slot, transpose, group, module=None):
    """A quantized layer's entry (`Entry.layer`), or None for a float layer."""
    if not getattr(layer, "quantization_mode", None):
        return None
    return Entry(key, None, transpose, group, module=module, layer=layer, slot=slot)


def dense(prefix, layer, group="backbone") -> list[Entry]:
    """The entries of a Keras `Dense` stored as a Hugging Face `Linear` (weight transposed, then bias)."""
    entries = [_quantized(layer, f"{prefix}.weight", "kernel", True, group, layer)
               or Entry(f"{prefix}.weight", layer.kernel, True, group, module=layer)]
    if layer.use_bias:
        entries.append(Entry(f"{prefix}.bias", layer.bias, False, group))
    return entries


def embedding(key, layer, group="backbone", reverse=False) -> Entry:
    """The entry of an embedding's table, or of a ReversibleEmbedding's untied head (`reverse`: Keras
    [hidden, vocab], Hugging Face `lm_head` [vocab, hidden])."""
    slot = "reverse_embeddings" if reverse else "embeddings"
    return _quantized(layer, key, slot, reverse, group) or Entry(key, getattr(layer, slot), reverse, group)


def norm(prefix, layer, group="backbone") -> list[Entry]:
    """The entries of a LayerNormalization / RMSNormalization stored as a Hugging Face norm (weight, bias)."""
    entries = [Entry(f"{prefix}.weight", layer.gamma if hasattr(layer, "gamma") else layer.scale, False, group)]
    if getattr(layer, "beta", None) is not None:
        entries.append(Entry(f"{prefix}.bias", layer.beta, False, group))
    return entries


def hf_name(entry: Entry, family, task: str) -> str:
    """The full tensor name in the task's Hugging Face model: a task model nests the backbone under
    `family.BASE_PREFIX` ("bert.", "model."), a bare backbone does not."""
    if task != "backbone" and entry.group in ("backbone", "pooler"):
        return family.BASE_PREFIX + entry.key
    return entry.key


def hf_shape(entry: Entry) -> tuple:
    """The entry's shape as the Hugging Face file holds it (a Dense kernel's transposed, fused parts stacked)."""
    if entry.layer is not None:  # the float shape, not the integer variable's (int4 packs two to a byte)
        layer = entry.layer
        if entry.slot == "kernel":
            return (layer.units, layer._kernel.shape[0])
        return (layer.input_dim, layer.output_dim)
    shapes = [tuple(v.shape)[::-1] if entry.transpose else tuple(v.shape) for v in entry.parts]
    return (sum(shape[0] for shape in shapes),) + shapes[0][1:]


def normalise(key: str, family) -> str:
    """A checkpoint tensor name as the weight map names it: the base-model prefix dropped and TF-era
    fragments renamed, so a backbone saved alone, inside a task model, or by TF-era code loads the same."""
    prefix = family.BASE_PREFIX
    key = key[len(prefix):] if key.startswith(prefix) else key
    for old, new in family.LEGACY_NAMES.items():
        key = key.replace(old, new)
    return key


def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it (one file, or the shards the index names).
    A folder of PyTorch pickles is refused with the one-line conversion: unpickling can run code."""
    if (folder / INDEX).exists():
        index = read_json(folder / INDEX)
        if not isinstance(index.get("weight_map") if isinstance(index, dict) else None, dict):
            raise UnreadableFile(f"{folder / INDEX} has no \"weight_map\" (tensor name -> shard file); download or "
                                 "copy it again.")
        files = {key: folder / name for key, name in index["weight_map"].items()}
        missing = sorted({path.name for path in files.values() if not path.is_file()})
        if missing:  # before any tensor is read: an interrupted download leaves shards out
            raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}, which {INDEX} names; download or copy "
                                    "the folder again.")
        return files
    if (folder / WEIGHTS).exists():
        with open_safetensors(folder / WEIGHTS) as f:
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


def fingerprint(folder) -> str:
    """sha256 over a folder's config.json and weight files: what a LoRA run records of its frozen
    base, so that adapters are never loaded onto other weights at the same path (1B: seconds)."""
    import hashlib

    folder = Path(folder)
    digest = hashlib.sha256()
    for path in [folder / "config.json", *sorted(set(weight_files(folder).values()))]:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            while chunk := f.read(2**24):
                digest.update(chunk)
    return digest.hexdigest()


def load_into(model, folder, family, strict=True) -> list[str]:
    """Stream a folder's safetensors into a built zoo model, one tensor at a time, so
    that loading needs about one tensor of memory beyond the model.

    Args:
        model: a zoo backbone or task model.
        folder: a Hugging Face model folder (one safetensors file or shards + index).
        family: the family module (`zoo.hub.bert`, `zoo.hub.llama`) of the model.
        strict: raise on a tensor the model has no place for (else log a warning).

    Returns:
        The names of the head tensors the checkpoint lacks, which keep their fresh
        initialisation (a classifier on a `BertModel` checkpoint).

    A model built quantized (`zoo.models.build(..., quantize=)`) gets each quantized layer's tensors
    through Keras' quantizer, a slice of rows at a time (`zoo.quantization.quantize_into`).

    Raises:
        ValueError: a missing backbone tensor, an unexpected tensor (strict), a shape
            mismatch (named with both shapes) or a tensor that is not float; all read off
            the headers before any tensor is, so that nothing is half-loaded.

    Example:
    >>> load_into(zoo.get("enc-mini", task="classifier"), "all-MiniLM-L6-v2", bert)
    ['classifier.weight', 'classifier.bias']
    """
    folder = Path(folder)
    files = weight_files(folder)
    available = {}
    for key, file in files.items():
        name = normalise(key, family)
        if not name.endswith(family.DERIVED):
            available[name] = (key, file)
    entries = family.weight_map(model)
    wanted = {e.key for e in entries}
    unexpected = sorted(k for k in available if k not in wanted and not k.startswith(family.KNOWN_HEADS))
    if unexpected:
        message = (f"Unexpected tensor {available[unexpected[0]][0]!r} in {folder} (and {len(unexpected) - 1} more): "
                   f"a {family.FAMILY} model has no such weight. Is this checkpoint the architecture its "
                   "config.json says?")
        if strict:
            raise ValueError(message)
        log.warning("%s Ignored (strict=False).", message)
    groups_present = {e.group for e in entries if e.key in available}
    fresh = []
    handles = {}
    with contextlib.ExitStack() as opened:
        for entry in entries:  # every header first: refuse a missing, misshapen or non-float tensor by name
            if entry.key not in available:
                if entry.group == "backbone" or entry.group in groups_present:
                    raise ValueError(
                        f"Missing tensor {hf_name(entry, family, model.task)!r} in {folder}: "
                        f"the model needs shape {hf_shape(entry)}, the checkpoint has none."
                    )
                fresh.append(entry.key)
                continue
            key, file = available[entry.key]
            if file not in handles:
                handles[file] = opened.enter_context(open_safetensors(file))
            check_header(handles[file].get_slice(key), key, file, hf_shape(entry))
    for group in _by_layer([e for e in entries if e.key in available]):
        if group[0].layer is None:
            group[0].assign(read_tensor(*available[group[0].key]))
        else:  # Keras' quantizer, a slice of the checkpoint's rows at a time (tokens, or a kernel's outputs)
            layer = group[0].layer
            quantization.quantize_into(layer, {e.slot: rows(*available[e.key], e.transpose) for e in group},
                               layer.quantization_mode)
    if fresh:
        log.warning("Not in the checkpoint, newly initialised: %s", ", ".join(fresh))
    return fresh


def read_tensor(key, file):
    """One tensor as a numpy array of its own. The file is opened for it alone: safetensors maps the file,
    and every page read stays in the process's resident memory while the map is open (a whole checkpoint's
    worth by the end, were the shards kept open)."""
    with open_safetensors(file) as f:
        return f.get_tensor(key)


def rows(key, file, transpose):
    """(begin, end) -> the tensor's rows begin:end (`transpose`: as the Keras variable's columns), read
    alone (`read_tensor`). Hugging Face's rows are a table's tokens and a Linear's outputs: what
    zoo.quantization.quantize_into slices a layer by."""
    def read(begin, end):
        with open_safetensors(file) as f:
            part = f.get_slice(key)[begin:end]
        return part.T if transpose else part

    return read


FLOAT_DTYPES = ("F32", "BF16", "F16")  # safetensors' names of the dtypes a weight may be stored in


def check_header(tensor, key, file, shape):
    """Refuse a tensor whose header (read without its data) has another shape or a non-float dtype."""
    found = tuple(tensor.get_shape())
    if found != tuple(shape):
        raise ValueError(f"Shape mismatch for tensor {key!r} in {Path(file).name}: the checkpoint has {found}, the "
                         f"model needs {tuple(shape)}. Does config.json describe these weights?")
    if tensor.get_dtype() not in FLOAT_DTYPES:
        raise ValueError(f"Tensor {key!r} in {Path(file).name} is {tensor.get_dtype()}; a weight loads from "
                         f"{', '.join(FLOAT_DTYPES)}. Is this a quantized checkpoint (zoo quantizes float weights "
                         "itself: quantize='int4')?")


def _by_layer(entries) -> list[list[Entry]]:
    """The entries in loading order: each alone, but a quantized layer's together (an untied head's table
    and reverse, which Keras quantizes in one call), where the first of them stands."""
    groups, of_layer = [], {}
    for entry in entries:
        if entry.layer is None:
            groups.append([entry])
        elif id(entry.layer) in of_layer:
            of_layer[id(entry.layer)].append(entry)
        else:
            of_layer[id(entry.layer)] = [entry]
            groups.append(of_layer[id(entry.layer)])
    return groups


def cast(array, dtype: str):
    """A checkpoint array in the variable's dtype, converted in numpy (bfloat16 through ml_dtypes), so
    that bfloat16 files load into float32 models."""
    import ml_dtypes

    target = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return array if array.dtype == target else array.astype(target)


def save_from(model, folder, family, max_shard_size=None) -> list[str]:
    """Write a zoo model's variables as Hugging Face safetensors: `model.safetensors`,
    or shards and `model.safetensors.index.json` when they exceed `max_shard_size`.

    Args:
        model: a zoo backbone or task model.
        folder: an existing folder to write into.
        family: the family module of the model.
        max_shard_size: bytes per shard; None writes one file.

    Returns:
        The names of the files written.

    Example:
    >>> save_from(model, Path("out"), llama, max_shard_size=2**30)
    ['model.safetensors']
    """
    from safetensors.numpy import save_file

    folder = Path(folder)
    tensors = {}
    for entry in family.weight_map(model):
        tensors[hf_name(entry, family, model.task)] = np.ascontiguousarray(entry.to_hf())
    groups = shards(tensors, max_shard_size)
    if len(groups) == 1:
        save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
        return [WEIGHTS]
    index = {}
    for i, keys in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, folder / name, metadata={"format": "pt"})
        index.update({k: name for k in keys})
    total = sum(a.nbytes for a in tensors.values())
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2) + "\n")
    return sorted(set(index.values())) + [INDEX]


def shards(tensors: dict, max_shard_size) -> list[list[str]]:
    """Tensor names grouped, in order, into shards of at most `max_shard_size` bytes (None or 0: one
    group); a tensor larger than that gets a shard of its own."""
    if not max_shard_size:
        return [list(tensors)]
    groups, current, size = [], [], 0
    for key, array in tensors.items():
        if current and size + array.nbytes > max_shard_size:
            groups.append(current)
            current, size = [], 0
        current.append(key)
        size += array.nbytes
    return groups + [current]
