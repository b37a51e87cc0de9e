"""The full-size Llama-3.2-1B shape through zoo.hub: a transformers-5-style folder
(random bfloat16 weights) loaded with `zoo.hub.load`, then a short forward pass.

    python benchmarks/llama32_shape.py [--tokens 32] [--dtype float32] [--keep DIR]

The folder is what Meta's Llama-3.2-1B holds in shape and config: hidden 2048, 16
layers, 32 heads, 8 KV heads (head_dim 64), intermediate 8192, vocab 128256, tied
embeddings, rope_theta 500000 with llama3 scaling (factor 32, low 1, high 4, original
8192), written as transformers 5 writes it (`rope_parameters`). The safetensors file
is streamed to disk tensor by tensor (numpy only, no torch), so writing it needs
about one chunk of memory. Prints a table and one JSON line: write, load and
forward times, peak RSS, TensorFlow's allocator peak and the logits' shape.
Outside CI: it needs ~3 GB of disk and ~8 GB of memory at float32.
"""

import argparse
import json
import os
import resource
import struct
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo, not an installed one

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
    "initializer_range": 0.02, "bos_token_id": 128000, "eos_token_id": 128001, "dtype": "bfloat16",
}
CHUNK = 1 << 24  # elements generated and written at a time


def tensor_shapes(config):
    """The tensors of LlamaForCausalLM (tied: no lm_head), in file order."""
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes.update({
            f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (f, h), f"{p}.mlp.up_proj.weight": (f, h),
            f"{p}.mlp.down_proj.weight": (h, f),
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
        })
    shapes["model.norm.weight"] = (h,)
    return shapes


def write_safetensors(path, shapes, seed=0):
    """A bfloat16 safetensors file written tensor by tensor, chunk by chunk: N(0, 0.02)
    weights, norms 1 + N(0, 0.02). Only one chunk is in memory at a time."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(seed)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in shapes.items():
            total = int(np.prod(shape))
            for start in range(0, total, CHUNK):
                chunk = rng.standard_normal(min(CHUNK, total - start), dtype=np.float32) * 0.02
                if name.endswith("norm.weight"):
                    chunk += 1.0
                f.write(chunk.astype(ml_dtypes.bfloat16).tobytes())
    return offset + len(blob) + 8


def rss_gib(peak=False):
    if peak:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="forward pass length (batch 1)")
    parser.add_argument("--dtype", default="float32", help="the zoo model's dtype policy")
    parser.add_argument("--keep", help="write the folder here and keep it (default: a temp folder)")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    from safetensors import safe_open

    import zoo
    from zoo import hub

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or Path(tmp) / "Llama-3.2-1B-shape")
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
        shapes = tensor_shapes(CONFIG)
        file_bytes = write_safetensors(folder / "model.safetensors", shapes)
        write_s = time.perf_counter() - start
        rss_before = rss_gib()

        tf.config.experimental.reset_memory_stats("CPU:0")
        start = time.perf_counter()
        model = hub.load(folder, dtype=args.dtype)
        load_s = time.perf_counter() - start
        rss_loaded, tf_peak_load = rss_gib(), tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**30

        with safe_open(folder / "model.safetensors", framework="numpy") as f:  # spot-check: bits arrived
            norm = f.get_tensor("model.norm.weight").astype("float32")
            rows = f.get_slice("model.embed_tokens.weight")[:4].astype("float32")
        backbone = model.backbone
        loaded_ok = bool(np.array_equal(np.asarray(backbone.final_norm.scale, "float32"), norm)
                         and np.array_equal(np.asarray(backbone.token_embedding.embeddings[:4], "float32"), rows))

        ids = np.random.default_rng(1).integers(0, CONFIG["vocab_size"], (1, args.tokens)).astype("int32")
        x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
        start = time.perf_counter()
        logits = np.asarray(model(x)["logits"])
        forward_s = time.perf_counter() - start
        spec = model.spec

    result = {
        "shape": "Llama-3.2-1B", "zoo": str(Path(zoo.__file__).parent), "dtype": args.dtype,
        "params": spec.num_params(), "safetensors_gib": round(file_bytes / 2**30, 2),
        "rope_theta": spec.rope_theta, "rope_scaling": dict(spec.rope_scaling or ()),
        "head_dim": spec.head_dim, "num_kv_heads": spec.num_kv_heads, "tie_embeddings": spec.tie_embeddings,
        "write_seconds": round(write_s, 1), "load_seconds": round(load_s, 1),
        "forward_seconds": round(forward_s, 2), "tokens": args.tokens,
        "rss_before_load_gib": round(rss_before, 2), "rss_after_load_gib": round(rss_loaded, 2),
        "peak_rss_gib": round(rss_gib(peak=True), 2), "tf_allocator_peak_during_load_gib": round(tf_peak_load, 2),
        "weights_spot_check_exact": loaded_ok, "logits_shape": list(logits.shape),
        "logits_finite": bool(np.isfinite(logits).all()), "logits_std": round(float(logits.std()), 4),
    }
    print(f"Llama-3.2-1B shape ({result['params'] / 1e9:.3f}B params, {result['safetensors_gib']} GiB bf16 "
          f"safetensors) -> zoo.hub.load (dtype {args.dtype})")
    print("| step | seconds | RSS after (GiB) |\n|---|---|---|")
    print(f"| write config.json + safetensors (streamed) | {result['write_seconds']} | "
          f"{result['rss_before_load_gib']} |")
    print(f"| zoo.hub.load (build + stream weights) | {result['load_seconds']} | {result['rss_after_load_gib']} |")
    print(f"| forward, batch 1 x {args.tokens} tokens | {result['forward_seconds']} | - |")
    print(f"peak RSS {result['peak_rss_gib']} GiB; TF allocator peak during load "
          f"{result['tf_allocator_peak_during_load_gib']} GiB; logits {tuple(result['logits_shape'])}, finite "
          f"{result['logits_finite']}; weights spot check exact: {loaded_ok}")
    print(f"spec: rope_theta {spec.rope_theta}, rope_scaling {result['rope_scaling']}, head_dim {spec.head_dim}, "
          f"kv heads {spec.num_kv_heads}, tied {spec.tie_embeddings}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
