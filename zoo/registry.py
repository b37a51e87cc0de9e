"""Named model specs: the ladder of shapes the zoo builds, as data.

A `ModelSpec` is everything needed to build a model and to reason about it
without building it (parameter count, memory). Specs are frozen so that a
registered name always means the same shape; `spec.replace(...)` derives a
variant (tests shrink models this way) and validates it before anything is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zoo import shapes

FAMILIES = ("bert", "llama")
# The fields that fix the weights' shapes (dropout, epsilon and the like do not).
SHAPE_FIELDS = ("family", "vocab_size", "num_layers", "hidden_dim", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_dim", "max_sequence_length", "tie_embeddings")
# Keras dtype policies a model can be built with; "mixed_*" keep float32 weights.
PRECISIONS = ("float32", "bfloat16", "float16", "mixed_bfloat16", "mixed_float16")


@dataclass(frozen=True)
class ModelSpec:
    """The shape and numerics of one Transformer.

    `family="bert"`: post-LN encoder, learned positions, token types, GELU, biases
    (Hugging Face `BertModel` layout). `family="llama"`: pre-RMSNorm causal decoder,
    rotary positions, SwiGLU, grouped-query attention, no biases
    (Hugging Face `LlamaForCausalLM` layout).
    """

    family: str
    vocab_size: int
    num_layers: int
    hidden_dim: int
    num_heads: int
    intermediate_dim: int
    max_sequence_length: int
    num_kv_heads: int | None = None  # None: as many as query heads (resolved on construction)
    head_dim: int | None = None  # None: hidden_dim // num_heads (resolved on construction)
    num_segments: int = 2  # BERT token types; unused by llama
    dropout: float = 0.0
    layer_norm_epsilon: float = 1e-12
    rope_theta: float = 10000.0
    # None: plain RoPE. Llama 3.1/3.2 frequency scaling as sorted (key, value) pairs, hashable like the
    # rest of the spec; a dict is accepted: {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
    # "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}.
    rope_scaling: tuple | None = None
    tie_embeddings: bool = True
    description: str = ""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"Unknown family {self.family!r}; known families: {', '.join(FAMILIES)}.")
        for field in ("vocab_size", "num_layers", "hidden_dim", "num_heads", "intermediate_dim", "max_sequence_length"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}.")
        if self.head_dim is None and self.hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim={self.hidden_dim} is not divisible by num_heads={self.num_heads}; "
                "choose sizes where hidden_dim % num_heads == 0 (or set head_dim)."
            )
        # Resolve the derived fields once, so every reader sees one number under one name.
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_dim // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}; "
                "grouped-query attention needs num_heads % num_kv_heads == 0."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}.")
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", _rope_scaling(self.rope_scaling, self.family))

    # Derived shapes -----------------------------------------------------------
    @property
    def is_decoder(self) -> bool:
        return self.family == "llama"

    @property
    def default_task(self) -> str:
        return "causal_lm" if self.is_decoder else "backbone"

    def replace(self, **overrides) -> ModelSpec:
        """A copy with `overrides` applied and validated.

        A field that was derived (`head_dim` from the width and heads, `num_kv_heads`
        from the heads) is derived again from the new shape unless it is overridden too.

        Example:
        >>> zoo.spec("enc-base").replace(num_layers=2, hidden_dim=64, num_heads=4).head_dim
        16
        """
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"Unknown spec field(s) {unknown}; valid fields: {', '.join(sorted(known))}.")
        if "head_dim" not in overrides and self.head_dim == self.hidden_dim // self.num_heads:
            overrides["head_dim"] = None
        if "num_kv_heads" not in overrides and self.num_kv_heads == self.num_heads:
            overrides["num_kv_heads"] = None
        return dataclasses.replace(self, **overrides)

    def shape_differences(self, other: ModelSpec) -> list:
        """[(field, mine, theirs)] for each field that fixes the weights' shapes and differs.

        Example:
        >>> zoo.spec("enc-base").shape_differences(zoo.spec("enc-mini"))[0]
        ('num_layers', 12, 6)
        """
        return [(f, getattr(self, f), getattr(other, f)) for f in SHAPE_FIELDS if getattr(self, f) != getattr(other, f)]

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.rope_scaling is None:
            del out["rope_scaling"]  # specs without it serialise as they always did
        else:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out

    def num_params(self, task: str | None = None, num_classes: int = 2) -> int:
        """Parameters of the model `zoo.get` builds for `task`, without building it."""
        return shapes.num_params(self, task, num_classes)


LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_scaling(value, family) -> tuple:
    """`rope_scaling` as sorted (key, value) pairs, checked: only Llama 3 scaling is computed."""
    items = dict(value)
    if family != "llama" or items.get("rope_type") != "llama3":
        raise ValueError(f"rope_scaling={items!r} is not supported; zoo computes rope_type 'llama3' "
                         "(Llama 3.1/3.2 frequency scaling) on the llama family only.")
    missing = [k for k in LLAMA3_ROPE_KEYS if k not in items]
    unknown = sorted(set(items) - {"rope_type", *LLAMA3_ROPE_KEYS})
    if missing or unknown:
        raise ValueError(f"rope_scaling needs exactly rope_type and {', '.join(LLAMA3_ROPE_KEYS)}; "
                         f"missing {missing}, unknown {unknown}.")
    if not 0 < items["low_freq_factor"] < items["high_freq_factor"] or items["factor"] < 1:
        raise ValueError(f"rope_scaling needs factor >= 1 and 0 < low_freq_factor < high_freq_factor, got {items}.")
    numbers = {k: int(v) if k == "original_max_position_embeddings" else float(v) for k, v in items.items()
               if k != "rope_type"}
    return tuple(sorted({**numbers, "rope_type": "llama3"}.items()))


class Registry:
    """Names for frozen items (model specs here, training recipes in `recipes`),
    refusing a silent overwrite and listing the known names on a miss."""

    def __init__(self, kind: str, item_type: type):
        self.kind, self.item_type, self._items = kind, item_type, {}

    def register(self, name: str, item, overwrite: bool = False):
        if not isinstance(item, self.item_type):
            raise TypeError(f"register() takes a {self.item_type.__name__}, got {type(item).__name__}.")
        if name in self._items and not overwrite:
            raise ValueError(f"A {self.kind} named {name!r} is already registered; pass overwrite=True to replace it.")
        self._items[name] = item
        return item

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name) -> bool:
        return name in self._items

    def get(self, name: str, hint: str = ""):
        if name not in self._items:
            raise ValueError(f"Unknown {self.kind} {name!r}; known {self.kind}s: {', '.join(self.names())}{hint}.")
        return self._items[name]


_MODELS = Registry("model", ModelSpec)
register, names = _MODELS.register, _MODELS.names


def spec(name) -> ModelSpec:
    """The registered spec called `name` (a ModelSpec passes through)."""
    return name if isinstance(name, ModelSpec) else _MODELS.get(name)


def _bert(num_layers, hidden, heads, ffn, description, **kw):
    return ModelSpec(
        family="bert", vocab_size=30522, num_layers=num_layers, hidden_dim=hidden, num_heads=heads,
        intermediate_dim=ffn, max_sequence_length=512, dropout=0.1, layer_norm_epsilon=1e-12,
        description=description, **kw,
    )


def _llama(num_layers, hidden, heads, kv_heads, ffn, vocab, max_len, theta, tied, description):
    return ModelSpec(
        family="llama", vocab_size=vocab, num_layers=num_layers, hidden_dim=hidden, num_heads=heads,
        num_kv_heads=kv_heads, intermediate_dim=ffn, max_sequence_length=max_len, dropout=0.0,
        layer_norm_epsilon=1e-5, rope_theta=theta, tie_embeddings=tied, description=description,
    )


# The ladder (docs/design-notes.md). Names are stable API.
register("enc-mini", _bert(6, 384, 12, 1536, "all-MiniLM-L6-v2 shape"))
register("enc-base", _bert(12, 768, 12, 3072, "BERT-base shape"))
register("enc-large", _bert(24, 1024, 16, 4096, "BERT-large shape"))
register("enc-1b", _bert(24, 1792, 14, 7168, "BERT shape scaled to ~1B (head 128)"))
register("dec-base", _llama(30, 576, 9, 3, 1536, 49152, 8192, 100000.0, True, "SmolLM2-135M shape"))
register("dec-large", _llama(32, 960, 15, 5, 2560, 49152, 8192, 100000.0, True, "SmolLM2-360M shape"))
register("dec-1b", _llama(22, 2048, 32, 4, 5632, 32000, 2048, 10000.0, False, "TinyLlama-1.1B shape"))
