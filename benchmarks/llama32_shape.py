"""Full-size checkpoint shapes through zoo.hub: a transformers-5-style folder (random bfloat16
weights) per model, loaded with `zoo.hub.load`, then a short forward pass.

    python benchmarks/llama32_shape.py [--models llama3.2-1b,gemma3-1b] [--tokens 32] [--dtype float32]
    python benchmarks/llama32_shape.py --tiny      # smoke: every shape shrunk to 2 layers, hidden 64

Shapes: `llama3.2-1b` (Meta's Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim
64, intermediate 8192, vocab 128256, tied, rope_theta 500000 with llama3 scaling) and the registered
qwen2.5-0.5b, qwen3-0.6b, gemma3-1b, modernbert-base and modernbert-large, whose config.json is
`zoo.hub.config_from_spec` (what `tools/make_hf_fixtures.py check` showed transformers reloads). The
tensor names and shapes are written here from transformers' modeling code (docs/families.md), not
from zoo, and their sum must equal transformers' own count (tools/hf_param_counts.py) and the loaded
model's. The safetensors file is streamed to disk tensor by tensor (numpy only, no torch). Prints a
table row per model and one JSON line: parameters, write, load and forward times, peak RSS (the
process's, so run one model per process to read each one's), TensorFlow's allocator peak.
Outside CI: gemma3-1b needs ~2 GB of disk and ~10 GB of memory at float32.
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


# transformers 5.24 on the meta device, each from its config.json (tools/hf_param_counts.py); Llama-3.2-1B's
# by hand: 128256·2048 + 16·(2·2048² + 2·512·2048 + 3·8192·2048 + 2·2048) + 2048 (tied)
TRANSFORMERS_PARAMS = {"llama3.2-1b": 1_235_814_400, "qwen2.5-0.5b": 494_032_768, "qwen3-0.6b": 596_049_920,
                       "gemma3-1b": 999_885_952, "modernbert-base": 149_655_232, "modernbert-large": 395_881_664}
TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=96, vocab_size=256)


def model_config(name, tiny=False):
    """The transformers-5 config.json of a shape (a causal LM, or ModernBERT's masked LM)."""
    import zoo
    from zoo import hub

    if name == "llama3.2-1b":
        config = dict(CONFIG)
        if tiny:
            config.update(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        return config
    spec = zoo.spec(name)
    if tiny:
        spec = spec.replace(**TINY, head_dim=16 if spec.head_dim * spec.num_heads != spec.hidden_dim else None,
                            num_kv_heads=min(spec.num_kv_heads, 2))
    return hub.config_from_spec(spec, "masked_lm" if name.startswith("modernbert") else "causal_lm",
                                dtype="bfloat16")


def tensor_shapes(config):
    """The tensors transformers saves for the config's model (tied: no lm_head / decoder weight), in file order."""
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    if config["model_type"] == "modernbert":
        shapes = {"model.embeddings.tok_embeddings.weight": (v, h), "model.embeddings.norm.weight": (h,)}
        for i in range(config["num_hidden_layers"]):
            p = f"model.layers.{i}"
            if i:  # layer 0 has no attention norm
                shapes[f"{p}.attn_norm.weight"] = (h,)
            shapes.update({f"{p}.attn.Wqkv.weight": (3 * h, h), f"{p}.attn.Wo.weight": (h, h),
                           f"{p}.mlp_norm.weight": (h,), f"{p}.mlp.Wi.weight": (2 * f, h),
                           f"{p}.mlp.Wo.weight": (h, f)})
        shapes.update({"model.final_norm.weight": (h,), "head.dense.weight": (h, h), "head.norm.weight": (h,),
                       "decoder.bias": (v,)})
        return shapes
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    kind = config["model_type"]
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
                       f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q)})
        if kind == "qwen2":
            shapes.update({f"{p}.self_attn.q_proj.bias": (q,), f"{p}.self_attn.k_proj.bias": (kv,),
                           f"{p}.self_attn.v_proj.bias": (kv,)})
        if kind in ("qwen3", "gemma3_text"):
            shapes.update({f"{p}.self_attn.q_norm.weight": (d,), f"{p}.self_attn.k_norm.weight": (d,)})
        shapes.update({f"{p}.mlp.gate_proj.weight": (f, h), f"{p}.mlp.up_proj.weight": (f, h),
                       f"{p}.mlp.down_proj.weight": (h, f),
                       f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,)})
        if kind == "gemma3_text":
            shapes.update({f"{p}.pre_feedforward_layernorm.weight": (h,),
                           f"{p}.post_feedforward_layernorm.weight": (h,)})
    shapes["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = (v, h)
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


def run(name, args):
    """One shape: write its folder, load it, run a forward pass; a result dict."""
    import numpy as np
    import tensorflow as tf
    from safetensors import safe_open

    from zoo import hub

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp) / name
        folder.mkdir(parents=True, exist_ok=True)
        config = model_config(name, args.tiny)
        start = time.perf_counter()
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        shapes = tensor_shapes(config)
        file_bytes = write_safetensors(folder / "model.safetensors", shapes)
        write_s = time.perf_counter() - start
        file_params = sum(int(np.prod(shape)) for shape in shapes.values())
        rss_before = rss_gib()

        tf.config.experimental.reset_memory_stats("CPU:0")
        start = time.perf_counter()
        model = hub.load(folder, dtype=args.dtype)
        load_s = time.perf_counter() - start
        rss_loaded, tf_peak_load = rss_gib(), tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**30

        embedding = next(key for key in shapes if "embed" in key)
        with safe_open(folder / "model.safetensors", framework="numpy") as f:  # spot-check: bits arrived
            rows = f.get_slice(embedding)[:4].astype("float32")
        loaded_ok = bool(np.array_equal(np.asarray(model.backbone.token_embedding.embeddings[:4], "float32"), rows))

        ids = np.random.default_rng(1).integers(0, config["vocab_size"], (1, args.tokens)).astype("int32")
        x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
        if model.task == "masked_lm":
            x["mask_positions"] = np.arange(min(4, args.tokens), dtype="int32")[None]
        start = time.perf_counter()
        logits = np.asarray(model(x)["logits"])
        forward_s = time.perf_counter() - start
        spec = model.spec
    expected = None if args.tiny else TRANSFORMERS_PARAMS[name]
    return {
        "shape": name, "dtype": args.dtype, "tiny": args.tiny, "params": model.count_params(),
        "params_in_file": file_params, "transformers_params": expected,
        "params_equal": model.count_params() == file_params and expected in (None, file_params),
        "safetensors_gib": round(file_bytes / 2**30, 2), "head_dim": spec.head_dim, "num_kv_heads": spec.num_kv_heads,
        "layer_kinds": list(spec.layer_kinds), "sliding_window": spec.sliding_window,
        "write_seconds": round(write_s, 1), "load_seconds": round(load_s, 1),
        "forward_seconds": round(forward_s, 2), "tokens": args.tokens,
        "rss_before_load_gib": round(rss_before, 2), "rss_after_load_gib": round(rss_loaded, 2),
        "peak_rss_gib": round(rss_gib(peak=True), 2), "tf_allocator_peak_during_load_gib": round(tf_peak_load, 2),
        "weights_spot_check_exact": loaded_ok, "logits_shape": list(logits.shape),
        "logits_finite": bool(np.isfinite(logits).all()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(TRANSFORMERS_PARAMS), help="comma-separated shapes")
    parser.add_argument("--tokens", type=int, default=32, help="forward pass length (batch 1)")
    parser.add_argument("--dtype", default="float32", help="the zoo model's dtype policy")
    parser.add_argument("--keep", help="write the folders here and keep them (default: a temp folder)")
    parser.add_argument("--tiny", action="store_true", help="smoke test: each shape shrunk to 2 layers, hidden 64")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(TRANSFORMERS_PARAMS))
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(TRANSFORMERS_PARAMS)}")

    import zoo

    print(f"zoo.hub.load of random bf16 folders (dtype {args.dtype}); zoo at {Path(zoo.__file__).parent}")
    print("| shape | params (= file = transformers) | bf16 GiB | write s | load s | forward s | RSS after load | "
          "peak RSS | TF peak during load |\n|---|---|---|---|---|---|---|---|---|")
    results = []
    for name in args.models.split(","):
        r = run(name, args)
        results.append(r)
        print(f"| {name} | {r['params']:,} ({'equal' if r['params_equal'] else 'DIFFERENT'}) | "
              f"{r['safetensors_gib']} | {r['write_seconds']} | {r['load_seconds']} | {r['forward_seconds']} | "
              f"{r['rss_after_load_gib']} | {r['peak_rss_gib']} | {r['tf_allocator_peak_during_load_gib']} |",
              flush=True)
    print(json.dumps({"benchmark": "checkpoint_shapes", "results": results}))
    return 0 if all(r["params_equal"] and r["weights_spot_check_exact"] and r["logits_finite"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
