"""Tiny Hugging Face folders written by transformers itself, with transformers'
own outputs, for `tests/zoo/test_hub.py` (which has neither torch nor transformers).

Every fixture is a randomly initialised model (fixed seed, every parameter drawn
again with a spread large enough that a transposed or swapped tensor shows),
saved with `save_pretrained(safe_serialization=True)` into `tests/fixtures/hf/<name>/`
next to `expected.npz`: the input ids, the attention mask, transformers' logits and
last hidden states on them, and the rotary inverse frequencies it uses (`inv_freq`;
per layer kind, `inv_freq_full_attention` / `inv_freq_sliding_attention`, where the
family has two). Fixtures made since issue 23 also hold `layer_inputs` [layers, B, S, H]:
the input of each layer (index 0: the embeddings' output), to find the first layer that
differs. `expected.npz` holds plain arrays only (`np.load(..., allow_pickle=False)` reads it).
Families with local layers (Qwen2/3 with use_sliding_window, Gemma 3, ModernBERT) use a
window shorter than the sequence, so that the local layers really are local.

    # a throwaway venv: torch and transformers are not keras-zoo dependencies
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch==2.13.0 transformers safetensors numpy
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py make [NAME ...]    # writes tests/fixtures/hf/ (all, or NAMEs)

    # the other direction: zoo loads each fixture and saves it again; transformers must
    # load that folder with no warning and no missing/unexpected tensor, and compute expected.npz
    python tools/make_hf_fixtures.py resave /tmp/zoo-saved [NAME ...]    # keras-zoo's venv
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py check /tmp/zoo-saved [NAME ...]

    # each fixture catches the mistakes it is for: they are injected into transformers, and the
    # logits must move by more than 1e-2 (a wrong window by one key, a missing (1 + w), ...)
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py sensitivity [NAME ...]
"""

import contextlib
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
SEED = 1234
# Fixtures made before layer_inputs was recorded: their expected.npz has no such array.
OLDER = ("llama-legacy", "llama-rope-parameters", "llama32", "bert-mlm")

LLAMA = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             hidden_act="silu", max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
GEMMA3 = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
              head_dim=16, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=256, rms_norm_eps=1e-6,
              tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
MODERNBERT = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                  hidden_activation="gelu", max_position_embeddings=256, norm_eps=1e-5, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
# name -> (transformers class, config arguments, how config.json is written, sequence length)
FIXTURES = {
    # transformers-4 era file: top-level rope_theta, "rope_scaling": null (config.json rewritten after saving)
    "llama-legacy": ("LlamaForCausalLM", dict(LLAMA, num_key_value_heads=4, rms_norm_eps=1e-5,
                                              rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                              tie_word_embeddings=False), "legacy", 40),
    # as transformers 5 writes it: "rope_parameters": {"rope_theta": ..., "rope_type": "default"}
    "llama-rope-parameters": ("LlamaForCausalLM", dict(LLAMA, num_key_value_heads=2, rms_norm_eps=1e-2,
                                                       rope_parameters={"rope_type": "default",
                                                                        "rope_theta": 500000.0},
                                                       tie_word_embeddings=False), "transformers", 40),
    # Llama 3.2 style: llama3 frequency scaling, grouped-query attention, head_dim != hidden/heads, tied head.
    # original_max_position_embeddings is 64 (8192 in Llama 3.2) so that, at head_dim 16, the 8 frequencies
    # fall in all three llama3 bands (kept, smoothed, divided by factor) within a 40-token input.
    "llama32": ("LlamaForCausalLM", dict(LLAMA, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                          "factor": 32.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 64},
                                         tie_word_embeddings=True), "transformers", 40),
    # BertForMaskedLM: the masked-LM head (cls.predictions.transform) is compared through its logits
    "bert-mlm": ("BertForMaskedLM", dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                                         hidden_act="gelu", layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0), "transformers", 12),
    # Qwen2: Llama with a bias on Q/K/V (none on O). use_sliding_window with max_window_layers=1: transformers 5
    # writes layer_types ["full_attention", "sliding_attention"]; a window of 8 keys (the query's own included).
    "qwen2": ("Qwen2ForCausalLM", dict(LLAMA, num_key_value_heads=2, rms_norm_eps=1e-6, use_sliding_window=True,
                                       sliding_window=8, max_window_layers=1,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                       tie_word_embeddings=True), "transformers", 40),
    # Qwen2.5's own files (transformers 4): top-level rope_theta, no layer_types, use_sliding_window false. The
    # sliding_window (4) is then ignored by transformers: a reader that applies it fails. One KV head, untied.
    "qwen2-legacy": ("Qwen2ForCausalLM", dict(LLAMA, num_key_value_heads=1, rms_norm_eps=1e-6,
                                              use_sliding_window=False, sliding_window=4, max_window_layers=1,
                                              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                              tie_word_embeddings=False), "legacy", 40),
    # Qwen3: per-head RMSNorm on Q and K (before RoPE), no biases, head_dim 16 != 32/4. layer_types puts the local
    # layer first while max_window_layers (28) would make both global: layer_types is what transformers obeys.
    "qwen3": ("Qwen3ForCausalLM", dict(LLAMA, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                                       use_sliding_window=True, sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"],
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                       tie_word_embeddings=True), "transformers", 40),
    # Gemma 3 text: (1 + w) RMSNorms (weights drawn around 0, as Gemma stores them), sandwich norms, Q/K norms,
    # embeddings x sqrt(32), GeGLU (gelu_pytorch_tanh), one KV head, head_dim 16, query_pre_attn_scalar 24 (not
    # head_dim, so a 1/sqrt(head_dim) scale shows), RoPE theta 1e6 global / 1e4 local, window 8. layer_types
    # [local, global, local] is no sliding_window_pattern's: a reader must take layer_types.
    "gemma3": ("Gemma3ForCausalLM", dict(GEMMA3, num_hidden_layers=3, query_pre_attn_scalar=24, sliding_window=8,
                                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                         rope_parameters={
                                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
               "transformers", 40),
    # Gemma 3's own files (transformers 4.50): rope_theta, rope_local_base_freq, sliding_window_pattern (2 here:
    # [local, global]), no layer_types; query_pre_attn_scalar = head_dim as in gemma-3-1b; window 6.
    "gemma3-legacy": ("Gemma3ForCausalLM", dict(GEMMA3, num_hidden_layers=2, query_pre_attn_scalar=16,
                                                sliding_window=6, sliding_window_pattern=2,
                                                rope_parameters={
                                                    "full_attention": {"rope_type": "default",
                                                                       "rope_theta": 500000.0},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 20000.0}}),
                      "legacy", 40),
    # ModernBERT masked LM: pre-LN without biases (none at all: norm_bias, attention_bias, mlp_bias false), no
    # attention norm in layer 0, a LayerNorm after the embeddings and a final one, GeGLU (exact gelu) from one Wi,
    # fused Wqkv, RoPE 160000 global / 10000 local, global every third layer: [global, local, local].
    # local_attention 8: a query at i sees keys j with |i - j| <= 4. Head: dense, gelu, LayerNorm; tied decoder
    # with a bias.
    "modernbert": ("ModernBertForMaskedLM", dict(MODERNBERT, num_hidden_layers=3, local_attention=8,
                                                 rope_parameters={
                                                     "full_attention": {"rope_type": "default",
                                                                        "rope_theta": 160000.0},
                                                     "sliding_attention": {"rope_type": "default",
                                                                           "rope_theta": 10000.0}}),
                   "transformers", 40),
    # ModernBERT's own files (transformers 4.48): global_rope_theta, local_rope_theta, global_attn_every_n_layers
    # (2 here: [global, local]), no layer_types; local_attention 10 (|i - j| <= 5).
    "modernbert-legacy": ("ModernBertForMaskedLM", dict(MODERNBERT, num_hidden_layers=2, local_attention=10,
                                                        global_attn_every_n_layers=2,
                                                        rope_parameters={
                                                            "full_attention": {"rope_type": "default",
                                                                               "rope_theta": 80000.0},
                                                            "sliding_attention": {"rope_type": "default",
                                                                                  "rope_theta": 20000.0}}),
                          "legacy", 40),
    # Gemma 3 4B's RoPE: the global layers' positions scaled linearly (factor 4 here; 8 in the checkpoint), the
    # local layers' not. [local, global], window 8.
    "gemma3-linear": ("Gemma3ForCausalLM", dict(GEMMA3, num_hidden_layers=2, query_pre_attn_scalar=16, sliding_window=8,
                                                layer_types=["sliding_attention", "full_attention"],
                                                rope_parameters={
                                                    "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 1000000.0},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}}),
                      "transformers", 40),
}


def inputs(name, length):
    """Fixed ids (a fresh generator per fixture), the second row right-padded by 3."""
    rng = np.random.default_rng(sum(map(ord, name)))
    ids = rng.integers(3, 128, (2, length)).astype("int64")
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    x = {"input_ids": ids, "attention_mask": mask}
    if name.startswith("bert"):
        x["token_type_ids"] = np.zeros_like(ids)
        x["token_type_ids"][:, length // 2:] = 1
    return x


def outputs(model, x, layer_inputs=True):
    """transformers' logits and last hidden states (after the final norm), the rotary inverse
    frequencies (one set per layer kind where there are two), and (layer_inputs) each layer's input."""
    import torch

    tensors = {k: torch.tensor(v) for k, v in x.items()}
    base = model.model if hasattr(model, "model") else model.bert
    layers = base.layers if hasattr(base, "layers") else base.encoder.layer
    captured = []
    hooks = [layer.register_forward_pre_hook(lambda _, args, kwargs: captured.append(
        (kwargs.get("hidden_states") if not args else args[0]).float().numpy()), with_kwargs=True)
        for layer in layers] if layer_inputs else []
    with torch.no_grad():
        result = {"logits": model(**tensors).logits.float().numpy()}
        captured.clear()  # keep the backbone call's inputs only
        result["hidden"] = base(**tensors).last_hidden_state.float().numpy()
    for hook in hooks:
        hook.remove()
    if layer_inputs:
        result["layer_inputs"] = np.stack(captured)
    rotary = getattr(base, "rotary_emb", None)
    if rotary is not None and hasattr(rotary, "inv_freq"):
        result["inv_freq"] = rotary.inv_freq.float().numpy()
    for kind in getattr(rotary, "layer_types", ()):
        result[f"inv_freq_{kind}"] = getattr(rotary, f"{kind}_inv_freq").float().numpy()
    return result


def randomise(model, seed):
    """Every parameter drawn again: norm weights N(their initial value, 0.2) (near 1, or near 0 for
    Gemma's (1 + w) norms), everything else N(0, 0.2), so that no tensor is near-symmetric or
    near-zero and a layout mistake moves the outputs far beyond 1e-4."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            is_norm = "norm" in name.lower() and name.endswith("weight")
            parameter.copy_(noise + (float(parameter.mean()) if is_norm else 0.0))


def to_legacy(folder, args):
    """Rewrite a transformers-5 config.json the way transformers 4 wrote it (as the checkpoints'
    own files on the Hub are): top-level RoPE keys, and the layer pattern as its old integer.
    Qwen2.5's files keep a sliding_window number while use_sliding_window is false (transformers
    5 writes null): the number is put back."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.get("sliding_window", 0) is None and args.get("sliding_window"):
        config["sliding_window"] = args["sliding_window"]
    rope = config.pop("rope_parameters")
    kinds = config.pop("layer_types", None)
    if config["model_type"] == "gemma3_text":
        config["rope_theta"] = rope["full_attention"]["rope_theta"]
        config["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        config["rope_scaling"] = None
        config.pop("_sliding_window_pattern", None)
        config["sliding_window_pattern"] = _period(kinds, "full_attention", last=True)
    elif config["model_type"] == "modernbert":
        config["global_rope_theta"] = rope["full_attention"]["rope_theta"]
        config["local_rope_theta"] = rope["sliding_attention"]["rope_theta"]
        config["global_attn_every_n_layers"] = _period(kinds, "full_attention", last=False)
    else:
        config["rope_theta"] = rope.pop("rope_theta")
        config["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    if "dtype" in config:
        config["torch_dtype"] = config.pop("dtype")
    else:
        config.setdefault("torch_dtype", "float32")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _period(kinds, kind, last):
    """n such that layer i is `kind` exactly when (i + 1) % n == 0 (last) or i % n == 0 (not last)."""
    for n in range(1, len(kinds) + 1):
        if all((kind == k) == (((i + 1) if last else i) % n == 0) for i, k in enumerate(kinds)):
            return n
    raise ValueError(f"layer_types {kinds} have no period")


def make(root=ROOT, names=None):
    """Write the fixtures called `names` (default all). A fixture's seed is its place in FIXTURES,
    so writing some never changes the others."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    for i, (name, (cls_name, args, style, length)) in enumerate(FIXTURES.items()):
        if names and name not in names:
            continue
        cls = getattr(transformers, cls_name)
        model = cls(cls.config_class(**args, architectures=[cls_name]))
        randomise(model, SEED + i)
        model.eval()
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        if style == "legacy":
            to_legacy(folder, args)
        reloaded = cls.from_pretrained(folder, attn_implementation="eager")  # what the folder means to transformers
        reloaded.eval()
        if style == "legacy" and hasattr(model.config, "layer_types"):  # the rewrite kept the model's meaning
            for key in ("layer_types", "rope_parameters", "sliding_window"):
                assert getattr(reloaded.config, key, None) == getattr(model.config, key, None), key
        x = inputs(name, length)
        expected = outputs(reloaded, x, layer_inputs=name not in OLDER)
        if "inv_freq" in expected and name == "llama32":
            default = 1.0 / (500000.0 ** (np.arange(0, 16, 2) / 16))
            bands = np.isclose(expected["inv_freq"], default), np.isclose(expected["inv_freq"], default / 32)
            assert bands[0].any() and bands[1].any() and not (bands[0] | bands[1]).all(), "not all llama3 bands"
        local = [k for k in getattr(reloaded.config, "layer_types", None) or () if k == "sliding_attention"]
        if local:  # the window is shorter than the sequence, so that local layers really are local
            assert reloaded.config.sliding_window < length, name
        np.savez(folder / "expected.npz", **x, **expected)
        (folder / "generation_config.json").unlink(missing_ok=True)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"{sum(f.stat().st_size for f in folder.iterdir()) / 1024:.0f} KiB -> {folder}")


def _bugs(name):
    """The mistakes a reader of fixture `name` could make, each as (label, config edit, model edit):
    what `sensitivity` injects into transformers itself to show that the fixture catches it."""
    import torch

    def window(delta):
        def edit(config):
            config.sliding_window = config.sliding_window + delta  # ModernBERT: the half window (a property)
        return edit

    def swap_thetas(config):
        rope = config.rope_parameters
        rope["full_attention"], rope["sliding_attention"] = rope["sliding_attention"], rope["full_attention"]

    def all_global(config):
        config.layer_types = ["full_attention"] * config.num_hidden_layers

    def no_offset(model):  # Gemma's RMSNorm read as w instead of (1 + w)
        for module in model.modules():
            if type(module).__name__ == "Gemma3RMSNorm":
                module.weight.data -= 1.0

    def no_embedding_scale(model):
        model.model.embed_tokens.embed_scale.fill_(1.0)

    def no_qk_norm(model):
        for layer in model.model.layers:
            layer.self_attn.q_norm, layer.self_attn.k_norm = torch.nn.Identity(), torch.nn.Identity()

    def scale_by_head_dim(config):
        config.query_pre_attn_scalar = config.head_dim

    def no_qkv_bias(model):
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.data.zero_()

    def apply_ignored_window(config):
        config.use_sliding_window, config.sliding_window = True, 4
        config.layer_types = ["full_attention"] + ["sliding_attention"] * (config.num_hidden_layers - 1)

    bugs = {
        "qwen2": [("window - 1", window(-1), None), ("window + 1", window(1), None), ("all global", all_global, None),
                  ("no Q/K/V bias", None, no_qkv_bias)],
        "qwen2-legacy": [("sliding_window applied though use_sliding_window is false", apply_ignored_window, None)],
        "qwen3": [("window - 1", window(-1), None), ("window + 1", window(1), None),
                  ("layers from max_window_layers", all_global, None), ("no Q/K norm", None, no_qk_norm)],
        "gemma3": [("window - 1", window(-1), None), ("window + 1", window(1), None), ("all global", all_global, None),
                   ("RMSNorm w, not 1 + w", None, no_offset), ("no embedding scale", None, no_embedding_scale),
                   ("1/sqrt(head_dim), not query_pre_attn_scalar", scale_by_head_dim, None),
                   ("RoPE thetas swapped", swap_thetas, None), ("no Q/K norm", None, no_qk_norm)],
        "modernbert": [("half window - 1", window(-1), None), ("half window + 1", window(1), None),
                       ("all global", all_global, None), ("RoPE thetas swapped", swap_thetas, None)],
    }
    bugs["gemma3-legacy"] = bugs["gemma3"][:3] + bugs["gemma3"][6:7]
    bugs["modernbert-legacy"] = bugs["modernbert"]
    return bugs.get(name, [])


def sensitivity(names=None):
    """Inject each of `_bugs` into transformers and print how far the logits move at real positions:
    a fixture catches a bug when that is far above the parity tolerance (1e-4)."""
    import transformers

    transformers.logging.set_verbosity_error()
    rows = []
    for name, (cls_name, _, _, _) in FIXTURES.items():
        if names and name not in names:
            continue
        cls, folder = getattr(transformers, cls_name), ROOT / name
        expected = np.load(folder / "expected.npz", allow_pickle=False)
        x = {k: expected[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in expected}
        real = x["attention_mask"].astype(bool)
        for label, edit_config, edit_model in _bugs(name):
            config = transformers.AutoConfig.from_pretrained(folder)
            if edit_config:
                edit_config(config)
            model = cls.from_pretrained(folder, config=config, attn_implementation="eager").eval()
            if edit_model:
                edit_model(model)
            got = outputs(model, x, layer_inputs=False)["logits"]
            rows.append((name, label, float(np.abs(got - expected["logits"])[real].max())))
    print(f"{'fixture':18} {'injected bug':55} {'max |logits diff|':>17}")
    for row in rows:
        print(f"{row[0]:18} {row[1]:55} {row[2]:17.3e}")
    print(json.dumps(rows))
    sys.exit(0 if all(row[2] > 1e-2 for row in rows) else 1)


def resave(out, names=None):
    """keras-zoo side of the round trip: zoo.hub.load each fixture, zoo.hub.save it to out/<name>."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from zoo import hub

    for name in names or FIXTURES:
        hub.save(hub.load(ROOT / name), Path(out) / name, overwrite=True)
        print("saved", Path(out) / name)


@contextlib.contextmanager
def transformers_warnings():
    """Yield a list that receives every warning transformers logs, or Python raises, inside the block
    (deprecation notices aside: transformers 5.24 raises some from inside PEFT that say nothing of a file)."""
    import transformers

    transformers.logging.set_verbosity_warning()
    found = []

    class Collect(logging.Handler):
        def emit(self, record):
            found.append(record.getMessage())

    handler = Collect(logging.WARNING)
    transformers.logging.get_logger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        transformers.logging.get_logger().removeHandler(handler)
    found += [str(w.message) for w in caught if not issubclass(w.category, (FutureWarning, DeprecationWarning))]


def check(out, names=None):
    """transformers side: load what zoo saved, with no warning and no missing or unexpected tensor,
    and reproduce the fixture's expected.npz. Prints a table and one JSON line."""
    import transformers

    rows = {}
    for name, (cls_name, _, _, _) in FIXTURES.items():
        if names and name not in names:
            continue
        with transformers_warnings() as found:
            model, info = getattr(transformers, cls_name).from_pretrained(
                Path(out) / name, output_loading_info=True, attn_implementation="eager")
        model.eval()
        expected = np.load(ROOT / name / "expected.npz", allow_pickle=False)
        x = {k: expected[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in expected}
        got = outputs(model, x, layer_inputs=False)
        real = x["attention_mask"].astype(bool)
        rows[name] = {
            "warnings": found,
            "loading_info": {k: sorted(map(str, v)) for k, v in info.items() if v},
            "max_abs_logits": float(np.abs(got["logits"] - expected["logits"])[real].max()),
        }
    print(f"{'fixture':24} {'warnings':>8} {'load issues':>11} {'max |logits diff|':>18}")
    for name, row in rows.items():
        print(f"{name:24} {len(row['warnings']):8d} {len(row['loading_info']):11d} {row['max_abs_logits']:18.2e}")
    print(json.dumps(rows))
    ok = all(not r["warnings"] and not r["loading_info"] and r["max_abs_logits"] < 1e-4 for r in rows.values())
    sys.exit(0 if ok else 1)


def main(make, resave, check, doc, fixtures=None, sensitivity=None):
    """The command line: `make`, `resave OUT` or `check OUT`, each with fixture NAMEs when the tool
    has `fixtures` (then the command is called with them), and `sensitivity [NAME ...]` when it has one."""
    command, arguments = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("make", [])
    names = arguments[command not in ("make", "sensitivity"):]
    if fixtures is None and names:
        sys.exit(doc)
    unknown = [n for n in names if n not in (fixtures or ())]
    if unknown:
        sys.exit(f"Unknown fixture(s) {unknown}; known: {', '.join(fixtures)}.")
    named = {"names": names} if fixtures is not None else {}
    if command == "make":
        make(**named)
    elif command == "sensitivity" and sensitivity is not None:
        sensitivity(names)
    elif command in ("resave", "check") and arguments:
        (resave if command == "resave" else check)(arguments[0], **named)
    else:
        sys.exit(doc)


if __name__ == "__main__":
    main(make, resave, check, __doc__, FIXTURES, sensitivity)
