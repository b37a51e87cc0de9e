"""Hugging Face PEFT LoRA adapter folders in and out, so that adapters trained here load in
PEFT (`PeftModel.from_pretrained(base, folder)`) and adapters PEFT wrote load here
(`zoo.hub.load(base, adapter=folder)`).

A folder holds `adapter_config.json` (PEFT's `LoraConfig`) and `adapter_model.safetensors`:
    base_model.model.<module>.lora_A.weight   [r, in]   Keras' lora_kernel_a [in, r], transposed
    base_model.model.<module>.lora_B.weight   [out, r]  Keras' lora_kernel_b [r, out], transposed
    base_model.model.<head>.weight / .bias    a modules_to_save head (SEQ_CLS: the classifier)
where <module> is the Hugging Face module name (`zoo.lora.projections`). PEFT scales B·A by
lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, per module with rank_pattern /
alpha_pattern; Keras scales by lora_alpha / lora_rank, so an rsLoRA adapter gets Keras'
alpha = lora_alpha·sqrt(r) (and is written back as plain LoRA with that alpha).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np

from zoo import lora
from zoo.files import atomic_path
from zoo.hub.tokenizers import save_tokenizer
from zoo.reading import open_safetensors, read_json

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
# zoo task -> PEFT task_type
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "backbone": "FEATURE_EXTRACTION", "classifier": "SEQ_CLS", "masked_lm": None}
# adapter_config.json fields that change what an adapter computes and that Keras' LoRA does not
# compute: refused when set, rather than loaded wrong.
UNSUPPORTED = {
    "use_dora": "DoRA rescales each merged kernel by a learned magnitude vector",
    "lora_bias": "a LoRA bias adds a trained bias to lora_B",
    "fan_in_fan_out": "fan_in_fan_out is GPT-2's Conv1D layout",
    "layer_replication": "layer replication changes the model's depth",
    "target_parameters": "target_parameters adapts parameters, not modules",
    "trainable_token_indices": "trainable tokens change embedding rows",
    "alora_invocation_tokens": "activated LoRA switches adapters on by token",
    "use_qalora": "QALoRA pools the adapter's input",
    "use_bdlora": "BD-LoRA uses block-diagonal factors",
    "arrow_config": "Arrow routes among several adapters",
}


def read_config(folder) -> dict:
    """A PEFT adapter folder's `adapter_config.json`, refusing what zoo does not compute.

    Raises:
        FileNotFoundError: no adapter_config.json.
        ValueError: not a LoRA adapter, or a setting from `UNSUPPORTED`, or bias != "none".
    """
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG}; it is not a PEFT adapter folder.")
    config = read_json(path)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path} is a {config.get('peft_type')!r} adapter; zoo reads LoRA adapters "
                         "(peft_type 'LORA').")
    for field, reason in UNSUPPORTED.items():
        if config.get(field) not in (None, False, [], {}):
            raise ValueError(f"{path}: {field}={config[field]!r} is not supported ({reason}; Keras' LoRA computes "
                             "only W + scale·A·B).")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{path}: bias={config['bias']!r} trains the base model's biases; zoo reads bias='none'.")
    return config


def _pattern_value(patterns: dict, name: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup (peft.utils.other.get_pattern_key)."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def _width_fields(spec, width) -> str:
    fields = {"hidden_dim": spec.hidden_dim, "intermediate_dim": spec.intermediate_dim,
              "num_heads × head_dim": spec.num_heads * spec.head_dim,
              "num_kv_heads × head_dim": spec.num_kv_heads * spec.head_dim}
    names = [f for f, value in fields.items() if value == width]
    return " or ".join(names) if names else "a projection width"


def _check_factor(key, shape, expected, width_axis, spec):
    """Refuse a factor whose shape is not the model's, naming the width's spec field."""
    if tuple(shape) == expected:
        return
    if shape[width_axis] != expected[width_axis]:
        ours, theirs = expected[width_axis], shape[width_axis]
        what = (f"{'input' if width_axis == 1 else 'output'} width {theirs}, where this model has {ours} "
                f"({_width_fields(spec, ours)})")
    else:
        what = f"lora_B rank {shape[1]}, where its lora_A has rank {expected[1]}"
    raise ValueError(f"Adapter tensor {key!r} has shape {tuple(shape)}; this model needs {expected}: the adapter's "
                     f"{what}. Load an adapter onto the base it was trained on.")


def load_adapter(model, folder) -> list:
    """Read a LoRA adapter folder that PEFT wrote onto a zoo model of its base (float or
    quantized with `zoo.quantization.quantize_base`): enable LoRA on exactly the modules the file
    holds, with its ranks and scaling, assign its tensors, and freeze the rest as
    `zoo.lora.enable_lora` does. A modules_to_save head (the classifier) is loaded too.

    Args:
        model: a zoo model with the adapter's base weights and no LoRA.
        folder: a folder with adapter_config.json and adapter_model.safetensors.

    Returns:
        The Hugging Face names of the adapted projections.

    Raises:
        ValueError: a tensor for a module the model lacks, a shape that differs from the
            model's (naming the width's spec field), a rank that differs from r /
            rank_pattern, an unexpected tensor, or an unsupported setting.

    Example:
    >>> model = zoo.hub.load("base/", adapter="adapter/")  # the same as:
    >>> load_adapter(zoo.hub.load("base/"), "adapter/")
    ['model.layers.0.self_attn.q_proj', ...]
    """
    from zoo.hub.families import family_of
    from zoo.hub.weights import hf_name, hf_shape, normalise

    folder = Path(folder)
    config = read_config(folder)
    file = folder / WEIGHTS
    if not file.is_file():
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        raise FileNotFoundError(f"{folder} has no {WEIGHTS}" + (
            f" (only {', '.join(pickles)}, a PyTorch pickle zoo never unpickles: load it in PEFT and "
            "save_pretrained(folder, safe_serialization=True) once)." if pickles else "."))
    family = family_of(model)
    spec = getattr(model, "backbone", model).spec
    modules = lora.projections(model)
    by_name = {normalise(name, family): name for name in modules}
    heads = {normalise(hf_name(e, family, model.task), family): e for e in family.weight_map(model)
             if e.group in lora.HEAD_GROUPS}
    rslora = bool(config.get("use_rslora"))
    plan, tensors, head_arrays = {}, {}, {}
    with open_safetensors(file) as f:
        keys = list(f.keys())
        pairs = {}
        for key in keys:
            found = re.fullmatch(rf"{re.escape(PREFIX)}(.+)\.lora_([AB])\.weight", key)
            if found:
                pairs.setdefault(found[1], {})[found[2]] = key
                continue
            short = normalise(key[len(PREFIX):] if key.startswith(PREFIX) else key, family)
            if short not in heads:
                raise ValueError(f"Unexpected tensor {key!r} in {file}: neither a LoRA factor nor a head of this "
                                 f"{model.task} model.")
            head_arrays[short] = (key, f.get_tensor(key))
        for module, factors in pairs.items():
            name = by_name.get(normalise(module, family))
            if name is None:
                raise ValueError(f"{file} adapts {module!r}, which this model does not have (num_layers="
                                 f"{spec.num_layers}); {lora._known(list(modules))} Is it this base's adapter?")
            if set(factors) != {"A", "B"}:
                raise ValueError(f"{file} holds only lora_{''.join(factors)} for {module!r}; it needs A and B.")
            a, b = f.get_tensor(factors["A"]), f.get_tensor(factors["B"])
            layer = modules[name]
            fan_in, fan_out, rank = layer._kernel.shape[0], layer.units, a.shape[0]
            _check_factor(factors["A"], a.shape, (rank, fan_in), 1, spec)
            _check_factor(factors["B"], b.shape, (fan_out, rank), 0, spec)
            expected_rank = _pattern_value(config.get("rank_pattern"), module, config.get("r"))
            if rank != expected_rank:
                raise ValueError(f"Adapter tensor {factors['A']!r} has rank {rank}, but {CONFIG} says r="
                                 f"{expected_rank} for {module!r} (fields r / rank_pattern).")
            alpha = _pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", rank))
            plan[name] = (rank, alpha * math.sqrt(rank) if rslora else alpha)
            tensors[name] = (a.T, b.T)
    if not plan:
        raise ValueError(f"{file} holds no LoRA factors (*.lora_A.weight / *.lora_B.weight).")
    for short, entry in heads.items():
        if short not in head_arrays and config.get("modules_to_save"):
            raise ValueError(f"{file} has no {hf_name(entry, family, model.task)!r}, which modules_to_save names.")
    lora.add_adapters(model, plan)
    for name, (a, b) in tensors.items():
        modules[name].lora_kernel_a.assign(a.astype("float32"))
        modules[name].lora_kernel_b.assign(b.astype("float32"))
    for short, (key, array) in head_arrays.items():
        entry = heads[short]
        if tuple(array.shape) != hf_shape(entry):
            raise ValueError(f"Adapter tensor {key!r} has shape {array.shape}; this model's head needs "
                             f"{hf_shape(entry)}.")
        entry.assign(array)
    return list(plan)


def save_adapter(model, folder, overwrite=False, tokenizer=None, base=None) -> Path:
    """Write a zoo model's LoRA adapters as a PEFT adapter folder (adapter_config.json +
    adapter_model.safetensors, with PEFT's tensor names and shapes and its lora_alpha / r
    scaling) that `PeftModel.from_pretrained(base, folder)` reads onto the Hugging Face base.
    A classifier's head is saved as PEFT's modules_to_save. Written atomically.

    Args:
        model: a zoo model with LoRA (`enable_lora`, `zoo.hub.load(..., adapter=)`).
        folder: the folder to write.
        overwrite: replace an existing folder (else FileExistsError).
        tokenizer: a keras-hub tokenizer to write beside the adapter (`zoo.hub.save_tokenizer`).
        base: the base model's folder or repo id, as PEFT's `base_model_name_or_path`.

    Returns:
        `folder` as a Path.

    Example:
    >>> save_adapter(model, "adapter/")
    PosixPath('adapter')
    """
    from safetensors.numpy import save_file

    from zoo.hub.families import family_of
    from zoo.hub.weights import hf_name

    layers = lora.adapters(model)
    if not layers:
        raise ValueError("This model has no LoRA adapters to save; enable_lora() adds them.")
    ranks = {name: int(layer.lora_rank) for name, layer in layers.items()}
    alphas = {name: _number(layer.lora_alpha) for name, layer in layers.items()}
    r = Counter(ranks.values()).most_common(1)[0][0]
    alpha = Counter(alphas.values()).most_common(1)[0][0]
    tensors = {}
    for name, layer in layers.items():
        tensors[f"{PREFIX}{name}.lora_A.weight"] = np.ascontiguousarray(layer.lora_kernel_a.numpy().T)
        tensors[f"{PREFIX}{name}.lora_B.weight"] = np.ascontiguousarray(layer.lora_kernel_b.numpy().T)
    family = family_of(model)
    heads = [e for e in family.weight_map(model) if e.group in lora.HEAD_GROUPS]
    for entry in heads:
        tensors[PREFIX + hf_name(entry, family, model.task)] = np.ascontiguousarray(entry.to_hf())
    config = {
        "peft_type": "LORA", "task_type": TASK_TYPES.get(model.task), "r": r, "lora_alpha": alpha,
        "target_modules": _target_modules(model, list(layers)),
        "rank_pattern": {name: v for name, v in ranks.items() if v != r},
        "alpha_pattern": {name: v for name, v in alphas.items() if v != alpha},
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
        "modules_to_save": sorted({e.key.split(".")[0] for e in heads}) or None, "init_lora_weights": True,
        "layers_to_transform": None, "layers_pattern": None, "inference_mode": True,
        "base_model_name_or_path": None if base is None else str(base), "revision": None,
    }
    folder = Path(folder)
    with atomic_path(folder, overwrite) as tmp:
        tmp.mkdir()
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, tmp / WEIGHTS, metadata={"format": "pt"})
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp)
    return folder


def _number(value):
    """An alpha as JSON writes it: an int when whole (PEFT's type), else the float."""
    return int(value) if float(value).is_integer() else float(value)


def _target_modules(model, adapted) -> list:
    """The short names (q_proj, dense) when PEFT's suffix rule picks exactly the adapted modules
    from the model's projections, else the full module names."""
    short = sorted({name.rsplit(".", 1)[-1] for name in adapted})
    candidates = model.__dict__.get("_zoo_lora_projections", adapted)
    if set(lora.match(candidates, short, lora._family(model))) == set(adapted):
        return short
    return sorted(adapted)


def check_plain(model, action):
    """Refuse to write or read Hugging Face weights of a model with LoRA or quantized kernels,
    whose `Dense.kernel` is a computed tensor (merged, or integer)."""
    if lora.has_lora(model):
        raise ValueError(f"Cannot {action} a model with LoRA adapters: merge_lora() first for merged weights, "
                         "or zoo.hub.save_adapter(model, folder) for the adapters alone.")
    if any(getattr(layer, "quantization_mode", None) for layer in model._flatten_layers()):
        raise ValueError(f"Cannot {action} a quantized model: Hugging Face weights are float. Load the float base "
                         "(and its adapter: zoo.hub.load(base, adapter=folder)) instead.")
