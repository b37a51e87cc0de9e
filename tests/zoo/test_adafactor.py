"""The zoo's factored Adafactor (zoo.optimizers.adafactor) takes the paper's steps and keeps
only O(rows + cols) per matrix.

Two references it is compared with after 3 steps: a numpy transcription of Shazeer & Stern
2018 (Algorithms 4 and 5 written with the paper's row and column *sums*, in float64), and
transformers' `Adafactor` (tests/fixtures/adafactor/transformers.npz, made by
tools/make_adafactor_fixture.py). Then: the fused update takes the same steps as `fit`,
the state's bytes, sparse embedding gradients, mixed_float16, and bad arguments."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import REPO, TINY_DEC
from zoo.memory.optimizer_state import state_bytes
from zoo.optimizers import Adafactor

FIXTURE = REPO / "tests" / "fixtures" / "adafactor" / "transformers.npz"
SHAPES = {"matrix": (5, 7), "vector": (6,), "kernel": (2, 3, 4)}
# The fixture's configurations as this optimizer's arguments (transformers' lr=None is the paper's 1e-2 cap).
CONFIGS = {
    "paper": dict(learning_rate=1e-2, relative_step=True, scale_parameter=True, beta_1=None),
    "paper_momentum": dict(learning_rate=1e-2, relative_step=True, scale_parameter=True, beta_1=0.9),
    "external_lr": dict(learning_rate=0.05, relative_step=False, scale_parameter=False, beta_1=None),
    "external_lr_scaled_momentum": dict(learning_rate=0.05, relative_step=False, scale_parameter=True, beta_1=0.9),
}


def rms(x):
    return np.sqrt(np.mean(np.square(x)))


def paper_adafactor(x, grads, learning_rate, relative_step, scale_parameter, beta_1, c=0.8, eps1=1e-30,
                    eps2=1e-3, d=1.0):
    """Shazeer & Stern 2018, Algorithm 4 (rank >= 2, factored over the last two axes; R and C
    are sums, V = R C / (1^T R)) and Algorithm 5 (vectors), with relative step sizes, parameter
    scaling, update clipping and the implementations' momentum over the scaled step. Computed
    in float64; the weights are stored in float32 after each step, as the variables are."""
    row = col = second = momentum = 0.0
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        beta2 = 1.0 - t ** -c
        g2 = g * g + eps1
        if x.ndim >= 2:
            row = beta2 * row + (1 - beta2) * g2.sum(axis=-1)
            col = beta2 * col + (1 - beta2) * g2.sum(axis=-2)
            v = row[..., :, None] * col[..., None, :] / row.sum(axis=-1)[..., None, None]
        else:
            second = beta2 * second + (1 - beta2) * g2
            v = second
        u = g / np.sqrt(v)
        u = u / max(1.0, rms(u) / d)
        rho = min(learning_rate, 1 / math.sqrt(t)) if relative_step else learning_rate
        alpha = max(eps2, rms(x)) * rho if scale_parameter else rho
        step = alpha * u
        if beta_1:
            momentum = beta_1 * momentum + (1 - beta_1) * step
            step = momentum
        x = (x - step).astype(np.float32)
    return x


def fixture():
    with np.load(FIXTURE, allow_pickle=False) as f:
        return dict(f)


def run_zoo(arrays, config, steps=3, graph=False, optimizer=Adafactor):
    """This optimizer on the fixture's variables (one optimizer for all three, as in a model)."""
    variables = [keras.Variable(arrays[f"{n}/x0"], name=n) for n in SHAPES]
    opt = optimizer(**config)

    def step(t):
        opt.apply([tf.constant(arrays[f"{n}/g{t}"]) for n in SHAPES], variables)

    apply = tf.function(step) if graph else step
    for t in range(1, steps + 1):
        apply(t)
    return {n: v.numpy() for n, v in zip(SHAPES, variables)}, opt


def slots(opt):
    """The optimizer's state: its variables less the step counter and a constant learning rate's."""
    return [v for v in opt.variables if v is not opt._iterations and v is not opt._learning_rate]


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_three_steps_equal_the_paper_in_numpy_and_transformers(config):
    arrays = fixture()
    ours, _ = run_zoo(arrays, CONFIGS[config], graph=config == "paper_momentum")
    for name in SHAPES:
        x0, grads = arrays[f"{name}/x0"], [arrays[f"{name}/g{t}"] for t in (1, 2, 3)]
        paper = paper_adafactor(x0, grads, **CONFIGS[config])
        transformers = arrays[f"{config}/{name}"]
        assert rel(ours[name], paper) < 1e-6, (name, rel(ours[name], paper))
        assert rel(ours[name], transformers) < 1e-6, (name, rel(ours[name], transformers))
        # The weights' change too: the weights themselves would hide an error in a small step.
        moved = paper - x0
        assert np.linalg.norm(moved) > 1e-3 * np.linalg.norm(paper)
        assert rel(ours[name] - x0, moved) < 1e-5, (name, rel(ours[name] - x0, moved))
        assert rel(transformers - x0, moved) < 1e-5  # the fixture is the same algorithm


def test_keras_adafactor_takes_the_same_steps_with_a_full_size_velocity():
    """Keras' Adafactor (what recipes.optim builds for "adafactor": a schedule, relative_step=False)
    caps the schedule at 1/sqrt(t) and scales by the weights' RMS: this optimizer with
    relative_step=True. Same steps; Keras' stores the factors' product in a full-size velocity."""
    arrays = fixture()
    schedule = keras.optimizers.schedules.PolynomialDecay(2.0, 10, 0.1)  # above 1/sqrt(t): the cap binds
    ours, opt = run_zoo(arrays, dict(learning_rate=schedule, relative_step=True, weight_decay=0.1))
    theirs, keras_opt = run_zoo(arrays, dict(learning_rate=schedule, relative_step=False, weight_decay=0.1),
                                optimizer=keras.optimizers.Adafactor)
    for name in SHAPES:
        assert rel(ours[name] - arrays[f"{name}/x0"], theirs[name] - arrays[f"{name}/x0"]) < 1e-6, name
    assert sum(math.prod(v.shape) for v in keras_opt.variables) > sum(math.prod(s) for s in SHAPES.values())
    assert sum(math.prod(v.shape) for v in slots(opt)) == 5 + 7 + 6 + 2 * 3 + 2 * 4


def test_the_references_can_tell_the_options_apart():
    """Each option changes the 3-step result by far more than the tolerance."""
    arrays = fixture()
    x0, grads = arrays["kernel/x0"], [arrays[f"kernel/g{t}"] for t in (1, 2, 3)]
    results = [paper_adafactor(x0, grads, **config) for config in CONFIGS.values()]
    unfactored = paper_adafactor(x0.reshape(-1), [g.reshape(-1) for g in grads], **CONFIGS["paper"])
    for i in range(len(results)):
        for j in range(i):
            assert rel(results[i] - x0, results[j] - x0) > 1e-2
    assert rel(unfactored.reshape(x0.shape) - x0, results[0] - x0) > 1e-2  # factoring is not a no-op


def test_state_is_rows_plus_columns_per_matrix():
    keras.utils.set_random_seed(0)
    model = zoo.get("dec-base", task="causal_lm", **TINY_DEC)
    variables = model.trainable_variables
    shapes = [tuple(v.shape) for v in variables]
    params = sum(math.prod(s) for s in shapes)
    by_hand = sum(4 * (math.prod(s[:-1]) + math.prod(s[:-2] + s[-1:])) if len(s) >= 2 else 4 * math.prod(s)
                  for s in shapes)
    for beta_1, extra in ((None, 0), (0.9, 4 * params)):
        opt = Adafactor(beta_1=beta_1)
        opt.build(variables)
        real = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in slots(opt))
        # The optimizer table's "adafactor" row is the recipes' (no momentum); beta_1 adds one variable-sized slot.
        assert real == by_hand + extra == state_bytes("adafactor", shapes) + extra
    assert by_hand / params < 0.25  # TINY_DEC: hidden 64, vocabulary 128
    keras_adafactor = keras.optimizers.Adafactor()
    keras_adafactor.build(variables)
    assert sum(math.prod(v.shape) * 4 for v in slots(keras_adafactor)) / params > 4  # the full-size velocity
    # One large matrix, built: (rows + cols) * 4 bytes, not rows * cols.
    big = keras.Variable(tf.zeros((1024, 2048)), name="big")
    opt = Adafactor()
    opt.build([big])
    assert [tuple(v.shape) for v in slots(opt)] == [(1024,), (2048,)]
    by_hand = (1024 + 2048) * 4
    assert sum(math.prod(v.shape) * 4 for v in slots(opt)) == by_hand == state_bytes("adafactor", [(1024, 2048)])


def test_sparse_embedding_gradient_equals_its_dense_gradient():
    """Repeated ids: IndexedSlices rows of one id are summed, and the global clip sees the true norm."""
    table = np.random.default_rng(0).normal(0, 0.1, (10, 4)).astype("float32")
    values = tf.constant(np.random.default_rng(1).normal(0, 1, (5, 4)).astype("float32"))
    sparse = tf.IndexedSlices(values, tf.constant([1, 3, 1, 1, 7]), tf.constant([10, 4]))
    results = []
    for grad in (sparse, tf.convert_to_tensor(sparse)):
        v = keras.Variable(table)
        opt = Adafactor(beta_1=0.9, global_clipnorm=0.5, weight_decay=0.1)
        for _ in range(2):
            opt.apply([grad], [v])
        results.append(v.numpy())
    assert np.array_equal(results[0], results[1])
    assert not np.allclose(results[0], table)


VOCAB = 128
CLIP = 0.05  # below the tiny model's gradient norm: the clip scales every step


def tiny_decoder(fused=False, precision="float32", eager=False, **optimizer_args):
    keras.utils.set_random_seed(0)
    model = zoo.get("dec-base", task="causal_lm", checkpointing="full", dtype=precision,
                    **dict(TINY_DEC, num_layers=1, vocab_size=VOCAB, dropout=0.1))  # one block: a cheap trace
    if fused:
        model.set_fused_update(True)
    opt = Adafactor(**optimizer_args)
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    model.compile(optimizer=opt, loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  jit_compile=False, run_eagerly=eager)
    return model


def token_batches(steps=2, batch=2, seq=16):
    ids = np.random.default_rng(1).integers(1, VOCAB, (steps * batch, seq + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((steps * batch, seq), "int32")}
    return tf.data.Dataset.from_tensor_slices((x, ids[:, 1:])).batch(batch)


def test_fused_update_equals_fit():
    """Weight decay, momentum and a global clip that triggers: the fused update calls the
    optimizer's `_apply_weight_decay` and `_backend_update_step` block by block. Both sides eagerly, as
    tests/zoo/test_fused.py compares (the same Python traced or not; ~5 s of tracing saved): the traced fused
    step with this optimizer trains in tests/recipes/test_fused_recipes.py."""
    args = dict(beta_1=0.9, weight_decay=0.1, global_clipnorm=CLIP, eager=True)
    reference = tiny_decoder(**args)
    start = [v.numpy() for v in reference.weights]
    reference.fit(token_batches(), epochs=1, verbose=0)
    fused = tiny_decoder(fused=True, **args)
    fused.fit(token_batches(), epochs=1, verbose=0)
    for a, b, s in zip(fused.weights, reference.weights, start):
        assert rel(a.numpy(), b.numpy()) <= 1e-6, a.path
        if b.trainable:
            assert rel(b.numpy(), s) > 1e-4, b.path  # every trainable weight moved
    for a, b in zip(fused.optimizer.variables, reference.optimizer.variables):
        assert rel(a.numpy(), b.numpy()) <= 1e-6, a.path
    assert int(reference.optimizer.iterations) == int(fused.optimizer.iterations) == 2


def test_mixed_float16_fit_wraps_it_in_loss_scaling():
    model = tiny_decoder(precision="mixed_float16", global_clipnorm=1.0)
    start = [v.numpy() for v in model.trainable_variables]
    model.fit(token_batches(), verbose=0)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, Adafactor)
    assert int(model.optimizer.iterations) == 2  # both steps finite, both applied
    assert all(v.dtype == "float32" for v in slots(model.optimizer.inner_optimizer))
    for v, s in zip(model.trainable_variables, start):
        assert np.all(np.isfinite(v.numpy())) and not np.array_equal(v.numpy(), s), v.path


def test_config_round_trip():
    opt = Adafactor(learning_rate=3e-3, beta_1=0.9, decay_rate=0.7, relative_step=False, scale_parameter=False,
                    weight_decay=0.01, global_clipnorm=1.0)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(again) is Adafactor and again.get_config() == opt.get_config()


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="transformers writes it negative.*drop the sign"):
        Adafactor(decay_rate=-0.8)
    with pytest.raises(ValueError, match=r"beta_1 must be in \[0, 1\) or None"):
        Adafactor(beta_1=1.0)
    with pytest.raises(ValueError, match="or None for no update clipping"):
        Adafactor(clip_threshold=0)
