"""transformers' Adafactor run for 3 steps on fixed tensors, for `tests/zoo/test_adafactor.py`
(which has neither torch nor transformers): an implementation other than the zoo's and
the tests' numpy one.

Writes tests/fixtures/adafactor/transformers.npz with plain arrays: for each variable
NAME (a matrix, a vector that starts at zero so eps2 binds, a rank-3 kernel) its start
value `NAME/x0` and its gradient at step t `NAME/g{t}`, and for each configuration CONFIG
the values after 3 steps `CONFIG/NAME`. The configurations (`CONFIGS`) are transformers'
arguments; weight decay 0 (transformers scales it by the relative step, Keras by lr).

    # a throwaway venv: torch and transformers are not keras-zoo dependencies
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers numpy
    /tmp/hfvenv/bin/python tools/make_adafactor_fixture.py
"""

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "adafactor" / "transformers.npz"
SEED = 20
STEPS = 3
SHAPES = {"matrix": (5, 7), "vector": (6,), "kernel": (2, 3, 4)}
# name -> transformers.optimization.Adafactor arguments (beyond its defaults: eps (1e-30, 1e-3),
# clip_threshold 1.0, decay_rate -0.8, weight_decay 0, warmup_init False)
CONFIGS = {
    "paper": dict(lr=None, relative_step=True, scale_parameter=True, beta1=None),
    "paper_momentum": dict(lr=None, relative_step=True, scale_parameter=True, beta1=0.9),
    "external_lr": dict(lr=0.05, relative_step=False, scale_parameter=False, beta1=None),
    "external_lr_scaled_momentum": dict(lr=0.05, relative_step=False, scale_parameter=True, beta1=0.9),
}


def tensors():
    """Start values and per-step gradients, float32. Gradients change scale between steps
    and hold large and small entries, so the factored moment and the clipping both matter."""
    rng = np.random.default_rng(SEED)
    arrays = {}
    for name, shape in SHAPES.items():
        arrays[f"{name}/x0"] = (np.zeros(shape) if name == "vector" else rng.normal(0, 0.1, shape)).astype("float32")
        for t in range(1, STEPS + 1):
            scale = rng.lognormal(0, 1, shape) * (1 + t)
            arrays[f"{name}/g{t}"] = (rng.normal(0, 1, shape) * scale).astype("float32")
    return arrays


def main():
    import torch
    from transformers.optimization import Adafactor

    arrays = tensors()
    for config, kwargs in CONFIGS.items():
        params = {n: torch.nn.Parameter(torch.tensor(arrays[f"{n}/x0"])) for n in SHAPES}
        opt = Adafactor(list(params.values()), warmup_init=False, weight_decay=0.0, **kwargs)
        for t in range(1, STEPS + 1):
            for n, p in params.items():
                p.grad = torch.tensor(arrays[f"{n}/g{t}"])
            opt.step()
        for n, p in params.items():
            arrays[f"{config}/{n}"] = p.detach().numpy().copy()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
