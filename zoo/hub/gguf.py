"""llama.cpp GGUF files -> Hugging Face folders, so that the quantised checkpoints
people ship as GGUF load into zoo models through the one Hugging Face path.

The tensors are dequantised to float32 with the `gguf` package, renamed to
`LlamaForCausalLM`'s names, and the query/key rows are put back in Hugging Face's
order: llama.cpp's converter permutes them (its rope rotates adjacent pairs of
dimensions, Hugging Face rotates the two halves of each head).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zoo import reading
from zoo.files import atomic_path
from zoo.hub import llama
from zoo.hub.weights import WEIGHTS
from zoo.registry import ModelSpec

# GGUF tensor name (or its block part) -> Hugging Face name; zoo.hub.gguf_writer inverts it.
GGUF_NAMES = {
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


def _field(reader, key, default=None):
    return reader.fields[key].contents() if key in reader.fields else default


def convert_gguf(gguf_path, folder, overwrite=False) -> Path:
    """Write a llama-architecture GGUF file as a Hugging Face `LlamaForCausalLM` folder,
    so that `zoo.hub.load` (and transformers) can use weights shipped as GGUF.

    Any quantisation the `gguf` package dequantises is accepted; the folder holds
    config.json, float32 model.safetensors and a byte-level BPE tokenizer.json. The
    folder is written atomically: an earlier one survives until the new one is complete.

    Args:
        gguf_path: a `.gguf` file with `general.architecture` "llama".
        folder: the Hugging Face folder to write.
        overwrite: replace an existing `folder` (else FileExistsError).

    Returns:
        `folder` as a `Path`.

    Example:
    >>> folder = convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2/")
    >>> zoo.get("dec-base", weights=folder)
    """
    import gguf
    from safetensors.numpy import save_file

    with reading.parsed_by_library(gguf_path, "a GGUF file"):
        reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path} is a {arch!r} GGUF; only 'llama' GGUF files convert to a zoo model.")
    heads, kv_heads = _field(reader, "llama.attention.head_count"), _field(reader, "llama.attention.head_count_kv")
    hidden = _field(reader, "llama.embedding_length")
    head_dim = _field(reader, "llama.attention.key_length", hidden // heads)
    if _field(reader, "llama.rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{gguf_path}: rope over {_field(reader, 'llama.rope.dimension_count')} of {head_dim} "
                         "head dimensions (partial rotary) is not supported.")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(f"{gguf_path} holds llama.cpp's rope_freqs (Llama 3.1+ frequency scaling), whose "
                         "rope_parameters the GGUF does not record; load the original Hugging Face folder instead.")
    unknown = sorted(n for n in names if (n.split(".")[2] if n.startswith("blk.") else n) not in GGUF_NAMES)
    if unknown:
        raise ValueError(f"{gguf_path}: tensors {unknown[:5]} have no place in a Llama model.")
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
            name = f"model.layers.{layer}.{GGUF_NAMES[part]}.{kind}"
        else:
            name = GGUF_NAMES[name]
        tensors[name] = np.ascontiguousarray(weight)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    spec = ModelSpec(
        family="llama", vocab_size=len(tokens), num_layers=_field(reader, "llama.block_count"), hidden_dim=hidden,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_dim=_field(reader, "llama.feed_forward_length"),
        max_sequence_length=_field(reader, "llama.context_length"),
        layer_norm_epsilon=float(f"{_field(reader, 'llama.attention.layer_norm_rms_epsilon'):.6g}"),  # a float32
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        tie_embeddings="lm_head.weight" not in tensors,
    )
    config = {
        "architectures": ["LlamaForCausalLM"], **llama.config_from_spec(spec, "causal_lm"),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"), "dtype": "float32",
    }
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path}: only byte-level BPE ('gpt2') GGUF tokenizers are converted.")
    types = _field(reader, "tokenizer.ggml.token_type")
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    # every field of tokenizers' AddedToken: the `tokenizers` library (transformers' fast tokenizers) refuses fewer
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for i, (t, k) in enumerate(zip(tokens, types)) if k == 3]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level}, "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": list(_field(reader, "tokenizer.ggml.merges"))},
    }
    folder = Path(folder)
    with atomic_path(folder, overwrite) as tmp:
        tmp.mkdir()
        save_file(tensors, tmp / WEIGHTS, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(reader), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return folder


def tokenizer_config(reader) -> dict:
    """The special tokens and chat template a GGUF file (a `gguf.GGUFReader`) records, as
    transformers keeps them in tokenizer_config.json, so that a chat checkpoint converts with its
    template (zoo.chat)."""
    tokens, config = _field(reader, "tokenizer.ggml.tokens") or [], {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        index = _field(reader, f"tokenizer.ggml.{key}_token_id")
        if index is not None and index < len(tokens):
            config[name] = tokens[index]
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config
