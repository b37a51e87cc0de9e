"""Qwen2/Qwen2.5 and Qwen3 in Hugging Face format: `Qwen2Config`/`Qwen3Config` <-> `ModelSpec`.
Both are Llama with a difference (Qwen2: a bias on Q/K/V; Qwen3: a per-head RMSNorm on Q and K
and an independent head_dim) and optional sliding windows; their tensors are Llama's names plus
those (zoo.hub.llama's weight map writes them). `QWEN2` and `QWEN3` are the two family entries
zoo.hub registers (see `zoo/hub/__init__.py` for what an entry exposes)."""

from __future__ import annotations

from zoo.hub import llama
from zoo.hub.config import decoder_config, decoder_sizes, layer_kinds, layer_types, refuse
from zoo.registry import ModelSpec


class _Qwen:
    BASE_PREFIX, DERIVED, KNOWN_HEADS, LEGACY_NAMES = llama.BASE_PREFIX, llama.DERIVED, llama.KNOWN_HEADS, {}

    def __init__(self, family, name, head_dim):
        self.FAMILY = self.MODEL_TYPE = family
        self.ARCHITECTURES = {f"{name}Model": "backbone", f"{name}ForCausalLM": "causal_lm"}
        self.DEFAULT_ARCHITECTURE = f"{name}ForCausalLM"
        self.head_dim = head_dim  # transformers' default when config.json has none (Qwen3: 128)

    def spec_from_config(self, config: dict) -> ModelSpec:
        """The `ModelSpec` of a Qwen config in either format: `layer_types` (transformers 5) or
        `use_sliding_window` + `max_window_layers` (the checkpoints' own; a `sliding_window` there is
        ignored unless `use_sliding_window` is true, as transformers ignores it); refusing by name what
        the zoo does not compute."""
        refuse(config, "hidden_act", ("silu",), "Qwen's MLP is SwiGLU")
        if self.FAMILY == "qwen3":
            refuse(config, "attention_bias", (False,), "it would add a bias to Q, K, V and O")
        theta, scaling = llama.rope_from_config(config)
        if scaling is not None:
            raise ValueError(f"rope_type={scaling['rope_type']!r} is not supported for {self.FAMILY}; zoo computes "
                             "rope_type 'default' here.")
        window = config.get("sliding_window") if config.get("use_sliding_window", False) else None
        first_local = config.get("max_window_layers", 28)
        kinds = layer_kinds(config, lambda i: "local" if window is not None and i >= first_local else "global")
        if "local" in kinds and not window:
            raise ValueError(f"layer_types has sliding_attention layers but the window is "
                             f"{config.get('sliding_window')!r} with use_sliding_window="
                             f"{config.get('use_sliding_window', False)}; set use_sliding_window and a sliding_window.")
        local = "local" in kinds
        return ModelSpec(family=self.FAMILY, rope_theta=theta, layer_kinds=kinds,
                         sliding_window=window if local else None,
                         **decoder_sizes(config, head_dim=self.head_dim, max_positions=32768))

    def config_from_spec(self, spec: ModelSpec, task: str, num_classes: int | None = None) -> dict:
        """The config transformers 5 builds the same model from: `layer_types`, with
        `use_sliding_window`, `sliding_window` and `max_window_layers` saying the same where the
        older keys can (local layers from some index on); transformers 5 obeys `layer_types`."""
        kinds = [spec.layer_kind(i) for i in range(spec.num_layers)]
        first_local = kinds.index("local") if "local" in kinds else spec.num_layers
        config = {**decoder_config(spec, self.MODEL_TYPE), "hidden_act": "silu",
                  "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
                  "use_sliding_window": spec.sliding_window is not None, "sliding_window": spec.sliding_window,
                  "max_window_layers": first_local, "layer_types": layer_types(spec)}
        if self.FAMILY == "qwen3":
            config["attention_bias"] = False
        return config

    def weight_map(self, model):
        return llama.weight_map(model)


QWEN2 = _Qwen("qwen2", "Qwen2", head_dim=None)
QWEN3 = _Qwen("qwen3", "Qwen3", head_dim=128)
