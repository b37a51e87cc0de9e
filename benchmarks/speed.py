"""Training speed of each checkpointing policy beside keras-hub's own backbone, each row a fresh process.

    python benchmarks/speed.py                                   # enc-base and dec-base, float32 and bfloat16
    python benchmarks/speed.py --models dec-base --precisions float32 --variants keras-hub,none,full
    python benchmarks/speed.py --variants none:plain,none:chunked   # a policy with a chosen attention core
    python benchmarks/speed.py --models enc-base --variants none,full,full/redraw   # masks held, or drawn again

Every row trains one synthetic batch (default 4 x 512) with `compile` + `train_on_batch`, AdamW with a
global-norm clip of 1.0 (recipes.optim.AdamW, the same object for every row): encoders masked-LM
(15% of positions), decoders causal-LM. The reference row, `keras-hub`, is keras-hub's
BertMaskedLM / LlamaCausalLM on a backbone of the same shape (random weights; TensorFlow, like the
zoo). Zoo rows are `POLICY[:CORE]`: `none`, `selective`, `full`, `full+fused` (the fused update with
the exact global clip); the core is the model's default unless given; a `/redraw` suffix holds no
dropout mask as bits, so each replay draws its masks again (the behaviour before they were held).
Rows are interleaved (`--repeats` runs the whole sequence again and keeps each row's median), the
first step (tracing) is not timed, and the step time is the median of the rest.
Prints a table with tokens/s and the ratios to keras-hub and to `none`, then one JSON line.
"""

import argparse
import json
import statistics

import _harness

VARIANTS = ("keras-hub", "none", "selective", "full", "full+fused")


def keras_hub_model(model, precision):
    """keras-hub's task model on a backbone of `model`'s shape (the zoo's spec), no preprocessor."""
    import keras_hub

    import zoo

    s = zoo.spec(model)
    if s.is_decoder:
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=s.vocab_size, num_layers=s.num_layers, num_query_heads=s.num_heads,
            hidden_dim=s.hidden_dim, intermediate_dim=s.intermediate_dim, num_key_value_heads=s.num_kv_heads,
            rope_max_wavelength=s.rope_theta, layer_norm_epsilon=s.layer_norm_epsilon, dropout=s.dropout,
            tie_word_embeddings=s.tie_embeddings, dtype=precision)
        return keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=s.vocab_size, num_layers=s.num_layers, num_heads=s.num_heads, hidden_dim=s.hidden_dim,
        intermediate_dim=s.intermediate_dim, dropout=s.dropout, max_sequence_length=s.max_sequence_length,
        num_segments=s.num_segments, dtype=precision)
    return keras_hub.models.BertMaskedLM(backbone, preprocessor=None)


def measure(model, batch, seq, precision, variant, steps):
    """One row, in this (child) process."""
    import keras
    import numpy as np
    from _training import compiled_model, make_optimizer, synthetic_batch, train_steps

    if variant == "keras-hub":
        keras.utils.set_random_seed(0)
        m = keras_hub_model(model, precision)
        m.compile(optimizer=make_optimizer("adamw"), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        m.optimizer.build(m.trainable_variables)
    else:
        variant_config, _, redraw = variant.partition("/")
        if redraw:  # nothing held: every replay draws its masks from the seed again
            from zoo.layers.block import TransformerBlock

            draw_masks = TransformerBlock.draw_masks
            TransformerBlock.draw_masks = lambda self, x, ahead=False: draw_masks(self, x)
        config, _, core = variant_config.partition(":")
        policy, _, fused = config.partition("+")
        m = compiled_model(model, policy, precision, seq, core or None, optimizer="adamw", fused=bool(fused))
    x, y = synthetic_batch(model, batch, seq)
    with _harness.PeakMemory() as mem:
        times, _, losses = train_steps(m, x, y, steps)
    step = float(np.median(times[1:])) if len(times) > 1 else times[0]
    return {"model": model, "batch": batch, "seq": seq, "precision": precision, "variant": variant,
            "step_s": step, "first_step_s": times[0], "tokens_per_s": batch * seq / step,
            "step_mem_gib": mem.step_gib, "peak_rss_gib": mem.rss_gib, "memory_measure": mem.measure,
            "loss": losses[-1]}


def cell(value, digits=2):
    return f"{value:.{digits}f}" if value is not None else "-"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="enc-base,dec-base")
    p.add_argument("--shape", default="4x512", help="BATCHxSEQ")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="keras-hub and POLICY[+fused][:CORE][/redraw], in order")
    p.add_argument("--steps", type=int, default=3, help="steps per row; the first (tracing) is not timed")
    p.add_argument("--repeats", type=int, default=1, help="run every row this many times, interleaved")
    a = p.parse_args()
    batch, seq = map(int, a.shape.split("x"))
    variants = a.variants.split(",")
    groups = [(m, pr) for m in a.models.split(",") for pr in a.precisions.split(",")]
    runs = {}
    for _ in range(a.repeats):
        for model, precision in groups:
            for variant in variants:
                run = _harness.run_child(dict(model=model, batch=batch, seq=seq, precision=precision,
                                              variant=variant, steps=a.steps))
                runs.setdefault((model, precision, variant), []).append(run.result if run.ok else {"error": run.error})

    print(f"{'model':9s} {'precision':15s} {'variant':18s} {'step s':>7s} {'tok/s':>7s} {'x keras-hub':>11s} "
          f"{'x none':>7s} {'step GiB':>9s} {'RSS GiB':>8s} {'1st step s':>10s}")
    rows = []
    for model, precision in groups:
        found = {}
        for variant in variants:
            ok = [r for r in runs[model, precision, variant] if "error" not in r]
            if not ok:
                rows.append({"model": model, "precision": precision, "variant": variant,
                             "error": runs[model, precision, variant][-1]["error"]})
                print(f"{model:9s} {precision:15s} {variant:18s} ERROR {rows[-1]['error']}")
                continue
            r = dict(ok[0], step_s=statistics.median(x["step_s"] for x in ok), repeats=len(ok))
            r["tokens_per_s"] = batch * seq / r["step_s"]
            found[variant] = r
        hub, none = found.get("keras-hub"), found.get("none")
        for variant, r in found.items():
            r["speed_vs_keras_hub"] = r["tokens_per_s"] / hub["tokens_per_s"] if hub else None
            r["time_vs_none"] = r["step_s"] / none["step_s"] if none else None
            rows.append(r)
            print(f"{model:9s} {precision:15s} {variant:18s} {r['step_s']:7.2f} {r['tokens_per_s']:7.0f} "
                  f"{cell(r['speed_vs_keras_hub']):>11s} {cell(r['time_vs_none']):>7s} {r['step_mem_gib']:9.2f} "
                  f"{r['peak_rss_gib']:8.2f} {r['first_step_s']:10.1f}")
    print(json.dumps({"benchmark": "speed", "shape": a.shape, "results": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
