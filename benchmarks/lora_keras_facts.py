"""What Keras 3.15.1's LoRA and quantization do on zoo models, measured (docs/lora.md quotes it).

    python benchmarks/lora_keras_facts.py            # ~2 minutes, < 2 GiB
    python benchmarks/lora_keras_facts.py --tokens 8x512 --dtype bfloat16   # the 1B training shape

A. Which layers `Model.quantize(mode)` quantizes in a zoo decoder and encoder, with Keras'
   defaults and with `zoo.quantization.quantize_base` (weight-only configs, `type_check=False` for
   keras-hub's ReversibleEmbedding, the new classifier left float).
B. One dec-1b-sized projection (2048 -> 5632, the MLP's gate/up) with LoRA r16, forward and
   backward (input and adapter gradients, from a given output gradient) on `--tokens` tokens:
   stored bytes, TensorFlow's allocator peak above the stored weights, the input and the output
   gradient (so: the output, the input gradient and every transient), seconds per step (3 steps,
   after one traced; ±15% between runs on a shared machine), and the output's error to the
   float32 reference x·W + 2·(x·A)·B computed in numpy. Rows: a frozen float Dense
   without LoRA (input gradient only: the floor), Keras' float LoRA, Keras' default int8
   (activations quantized too), int8 weight-only, int4 (blocks of 128).
C. The adapter gradients of a tiny decoder on a quantized base against the float base's
   (cosine), with Keras' default configs and with zoo's weight-only ones.
D. Keras quirks: the merged kernel under mixed_bfloat16 (`Dense.kernel`), what `save_weights`
   keeps of an adapter, `Dense.from_config` and lora_alpha, what a quantized zoo model still
   holds on the allocator (`zoo.ops.scratch_graphs.release_scratch_graphs`), and the gc.collect() that Keras
   runs for every variable it deletes (Model.quantize, removing an adapter).

Prints the tables and one JSON line.
"""

import argparse
import gc
import json
import os
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
warnings.simplefilter("ignore")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import zoo  # noqa: E402
from zoo import lora, quantization  # noqa: E402
from zoo.ops.scratch_graphs import release_scratch_graphs  # noqa: E402

TINY_DEC = dict(num_layers=2, hidden_dim=64, num_heads=4, num_kv_heads=2, intermediate_dim=128, vocab_size=128)
TINY_ENC = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=128)
MiB = 2**20


def quantized_layers(model):
    return sorted({f"{type(layer).__name__}:{layer.quantization_mode}" for layer in model._flatten_layers()
                   if getattr(layer, "quantization_mode", None)})


def coverage():
    rows = {}
    for name, shape, task in (("dec-base", TINY_DEC, "causal_lm"), ("enc-mini", TINY_ENC, "classifier")):
        for mode in quantization.QUANTIZATION_MODES:
            model = zoo.get(name, task=task, **shape)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.quantize(mode)
            refused = sorted({str(w.message).split(" does not")[0].replace("Layer ", "") for w in caught
                              if "does not have a `quantize`" in str(w.message)})
            keras_default = quantized_layers(model)
            model = zoo.get(name, task=task, **shape)
            quantization.quantize_base(model, mode)
            rows[f"{name} {mode}"] = {"Model.quantize": keras_default, "refused (warning)": refused,
                                      "zoo.quantization.quantize_base": quantized_layers(model),
                                      "classifier": getattr(getattr(model, "classifier", None), "quantization_mode",
                                                            "-")}
    return rows


def measure(layer, x, reference, rng):
    """One projection's stored bytes, step peak, seconds per step and error (see part B)."""
    inputs = tf.constant(x, dtype=layer.compute_dtype)
    upstream = tf.constant(rng.standard_normal(reference.shape) * 1e-3, dtype=layer.compute_dtype)
    variables = layer.trainable_variables

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            y = layer(inputs)
        # the output is used (as the next layer would), else TensorFlow prunes the forward matmul
        return tf.reduce_sum(tf.cast(y, "float32")), tape.gradient(y, [inputs] + variables, output_gradients=upstream)

    y = layer(inputs)
    error = float(np.abs(tf.cast(y, "float32").numpy() - reference).max() / np.abs(reference).max())
    del y
    step()
    tf.config.experimental.reset_memory_stats("CPU:0")
    start = tf.config.experimental.get_memory_info("CPU:0")["current"]
    began = time.perf_counter()
    for _ in range(3):
        step()
    seconds = (time.perf_counter() - began) / 3
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - start
    stored = sum(np.asarray(v.numpy()).nbytes for v in layer.weights)
    return {"stored_MiB": round(stored / MiB, 1), "step_peak_MiB": round(peak / MiB, 1),
            "s_per_step": round(seconds, 3), "max_rel_error": float(f"{error:.3g}")}


def projection(tokens, dtype, rank=16, fan_in=2048, fan_out=5632):
    batch, length = tokens
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((fan_in, fan_out)) * 0.02).astype("float32")
    w[rng.integers(0, fan_in, 64), rng.integers(0, fan_out, 64)] = 0.3  # a few outliers, as checkpoints have
    a = (rng.standard_normal((fan_in, rank)) * 0.02).astype("float32")
    b = (rng.standard_normal((rank, fan_out)) * 0.02).astype("float32")
    x = rng.standard_normal((batch, length, fan_in)).astype("float32")
    reference = x @ w + 2.0 * (x @ a) @ b
    configs = {
        "float, frozen, no LoRA (floor)": "frozen",
        "float + LoRA (Keras)": "lora",
        "int8 Keras default + LoRA": ("int8", None),
        "int8 weight-only + LoRA (zoo)": (None, lambda: quantization.quantization_config("int8")),
        "int4 block 128 + LoRA (zoo)": (None, lambda: quantization.quantization_config("int4")),
    }
    rows = {}
    for label, how in configs.items():
        layer = keras.layers.Dense(fan_out, use_bias=False, dtype=dtype)
        layer.build((None, None, fan_in))
        layer.kernel.assign(w)
        if isinstance(how, tuple):
            mode, config = how
            layer.quantize(mode, config=config() if config else None)
        if how != "frozen":
            layer.enable_lora(rank, lora_alpha=2 * rank)
            layer.lora_kernel_a.assign(a)
            layer.lora_kernel_b.assign(b)
        else:
            layer.kernel.trainable = False
        rows[label] = measure(layer, x, reference, rng)
    return rows


def gradient_cosines():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 128, (2, 16)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}

    def adapter_gradients(quantize):
        keras.utils.set_random_seed(1)
        model = zoo.get("dec-base", **TINY_DEC)
        quantize(model)
        lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
        for layer in lora.adapters(model).values():
            layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.01, "float32"))
        with tf.GradientTape() as tape:
            logits = model(x, training=True)["logits"]
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(ids, logits, from_logits=True))
        return np.concatenate([g.numpy().ravel() for g in tape.gradient(loss, model.trainable_variables)])

    reference = adapter_gradients(lambda model: None)

    def everything(mode, config=None):
        # what Keras' Model.quantize(mode) does, plus the ReversibleEmbedding it refuses by type
        return lambda model: model.quantize(mode, config=config, type_check=False,
                                            filters=lambda layer: isinstance(layer, (keras.layers.Dense,
                                                                                     keras.layers.Embedding)))

    rows = {}
    for label, quantize in (("int8 Keras default (inputs quantized)", everything("int8")),
                            ("int4 Keras default (= zoo's: weight-only, blocks of 128)", everything("int4")),
                            ("int8 zoo weight-only", lambda m: quantization.quantize_base(m, "int8")),
                            ("int4 zoo weight-only", lambda m: quantization.quantize_base(m, "int4"))):
        g = adapter_gradients(quantize)
        rows[label] = round(float(g @ reference / np.linalg.norm(g) / np.linalg.norm(reference)), 4)
    return rows


def quirks():
    found = {}
    # Keras' merged kernel under mixed_bfloat16
    layer = keras.layers.Dense(256, dtype="mixed_bfloat16")
    layer.build((None, 256))
    layer.enable_lora(8)
    layer.lora_kernel_b.assign(np.full((8, 256), 1e-3, "float32"))
    exact = layer._kernel.numpy() + layer.lora_kernel_a.numpy() @ layer.lora_kernel_b.numpy()
    merged = keras.ops.convert_to_numpy(keras.ops.cast(layer.kernel, "float32"))
    found["Dense.kernel dtype under mixed_bfloat16"] = str(layer.kernel.dtype)
    error = np.abs(merged - exact).max() / np.abs(exact).max()
    found["max |Dense.kernel - exact merge| / max |W|"] = float(f"{error:.3g}")
    # what save_weights keeps
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16)])
    model.layers[0].enable_lora(4, lora_alpha=8)
    model.layers[0].lora_kernel_b.assign(np.ones((4, 16), "float32"))
    before = model(np.ones((1, 16), "float32")).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_weights(f"{tmp}/w.weights.h5")
        model.load_weights(f"{tmp}/w.weights.h5")
    dense = model.layers[0]
    found["after save_weights/load_weights: |B| max"] = float(np.abs(dense.lora_kernel_b.numpy()).max())
    found["after save_weights/load_weights: outputs equal"] = bool(np.allclose(model(np.ones((1, 16))), before))
    # Dense.from_config keeps lora_rank; does it keep lora_alpha?
    rebuilt = keras.layers.Dense.from_config(dense.get_config())
    rebuilt.build((None, 16))
    found["from_config(lora_rank=4, lora_alpha=8) -> lora_alpha"] = rebuilt.lora_alpha
    # what a quantized zoo model holds on TensorFlow's allocator (the scratch graphs Keras traced)
    shape = dict(TINY_DEC, hidden_dim=256, intermediate_dim=1024)

    def current():
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    for label, quantize in (("Model.quantize", lambda m: m.quantize("int8", filters=lambda layer: isinstance(
                                layer, keras.layers.Dense))),
                            ("zoo.quantization.quantize_base", lambda m: quantization.quantize_base(m, "int8"))):
        release_scratch_graphs()  # what earlier models left is freed before the measurement
        gc.collect()
        start = current()
        model = zoo.get("dec-base", **shape)
        built = current() - start
        quantize(model)
        gc.collect()
        stored = sum(np.asarray(v.numpy()).nbytes for v in model.weights)
        found[f"{label}: allocator MiB built / after int8 / stored"] = (
            round(built / MiB, 2), round((current() - start) / MiB, 2), round(stored / MiB, 2))
        del model
    # gc.collect per deleted variable
    model = zoo.get("dec-base", **TINY_DEC)
    began = time.perf_counter()
    gc.collect()
    found["one gc.collect() s"] = round(time.perf_counter() - began, 3)
    began = time.perf_counter()
    model.quantize("int8", filters=lambda layer: isinstance(layer, keras.layers.Dense))
    found["Model.quantize, 14 Dense, s"] = round(time.perf_counter() - began, 2)
    model = zoo.get("dec-base", **TINY_DEC)
    began = time.perf_counter()
    quantization.quantize_base(model, "int8")
    found["zoo.quantization.quantize_base (gc once), s"] = round(time.perf_counter() - began, 2)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="8x128", help="batch x length of part B (default 8x128)")
    parser.add_argument("--dtype", default="float32", help="part B's dtype policy (float32, bfloat16, mixed_bfloat16)")
    args = parser.parse_args()
    tokens = tuple(int(v) for v in args.tokens.split("x"))
    result = {"coverage": coverage()}
    print("A. layers quantized")
    for row, values in result["coverage"].items():
        print(f"  {row}: {values}")
    result["projection"] = projection(tokens, args.dtype)
    print(f"B. one 2048 -> 5632 projection, LoRA r16, {args.tokens} tokens, {args.dtype}")
    print(f"  {'':34} {'stored MiB':>10} {'step peak MiB':>13} {'s/step':>7} {'max rel err':>11}")
    for label, row in result["projection"].items():
        print(f"  {label:34} {row['stored_MiB']:10.1f} {row['step_peak_MiB']:13.1f} {row['s_per_step']:7.3f} "
              f"{row['max_rel_error']:11.3g}")
    result["gradient_cosine"] = gradient_cosines()
    print("C. cosine of the adapter gradients to the float base's (tiny decoder)")
    for label, value in result["gradient_cosine"].items():
        print(f"  {label:52} {value:.4f}")
    result["quirks"] = quirks()
    print("D. Keras quirks")
    for label, value in result["quirks"].items():
        print(f"  {label}: {value}")
    print(json.dumps({"tokens": args.tokens, "dtype": args.dtype, **result}))


if __name__ == "__main__":
    main()
