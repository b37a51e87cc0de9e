"""The training setup the memory benchmarks share: a registered model with its
training head, an optimizer built (by default Adam with per-variable clipnorm 1.0;
`optimizer="adamw"` is the recipes' setup, AdamW with global_clipnorm 1.0, which keeps
every gradient alive until the norm is known), one synthetic batch, and timed steps.

Encoders train masked-LM (15% of positions), decoders causal-LM.
"""

import time

import keras
import numpy as np

import zoo
import zoo.lora


def make_optimizer(name="adam", clip=1.0, rounding=None):
    """The optimizer of a benchmark: "adam" (clipnorm 1.0, each variable clipped on its own),
    or the recipes' own classes (recipes.optim) with global_clipnorm `clip` (None: no clip):
    "adamw", "lion", "adafactor" (factored), "keras-adafactor"; `rounding` for bfloat16 weights."""
    from recipes import optim

    if rounding:
        return {"adamw": lambda: optim.AdamW(1e-4, weight_decay=0.01, global_clipnorm=clip, rounding=rounding),
                "lion": lambda: optim.Lion(1e-5, global_clipnorm=clip, rounding=rounding),
                "adafactor": lambda: optim.Adafactor(1e-3, global_clipnorm=clip, relative_step=False,
                                                     rounding=rounding)}[name]()

    if name == "adam":
        return keras.optimizers.Adam(1e-4, clipnorm=clip)
    if name == "adamw":
        return optim.AdamW(1e-4, weight_decay=0.01, global_clipnorm=clip)
    if name == "lion":
        return optim.Lion(1e-5, global_clipnorm=clip)
    if name == "adafactor":
        return optim.Adafactor(1e-3, global_clipnorm=clip, relative_step=False)
    if name == "keras-adafactor":
        return optim.KerasAdafactor(1e-3, global_clipnorm=clip, relative_step=False)
    raise ValueError(f"Unknown optimizer {name!r}; known: adam, adamw, lion, adafactor, keras-adafactor.")


def pretraining_task(model) -> str:
    """What the benchmarks train a model for: masked LM (encoders) or causal LM (decoders)."""
    return "causal_lm" if zoo.spec(model).is_decoder else "masked_lm"


def compiled_model(model, policy, precision, seq, core=None, chunk_size=None, optimizer="adam", fused=False,
                   loss_chunk=None, clip=1.0, weights_dtype="float32", num_layers=None, lora_rank=None,
                   lora_targets=None, quantize=None, spec_overrides=None, packed=False):
    """`core`, `chunk_size`: the attention core (None: the model's default);
    `weights_dtype` "bfloat16": the "bfloat16" policy and stochastic rounding (zoo.checks.weights);
    `num_layers`: fewer blocks (smoke runs); `lora_rank`/`quantize`: LoRA on a (quantized) frozen base;
    `spec_overrides`: other ModelSpec fields (long_context.py's all-global copy of a windowed model);
    `packed`: the padding mask numbers documents (ZooModel.set_packed; benchmarks/sft.py)."""
    from zoo import checks

    spec = zoo.spec(model)
    task = pretraining_task(model)
    # BERT has 512 learned positions: longer sequences get a model with more of them.
    overrides = {"max_sequence_length": seq} if seq > spec.max_sequence_length else {}
    if num_layers:
        overrides["num_layers"] = num_layers
    overrides.update(spec_overrides or {})
    precision, rounding = checks.weights(weights_dtype, precision, frozen=bool(lora_rank))
    keras.utils.set_random_seed(0)  # same weights and data in every variant
    m = zoo.get(model, checkpointing=policy, dtype=precision, task=task, **overrides)
    if core is not None or chunk_size is not None:
        m.set_attention(core or m.attention[0], chunk_size)
    if quantize:  # LoRA on a frozen quantized base, as `zoo train --lora-rank --quantize` builds it
        zoo.quantization.quantize_base(m, quantize)
    if lora_rank:
        zoo.lora.enable_lora(m, lora_rank, 2 * lora_rank, lora_targets)
    if task == "causal_lm":  # None: the chunked loss's default; 0: the whole logits
        m.set_loss_chunk(loss_chunk)
    if fused:  # the optimizer step inside the backward pass (needs policy "full")
        m.set_fused_update(True)
    if packed:
        m.set_packed(True)
    m.compile(optimizer=make_optimizer(optimizer, clip, rounding),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    m.optimizer.build(m.trainable_variables)  # Adam's slots count as "built", not as step memory
    return m


def synthetic_batch(model, batch, seq, packed=False):
    """Random tokens; `packed`: each row's padding mask numbers documents of 64 to seq / 4 tokens."""
    spec, rng = zoo.spec(model), np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, spec.vocab_size, (batch, seq), dtype="int32"),
         "padding_mask": np.ones((batch, seq), "int32")}
    if packed:
        for row in x["padding_mask"]:
            at, number = 0, 1
            while at < seq:
                length = int(rng.integers(64, max(65, seq // 4)))
                row[at:at + length] = number
                at, number = at + length, number + 1
    if not spec.is_decoder:
        if spec.positions == "learned":  # BERT's token types; ModernBERT has none
            x["segment_ids"] = np.zeros((batch, seq), "int32")
        x["mask_positions"] = np.sort(rng.choice(seq, (batch, int(seq * 0.15)))).astype("int32")
        return x, np.take_along_axis(x["token_ids"], x["mask_positions"], axis=1)
    return x, np.roll(x["token_ids"], -1, axis=1)


def train_steps(m, x, y, steps):
    """Take `steps` training steps on one batch.

    Args:
        m: a model from `compiled_model`.
        x, y: a batch from `synthetic_batch`.
        steps: how many steps; the first includes tracing.

    Returns:
        Three lists, one entry per step: wall seconds, process CPU seconds (all threads), loss.
    """
    times, cpu_times, losses = [], [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        losses.append(float(np.ravel(m.train_on_batch(x, y))[0]))  # a list where the model has metrics
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return times, cpu_times, losses
