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

FAMILIES = ("bert", "llama", "qwen2", "qwen3", "gemma3", "modernbert")
DECODERS = ("llama", "qwen2", "qwen3", "gemma3")  # causal language models; the others are encoders
ACTIVATIONS = ("gelu", "gelu_tanh", "silu")  # gelu is the exact (erf) one; gelu_tanh transformers' gelu_pytorch_tanh
NORMS = ("layer", "rms")
PLACEMENTS = ("post", "pre", "sandwich")
POSITIONS = ("learned", "rope")
LAYER_KINDS = ("global", "local")
POOLINGS = ("pooler", "cls", "mean")
# What the families differ in, as data: the value of each field below when a spec leaves it None
# (docs/families.md says where each comes from in transformers' code).
_LLAMA = dict(activation="silu", gated_ffn=True, qkv_bias=False, dense_bias=False, norm="rms", norm_bias=False,
              norm_offset=0.0, norm_placement="pre", first_attention_norm=True, embedding_norm=False, qk_norm=False,
              scale_embeddings=False, positions="rope", classifier_pooling=None)
FAMILY_DEFAULTS = {
    "bert": dict(_LLAMA, activation="gelu", gated_ffn=False, qkv_bias=True, dense_bias=True, norm="layer",
                 norm_bias=True, norm_placement="post", embedding_norm=True, positions="learned",
                 classifier_pooling="pooler"),
    "llama": _LLAMA,
    "qwen2": dict(_LLAMA, qkv_bias=True),
    "qwen3": dict(_LLAMA, qk_norm=True),
    "gemma3": dict(_LLAMA, activation="gelu_tanh", norm_offset=1.0, norm_placement="sandwich", qk_norm=True,
                   scale_embeddings=True),
    "modernbert": dict(_LLAMA, activation="gelu", norm="layer", first_attention_norm=False, embedding_norm=True,
                       classifier_pooling="cls"),
}
# The fields that fix the weights' shapes (dropout, epsilon and the like do not).
SHAPE_FIELDS = ("family", "vocab_size", "num_layers", "hidden_dim", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_dim", "max_sequence_length", "tie_embeddings", "gated_ffn", "qkv_bias", "dense_bias",
                "norm", "norm_bias", "norm_placement", "first_attention_norm", "embedding_norm", "qk_norm",
                "positions", "classifier_pooling")
# Keras dtype policies a model can be built with; "mixed_*" keep float32 weights.
PRECISIONS = ("float32", "bfloat16", "float16", "mixed_bfloat16", "mixed_float16")


@dataclass(frozen=True)
class ModelSpec:
    """The shape and numerics of one Transformer.

    `family` names the layout of Hugging Face's class of that name (`BertModel`,
    `LlamaForCausalLM`, `Qwen2/Qwen3ForCausalLM`, `Gemma3ForCausalLM`, `ModernBertModel`)
    and gives the defaults of the fields that say what the families differ in
    (FAMILY_DEFAULTS; docs/families.md): a field left None takes its family's value on
    construction, so a spec names only its sizes and a shrunk copy keeps the behaviour.
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
    # What the families differ in (None: FAMILY_DEFAULTS[family], resolved on construction).
    activation: str | None = None  # of the feed-forward network (ACTIVATIONS)
    gated_ffn: bool | None = None  # down(act(gate(x)) * up(x)) instead of down(act(up(x)))
    qkv_bias: bool | None = None  # a bias on the query, key and value projections
    dense_bias: bool | None = None  # a bias on every other dense (attention output, FFN, MLM-head transform)
    norm: str | None = None  # "layer" (LayerNorm) or "rms" (RMSNorm)
    norm_bias: bool | None = None  # LayerNorm's beta
    norm_offset: float | None = None  # RMSNorm scales by (norm_offset + w), in float32 (Gemma: 1)
    norm_placement: str | None = None  # "post" (BERT), "pre", "sandwich" (a norm before and after attention and FFN)
    first_attention_norm: bool | None = None  # False: block 0 has no attention norm (ModernBERT)
    embedding_norm: bool | None = None  # a norm after the embeddings
    qk_norm: bool | None = None  # a per-head norm on the queries and keys, before the rotary positions
    scale_embeddings: bool | None = None  # token embeddings x sqrt(hidden_dim), the factor in the compute dtype
    positions: str | None = None  # "learned" (BERT's position and token-type embeddings) or "rope"
    classifier_pooling: str | None = None  # "pooler" (BERT: tanh dense on [CLS]), "cls" or "mean" (+ a head)
    query_pre_attn_scalar: float | None = None  # scores x scalar^-1/2 (Gemma 3); None: head_dim
    # Attention per layer: a pattern of "global"/"local" repeated over the layers, so that a shrunk
    # copy keeps the family's rhythm. Local layers see key j from query i iff |i - j| < sliding_window.
    layer_kinds: tuple = ("global",)
    sliding_window: int | None = None
    local_rope_theta: float | None = None  # the local layers' RoPE theta; None: rope_theta

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"Unknown family {self.family!r}; known families: {', '.join(FAMILIES)}.")
        for field, value in FAMILY_DEFAULTS[self.family].items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
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
        self._check_variant()

    def _check_variant(self):
        """The family fields' values and the combinations the layers compute; each message names the fix."""
        for field, known in (("activation", ACTIVATIONS), ("norm", NORMS), ("norm_placement", PLACEMENTS),
                             ("positions", POSITIONS)):
            if getattr(self, field) not in known:
                raise ValueError(f"Unknown {field} {getattr(self, field)!r}; known: {', '.join(known)}.")
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))  # a list from to_dict's JSON
        bad = [k for k in self.layer_kinds if k not in LAYER_KINDS]
        if not self.layer_kinds or bad:
            raise ValueError(f"layer_kinds must be a non-empty pattern of {', '.join(LAYER_KINDS)}; got "
                             f"{list(self.layer_kinds)}.")
        local = "local" in self.layer_kinds
        if local and (isinstance(self.sliding_window, bool) or not isinstance(self.sliding_window, int)
                      or self.sliding_window <= 0):
            raise ValueError(f"layer_kinds has local layers, which need a positive sliding_window (keys with "
                             f"|i - j| < sliding_window are seen); got {self.sliding_window!r}.")
        for field in ("sliding_window", "local_rope_theta"):
            if not local and getattr(self, field) is not None:
                raise ValueError(f"{field}={getattr(self, field)} applies to local layers, and layer_kinds "
                                 f"{list(self.layer_kinds)} has none: add 'local' to layer_kinds or drop {field}.")
        if self.norm_offset not in (0.0, 1.0) or (self.norm != "rms" and self.norm_offset):
            raise ValueError(f"norm_offset={self.norm_offset}: an RMSNorm (norm='rms') scales by w (0) or by "
                             "(1 + w) (1, Gemma); a LayerNorm takes 0.")
        if self.norm == "rms" and self.norm_bias:
            raise ValueError("norm_bias=True needs norm='layer': an RMSNorm has no bias.")
        if self.is_decoder and (self.positions != "rope" or self.norm_placement == "post"
                                or self.classifier_pooling is not None):
            raise ValueError(f"A {self.family} decoder takes rotary positions, pre- or sandwich norms and no "
                             f"classifier; got positions={self.positions!r}, norm_placement="
                             f"{self.norm_placement!r}, classifier_pooling={self.classifier_pooling!r}.")
        if not self.is_decoder and self.classifier_pooling not in POOLINGS:
            raise ValueError(f"Unknown classifier_pooling {self.classifier_pooling!r}; known: {', '.join(POOLINGS)}.")
        if self.classifier_pooling == "pooler" and self.positions != "learned":
            raise ValueError("classifier_pooling='pooler' is BERT's (learned positions); use 'cls' or 'mean'.")
        if not self.first_attention_norm and self.norm_placement == "post":
            raise ValueError("first_attention_norm=False needs pre-norm blocks (norm_placement='pre').")
        if self.query_pre_attn_scalar is not None:
            if self.query_pre_attn_scalar <= 0:
                raise ValueError(f"query_pre_attn_scalar must be positive, got {self.query_pre_attn_scalar}.")
            object.__setattr__(self, "query_pre_attn_scalar", float(self.query_pre_attn_scalar))

    # Derived shapes -----------------------------------------------------------
    @property
    def is_decoder(self) -> bool:
        return self.family in DECODERS

    def layer_kind(self, i) -> str:
        """"global" or "local": layer i's attention."""
        return self.layer_kinds[i % len(self.layer_kinds)]

    def layer_window(self, i) -> int | None:
        """What layer i's attention core takes as `window` (None: global)."""
        return self.sliding_window if self.layer_kind(i) == "local" else None

    def layer_rope_theta(self, i) -> float:
        if self.layer_kind(i) == "local" and self.local_rope_theta is not None:
            return self.local_rope_theta
        return self.rope_theta

    @property
    def attention_scale(self) -> float | None:
        """The scores' factor when it is not 1/sqrt(head_dim) (None: that default)."""
        return None if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar ** -0.5

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
        if overrides.get("family", self.family) != self.family:  # the new family's values, unless overridden
            for field, value in FAMILY_DEFAULTS[self.family].items():
                if field not in overrides and getattr(self, field) == value:
                    overrides[field] = None
        return dataclasses.replace(self, **overrides)

    def shape_differences(self, other: ModelSpec) -> list:
        """[(field, mine, theirs)] for each field that fixes the weights' shapes and differs.

        Example:
        >>> zoo.spec("enc-base").shape_differences(zoo.spec("enc-mini"))[0]
        ('num_layers', 12, 6)
        """
        return [(f, getattr(self, f), getattr(other, f)) for f in SHAPE_FIELDS if getattr(self, f) != getattr(other, f)]

    def to_dict(self) -> dict:
        """The fields as JSON types. Those at their family's or the field's default are left out, so that
        a spec of an older family serialises as it always did (and reads back the same)."""
        out = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(self)} | FAMILY_DEFAULTS[self.family]
        for field in ("rope_scaling", *_VARIANT_FIELDS):
            if out[field] == defaults[field]:
                del out[field]
        if self.rope_scaling is not None:
            out["rope_scaling"] = dict(self.rope_scaling)
        if "layer_kinds" in out:
            out["layer_kinds"] = list(self.layer_kinds)
        return out

    def num_params(self, task: str | None = None, num_classes: int = 2) -> int:
        """Parameters of the model `zoo.get` builds for `task`, without building it."""
        return shapes.num_params(self, task, num_classes)


_VARIANT_FIELDS = (*FAMILY_DEFAULTS["bert"], "query_pre_attn_scalar", "layer_kinds", "sliding_window",
                   "local_rope_theta")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_scaling(value, family) -> tuple:
    """`rope_scaling` as sorted (key, value) pairs, checked: zoo computes transformers' rope_type "llama3" (Llama
    3.1/3.2 frequency scaling) on the llama family and "linear" (positions / factor, Gemma 3 4B+ on its global
    layers) on gemma3."""
    items = dict(value)
    if family == "gemma3" and items.get("rope_type") == "linear":
        if set(items) != {"rope_type", "factor"} or not float(items["factor"]) >= 1:
            raise ValueError(f"rope_scaling {items} needs exactly rope_type 'linear' and a factor >= 1.")
        return (("factor", float(items["factor"])), ("rope_type", "linear"))
    if family != "llama" or items.get("rope_type") != "llama3":
        raise ValueError(f"rope_scaling={items!r} is not supported; zoo computes rope_type 'llama3' "
                         "(Llama 3.1/3.2 frequency scaling) on the llama family, and 'linear' on gemma3.")
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


def _qwen(family, vocab, num_layers, hidden, heads, kv_heads, ffn, max_len, tied, description, **kw):
    return ModelSpec(
        family=family, vocab_size=vocab, num_layers=num_layers, hidden_dim=hidden, num_heads=heads,
        num_kv_heads=kv_heads, intermediate_dim=ffn, max_sequence_length=max_len, layer_norm_epsilon=1e-6,
        rope_theta=1000000.0, tie_embeddings=tied, description=description, **kw)


# The ladder (docs/design-notes.md). Names are stable API.
register("enc-mini", _bert(6, 384, 12, 1536, "all-MiniLM-L6-v2 shape"))
register("enc-base", _bert(12, 768, 12, 3072, "BERT-base shape"))
register("enc-large", _bert(24, 1024, 16, 4096, "BERT-large shape"))
register("enc-1b", _bert(24, 1792, 14, 7168, "BERT shape scaled to ~1B (head 128)"))
register("dec-base", _llama(30, 576, 9, 3, 1536, 49152, 8192, 100000.0, True, "SmolLM2-135M shape"))
register("dec-large", _llama(32, 960, 15, 5, 2560, 49152, 8192, 100000.0, True, "SmolLM2-360M shape"))
register("dec-1b", _llama(22, 2048, 32, 4, 5632, 32000, 2048, 10000.0, False, "TinyLlama-1.1B shape"))
# Real checkpoints' shapes, named as the checkpoint, lower case, without organisation or variant suffix
# (docs/families.md): <family><version>-<size>. Counts equal transformers' (tools/hf_param_counts.py).
register("qwen2.5-0.5b", _qwen("qwen2", 151936, 24, 896, 14, 2, 4864, 32768, True, "Qwen/Qwen2.5-0.5B shape"))
register("qwen3-0.6b", _qwen("qwen3", 151936, 28, 1024, 16, 8, 3072, 40960, True, "Qwen/Qwen3-0.6B shape",
                             head_dim=128))
register("gemma3-1b", ModelSpec(
    family="gemma3", vocab_size=262144, num_layers=26, hidden_dim=1152, num_heads=4, num_kv_heads=1, head_dim=256,
    intermediate_dim=6912, max_sequence_length=32768, layer_norm_epsilon=1e-6, rope_theta=1000000.0,
    local_rope_theta=10000.0, layer_kinds=("local",) * 5 + ("global",), sliding_window=512,
    query_pre_attn_scalar=256, description="google/gemma-3-1b-pt shape"))


# The shapes people fine-tune at 3B-8B (issue 36). The Llama 3.1/3.2 ones scale RoPE as transformers' "llama3".
_LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)


def _llama3(num_layers, hidden, heads, ffn, factor, tied, description):
    return ModelSpec(
        family="llama", vocab_size=128256, num_layers=num_layers, hidden_dim=hidden, num_heads=heads, num_kv_heads=8,
        intermediate_dim=ffn, max_sequence_length=131072, layer_norm_epsilon=1e-5, rope_theta=500000.0,
        rope_scaling=dict(_LLAMA3_ROPE, factor=factor), tie_embeddings=tied, description=description)


register("llama3.2-3b", _llama3(28, 3072, 24, 8192, 32.0, True, "meta-llama/Llama-3.2-3B shape"))
register("llama3.1-8b", _llama3(32, 4096, 32, 14336, 8.0, False, "meta-llama/Llama-3.1-8B shape"))
register("qwen2.5-3b", _qwen("qwen2", 151936, 36, 2048, 16, 2, 11008, 32768, True, "Qwen/Qwen2.5-3B shape"))
register("qwen2.5-7b", _qwen("qwen2", 152064, 28, 3584, 28, 4, 18944, 131072, False, "Qwen/Qwen2.5-7B shape"))
register("qwen3-4b", _qwen("qwen3", 151936, 36, 2560, 32, 8, 9728, 40960, True, "Qwen/Qwen3-4B shape", head_dim=128))
register("qwen3-8b", _qwen("qwen3", 151936, 36, 4096, 32, 8, 12288, 40960, False, "Qwen/Qwen3-8B shape",
                           head_dim=128))
# Gemma 3 4B's text tower (Gemma3ForConditionalGeneration's language model; its vision tower is not counted):
# the global layers' RoPE scaled linearly (rope_scaling {"rope_type": "linear", "factor": 8.0}).
register("gemma3-4b", ModelSpec(
    family="gemma3", vocab_size=262208, num_layers=34, hidden_dim=2560, num_heads=8, num_kv_heads=4, head_dim=256,
    intermediate_dim=10240, max_sequence_length=131072, layer_norm_epsilon=1e-6, rope_theta=1000000.0,
    local_rope_theta=10000.0, layer_kinds=("local",) * 5 + ("global",), sliding_window=1024,
    query_pre_attn_scalar=256, rope_scaling={"rope_type": "linear", "factor": 8.0},
    description="google/gemma-3-4b-pt text shape"))


def _modernbert(num_layers, hidden, heads, ffn, description):
    # local_attention 128 in the checkpoints' config: |i - j| <= 64, the zoo's window 65
    return ModelSpec(
        family="modernbert", vocab_size=50368, num_layers=num_layers, hidden_dim=hidden, num_heads=heads,
        intermediate_dim=ffn, max_sequence_length=8192, layer_norm_epsilon=1e-5, rope_theta=160000.0,
        local_rope_theta=10000.0, layer_kinds=("global", "local", "local"), sliding_window=65,
        classifier_pooling="mean", description=description)


register("modernbert-base", _modernbert(22, 768, 12, 1152, "answerdotai/ModernBERT-base shape"))
register("modernbert-large", _modernbert(28, 1024, 16, 2624, "answerdotai/ModernBERT-large shape"))
