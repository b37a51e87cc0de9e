"""The norms of every family, from one settings dict (`{"kind", "epsilon", "bias", "offset"}`), so
that a block, its Q/K norms and a model's embedding and final norms are made the same way.

"layer": Keras' LayerNormalization (`bias=False`: no beta, ModernBERT). "rms": Keras'
RMSNormalization (w · x/rms(x): Llama, Qwen), or with `offset=1` keras-hub's Gemma 3 norm,
(1 + w) · x/rms(x) computed in float32 and cast once, as transformers' Gemma3RMSNorm.
"""

import keras


def make_norm(settings: dict, dtype=None, name=None):
    kind, epsilon = settings["kind"], settings["epsilon"]
    if kind == "layer":
        return keras.layers.LayerNormalization(epsilon=epsilon, center=settings.get("bias", True), dtype=dtype,
                                               name=name)
    if kind != "rms":
        raise ValueError(f"Unknown norm {kind!r}; known: layer, rms.")
    offset = settings.get("offset", 0.0)
    if offset == 1.0:
        # keras-hub's Gemma 3 norm (not exported in 0.32), as the Llama 3 rotary layer is used elsewhere.
        from keras_hub.src.models.gemma3.gemma3_layers import RMSNormalization

        return RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    if offset:
        raise ValueError(f"An RMSNorm scales by w or (1 + w); norm offset {offset} is neither.")
    return keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
