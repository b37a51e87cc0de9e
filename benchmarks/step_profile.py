"""Where a training step's time goes, per checkpointing policy: the forward pass with the loss,
the backward pass, and the optimizer (AdamW with the global clip), each timed on its own.

    python benchmarks/step_profile.py                               # dec-base 4 x 512, float32 and bfloat16
    python benchmarks/step_profile.py --variants none,full,full:plain --precisions mixed_bfloat16

For each row (a fresh process, `POLICY[:CORE]` as benchmarks/speed.py) three compiled functions
run on one synthetic causal-LM batch: the forward pass and the chunked loss (training=True); the
same and the gradients of every trainable weight (what a step computes before the update); the
optimizer applying fixed gradients. Then `train_on_batch`, the whole step. Each is the median of
--steps calls after one untimed call. "recompute" is a policy's forward+backward less `none`'s:
what recomputation costs, against one forward pass. Prints a table and one JSON line.
"""

import argparse
import json

import _harness


def measure(model, batch, seq, precision, variant, steps):
    import tensorflow as tf
    from _training import compiled_model, synthetic_batch

    policy, _, core = variant.partition(":")
    m = compiled_model(model, policy, precision, seq, core or None, optimizer="adamw")
    x, y = synthetic_batch(model, batch, seq)
    x, y = {k: tf.constant(v) for k, v in x.items()}, tf.constant(y)
    weights = m.trainable_weights

    def loss():
        outputs = m.backbone({name: x[name] for name in m.backbone.input}, training=True)
        return m.training_loss(outputs, x, y, None)[0]

    @tf.function
    def forward():
        return loss()

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            value = loss()
        return tape.gradient(value, weights)

    grads = [tf.identity(g) for g in forward_backward()]

    @tf.function
    def update():
        m.optimizer.apply_gradients(zip(grads, weights))

    timed = _harness.median_seconds
    out = {"model": model, "batch": batch, "seq": seq, "precision": precision, "variant": variant,
           "forward_s": timed(forward, steps), "forward_backward_s": timed(forward_backward, steps),
           "optimizer_s": timed(update, steps)}
    y_np, x_np = y.numpy(), {k: v.numpy() for k, v in x.items()}
    out["step_s"] = timed(lambda: m.train_on_batch(x_np, y_np), steps)
    return out


def cell(value):
    return "-" if value is None else f"{value:.2f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="dec-base")
    p.add_argument("--shape", default="4x512", help="BATCHxSEQ")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--variants", default="none,full,selective", help="POLICY[:CORE], `none` first")
    p.add_argument("--steps", type=int, default=3, help="timed calls of each part")
    a = p.parse_args()
    batch, seq = map(int, a.shape.split("x"))
    rows = []
    for precision in a.precisions.split(","):
        for variant in a.variants.split(","):
            run = _harness.run_child(dict(model=a.model, batch=batch, seq=seq, precision=precision, variant=variant,
                                          steps=a.steps))
            rows.append(run.result if run.ok else {"precision": precision, "variant": variant, "error": run.error})
    print(f"{a.model} {a.shape}, AdamW with global clip 1.0, median of {a.steps}; seconds")
    print("| precision | variant | forward + loss | backward | forward + backward | optimizer | parts summed | "
          "train step | recompute (vs none) | recompute / forward | step / none's |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for precision in a.precisions.split(","):
        group = [r for r in rows if r["precision"] == precision]
        none = next((r for r in group if r["variant"] == "none" and "error" not in r), None)
        for r in group:
            if "error" in r:
                print(f"| {precision} | {r['variant']} | error: {r['error'][:80]} | | | | | | | | |")
                continue
            r["backward_s"] = r["forward_backward_s"] - r["forward_s"]
            r["recompute_s"] = r["forward_backward_s"] - none["forward_backward_s"] if none else None
            r["step_vs_none"] = r["step_s"] / none["step_s"] if none else None
            per_forward = r["recompute_s"] / none["forward_s"] if none else None
            print(f"| {precision} | {r['variant']} | {r['forward_s']:.2f} | {r['backward_s']:.2f} | "
                  f"{r['forward_backward_s']:.2f} | {r['optimizer_s']:.2f} | "
                  f"{r['forward_backward_s'] + r['optimizer_s']:.2f} | {r['step_s']:.2f} | "
                  f"{cell(r['recompute_s'])} | {cell(per_forward)} | {cell(r['step_vs_none'])} |")
    print(json.dumps({"benchmark": "step_profile", "model": a.model, "shape": a.shape, "rows": rows}))


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
