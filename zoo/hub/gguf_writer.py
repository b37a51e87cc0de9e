"""zoo Llama decoders -> llama.cpp GGUF files (llama.cpp, Ollama, LM Studio).

The file is what llama.cpp's `convert_hf_to_gguf.py` writes for the `LlamaForCausalLM`
folder `zoo.hub.save` would write (its `LlamaModel` class), through the `gguf`
package's writer and quantizers:

- tensor names `token_embd`, `blk.N.attn_q`, ... `output_norm`, `output` (absent when
  the head is tied), the inverse of `zoo.hub.gguf.GGUF_NAMES`;
- query and key rows permuted per head (`LlamaModel.permute`: llama.cpp's rope
  rotates adjacent pairs of dimensions, Hugging Face the two halves of each head;
  keys use the KV-head count);
- 1-D tensors and norms in F32, every other tensor in the file type, F16 where a
  row is not a whole number of quantization blocks (the converter's fallback);
- `llama.*` hyperparameters as `TextModel.set_gguf_parameters` writes them, and a
  llama3 `rope_scaling` as the `rope_freqs` tensor (`generate_extra_tensors`);
- a byte-level BPE tokenizer as `_set_vocab_gpt2`: model "gpt2", tokens (padded to
  the model's vocabulary with `[PADi]`, type UNUSED), token types (CONTROL for
  special tokens), merges, bos/eos ids.

One deliberate difference: the converter names the pre-tokenizer by hashing how the
tokenizer splits a test string and refuses vocabularies it does not know. keras-hub's
`BytePairTokenizer` splits with GPT-2's pattern, so the file says "gpt-2".

Tensors are quantized and written one at a time (`GGUFWriter.add_tensor_info`, then
`write_tensor_data`), so writing needs about one float32 tensor beyond the model.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.files import atomic_path, check_target
from zoo.hub import llama
from zoo.hub.gguf import GGUF_NAMES

log = logging.getLogger("zoo.hub")

# --quantize name -> (GGML tensor type, llama.cpp file type), named as convert_hf_to_gguf's --outtype.
QUANTIZATIONS = ("q8_0", "f16", "f32")
_HF_TO_GGUF = {hf: gguf for gguf, hf in GGUF_NAMES.items()}
PRE_TOKENIZER = "gpt-2"


def _types(quantize):
    import gguf

    q, f = gguf.GGMLQuantizationType, gguf.LlamaFileType
    return {"q8_0": (q.Q8_0, f.MOSTLY_Q8_0), "f16": (q.F16, f.MOSTLY_F16), "f32": (q.F32, f.ALL_F32)}[quantize]


def permute(weight, heads):
    """llama.cpp's Q/K row order from Hugging Face's (convert_hf_to_gguf `LlamaModel.permute`)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def gguf_name(key: str) -> str:
    """A Llama weight-map key ("layers.0.self_attn.q_proj.weight") -> its GGUF name ("blk.0.attn_q.weight")."""
    if key.startswith("layers."):
        _, layer, rest = key.split(".", 2)
        part, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{_HF_TO_GGUF[part]}.{kind}"
    return _HF_TO_GGUF["lm_head.weight" if key == "lm_head.weight" else llama.BASE_PREFIX + key]


def rope_factors(spec) -> np.ndarray:
    """llama3 frequency scaling as llama.cpp stores it (`rope_freqs`: each frequency is divided
    by its factor), computed as convert_hf_to_gguf's `LlamaModel.generate_extra_tensors` does."""
    scaling = dict(spec.rope_scaling)
    dim = spec.head_dim
    freqs = (1.0 / (spec.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))).astype(np.float32)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


@dataclass
class _Tensor:
    name: str
    shape: tuple
    qtype: object
    read: object  # () -> float32 numpy array in Hugging Face layout, already permuted


def _tensors(model, qtype) -> list[_Tensor]:
    """Every tensor of the file, in writing order, with its GGML type (as the converter's
    `prepare_tensors` chooses it) and a function that reads it when it is written."""
    import gguf

    spec = model.spec
    out = []
    if spec.rope_scaling:
        factors = rope_factors(spec)
        out.append(_Tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors.shape,
                           gguf.GGMLQuantizationType.F32, lambda f=factors: f))
    for entry in llama.weight_map(model):
        name = gguf_name(entry.key)
        shape = tuple(entry.variable.shape[::-1] if entry.transpose else entry.variable.shape)
        heads = spec.num_heads if ".attn_q." in name else spec.num_kv_heads if ".attn_k." in name else None

        def read(entry=entry, heads=heads):
            array = np.asarray(entry.variable.numpy()).astype(np.float32)
            array = array.T if entry.transpose else array
            return np.ascontiguousarray(permute(array, heads) if heads else array)

        kind = qtype
        if len(shape) <= 1 or name.endswith("_norm.weight"):
            kind = gguf.GGMLQuantizationType.F32
        elif kind not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) and \
                shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
            log.warning("%s: rows of %d are not whole %s blocks; written as F16", name, shape[-1], kind.name)
            kind = gguf.GGMLQuantizationType.F16
        out.append(_Tensor(name, shape, kind, read))
    return out


def _tokenizer_fields(tokenizer, vocab_size, bos_token_id, eos_token_id) -> dict:
    """The tokenizer metadata of a byte-level BPE vocabulary (convert_hf_to_gguf `_set_vocab_gpt2`)."""
    import gguf
    import keras_hub

    if not isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer):
        raise ValueError(f"GGUF export writes byte-level BPE tokenizers (keras-hub BytePairTokenizer); got "
                         f"{type(tokenizer).__name__}. Load the model from a Hugging Face folder with vocab.json and "
                         "merges.txt (zoo.hub.load) or pass tokenizer=.")
    vocabulary = dict(tokenizer.vocabulary)
    if max(vocabulary.values()) >= vocab_size:
        raise ValueError(f"The tokenizer has ids up to {max(vocabulary.values())}, but the model's vocabulary is "
                         f"{vocab_size}; pass the tokenizer the model was trained with.")
    by_id = {i: token for token, i in vocabulary.items()}
    special = set(tokenizer.unsplittable_tokens or ())
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if by_id[i] in special else gguf.TokenType.NORMAL)
    bos = bos_token_id if bos_token_id is not None else getattr(tokenizer, "start_token_id", None)
    eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "end_token_id", None)
    for what, token_id in (("bos_token_id", bos), ("eos_token_id", eos)):
        if token_id is not None and not 0 <= token_id < vocab_size:
            raise ValueError(f"{what}={token_id} is outside the vocabulary (0..{vocab_size - 1}).")
    return {"tokens": tokens, "types": types, "merges": list(tokenizer.merges), "bos": bos, "eos": eos,
            "add_space_prefix": bool(tokenizer.add_prefix_space)}


def check_model(model):
    """Refuse what llama.cpp's `llama` architecture cannot run from a zoo model, naming why."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError(f"{type(model).__name__} is not a zoo model; GGUF export takes zoo.get('dec-...') or a model "
                         "loaded with zoo.hub.load.")
    if spec.family != "llama":
        raise ValueError(f"GGUF export takes Llama-family decoders (dec-*); {model.name!r} is a {spec.family!r} "
                         "model, which llama.cpp's 'llama' architecture cannot run. Export it as a SavedModel, "
                         ".tflite or Hugging Face folder (zoo.hub.save).")
    if model.task != "causal_lm":
        raise ValueError(f"GGUF export takes a causal language model; got task {model.task!r}. Build it with "
                         "task='causal_lm' (a bare backbone has no LM head for llama.cpp to generate with).")
    quantized = [layer.name for layer in model._flatten_layers(include_self=False)
                 if getattr(layer, "quantization_mode", None)]
    if quantized:
        raise ValueError(f"{model.name!r} holds Keras-quantized layers (e.g. {quantized[0]!r}): GGUF export writes "
                         "float weights and quantizes them itself (q8_0). Export the float model (a LoRA run: "
                         "`zoo export RUN --format gguf` merges its adapters into the float base).")


def write_gguf(model, path, quantize="q8_0", tokenizer=None, bos_token_id=None, eos_token_id=None, name=None,
               overwrite=False) -> Path:
    """Write a zoo Llama decoder as a llama.cpp GGUF file (llama.cpp, Ollama, LM Studio).

    Args:
        model: a zoo causal LM of the Llama family (`zoo.get("dec-...")`, `zoo.hub.load`).
        path: the `.gguf` file, written atomically (an earlier file survives a failure).
        quantize: "q8_0" (8-bit blocks of 32, ~1.06 bytes per weight), "f16" or "f32".
            Norms and other 1-D tensors stay F32, as llama.cpp's converter writes them.
        tokenizer: a keras-hub `BytePairTokenizer`; default `model.tokenizer`. Required:
            a GGUF file carries its vocabulary.
        bos_token_id, eos_token_id: the special ids llama.cpp uses; default the
            tokenizer's `start_token_id` / `end_token_id` when it has them, else omitted.
        name: `general.name`; default the model's name.
        overwrite: replace an existing file.

    Returns:
        `path` as a `Path`.

    Example:
    >>> model = zoo.hub.load("smollm2/")
    >>> write_gguf(model, "smollm2-q8_0.gguf", eos_token_id=2)
    """
    import gguf

    check_model(model)
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Unknown GGUF quantization {quantize!r}; use one of {', '.join(QUANTIZATIONS)}.")
    path = Path(path)
    if path.suffix != ".gguf":
        raise ValueError(f"A GGUF file name must end in .gguf, got {str(path)!r}.")
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("A GGUF file carries its tokenizer, and this model has none: load it from a Hugging Face "
                         "folder with tokenizer files (zoo.hub.load) or pass tokenizer= (a BytePairTokenizer).")
    spec = model.spec
    vocab = _tokenizer_fields(tokenizer, spec.vocab_size, bos_token_id, eos_token_id)
    check_target(path, overwrite)
    qtype, file_type = _types(quantize)
    tensors = _tensors(model, qtype)
    with atomic_path(path, overwrite) as tmp:
        writer = gguf.GGUFWriter(str(tmp), "llama")
        try:
            for t in tensors:
                byte_shape = gguf.quants.quant_shape_to_byte_shape(t.shape, t.qtype) if t.qtype not in (
                    gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else t.shape
                dtype = np.float32 if t.qtype == gguf.GGMLQuantizationType.F32 else \
                    np.float16 if t.qtype == gguf.GGMLQuantizationType.F16 else np.uint8
                writer.add_tensor_info(t.name, byte_shape, np.dtype(dtype), int(np.prod(byte_shape)) *
                                       np.dtype(dtype).itemsize, raw_dtype=t.qtype)
            # metadata in the converter's order: type, name, hyperparameters, quantization version, vocabulary
            writer.add_type(gguf.GGUFType.MODEL)
            writer.add_name(name or model.name)
            total = sum(int(np.prod(t.shape)) for t in tensors if not t.name.startswith("rope_freqs"))
            writer.add_size_label(gguf.size_label(total, 0, 0, 0))
            writer.add_block_count(spec.num_layers)
            writer.add_context_length(spec.max_sequence_length)
            writer.add_embedding_length(spec.hidden_dim)
            writer.add_feed_forward_length(spec.intermediate_dim)
            writer.add_head_count(spec.num_heads)
            writer.add_head_count_kv(spec.num_kv_heads)
            writer.add_rope_freq_base(spec.rope_theta)
            writer.add_layer_norm_rms_eps(spec.layer_norm_epsilon)
            writer.add_key_length(spec.head_dim)
            writer.add_value_length(spec.head_dim)
            writer.add_file_type(file_type)
            writer.add_vocab_size(spec.vocab_size)
            writer.add_rope_dimension_count(spec.head_dim)
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            writer.add_add_space_prefix(vocab["add_space_prefix"])
            writer.add_tokenizer_model("gpt2")
            writer.add_tokenizer_pre(PRE_TOKENIZER)
            writer.add_token_list(vocab["tokens"])
            writer.add_token_types(vocab["types"])
            writer.add_token_merges(vocab["merges"])
            if vocab["bos"] is not None:
                writer.add_bos_token_id(vocab["bos"])
            if vocab["eos"] is not None:
                writer.add_eos_token_id(vocab["eos"])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t in tensors:
                writer.write_tensor_data(gguf.quants.quantize(t.read(), t.qtype))
        finally:
            writer.close()
    return path
