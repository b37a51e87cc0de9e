"""zoo.ops.grpo and zoo.grpo against TRL's GRPOTrainer (trl 1.16) with a PEFT LoRA adapter on a tiny Llama
(tests/fixtures/grpo, tools/make_grpo_fixtures.py): the advantages from the rewards, the adapters-off reference's
log-probabilities, the loss, its logged figures and every LoRA gradient, for each loss type, beta 0 and 0.04, mu 1
and 2, the three reward scalings and a masked truncated completion."""

import json

import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import REPO
from zoo.grpo import completion_logps
from zoo.ops.grpo import group_advantages, grpo_loss, weighted_rewards

FIXTURES = REPO / "tests" / "fixtures" / "grpo"
WANT = json.loads((FIXTURES / "grpo.json").read_text())
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model():
    model = zoo.hub.load(REPO / "tests/fixtures/dpo/model", tokenizer=False)
    zoo.hub.load_adapter(model, FIXTURES / "adapter")
    return model


def lora_variables(model):
    """{PEFT's parameter name: the zoo's LoRA factor} (the zoo's kernels are PEFT's weights transposed)."""
    return {f"base_model.model.{name}.lora_{part}.weight": getattr(layer, f"lora_kernel_{part.lower()}")
            for name, layer in zoo.lora.adapters(model).items() for part in ("A", "B")}


def batch_of(case):
    batch = {k: tf.constant(v, tf.int32) for k, v in WANT["batch"].items()}
    return {**batch, "completion_mask": tf.constant(case["completion_mask"], tf.int32)}


def rewards_per_function():
    """The two reward functions' outputs on the fixture's rows, None as NaN (the columns they return)."""
    return np.array([[row["score"], np.nan if row["style"] is None else row["style"]] for row in WANT["rows"]],
                    np.float32)


def test_advantages_equal_trl():
    rewards = weighted_rewards(rewards_per_function(), WANT["reward_weights"])
    seen = set()
    for case in WANT["cases"].values():
        if case["scale_rewards"] in seen:
            continue
        seen.add(case["scale_rewards"])
        ours = group_advantages(rewards, WANT["num_generations"], case["scale_rewards"])
        np.testing.assert_allclose(ours, case["advantages"], atol=1e-6, err_msg=case["scale_rewards"])
    assert seen == {"group", "batch", "none"}


def test_reference_is_the_adapters_off_as_trl(model):
    case = WANT["cases"]["grpo-beta0.04-mu1-group"]
    mask = np.array(case["completion_mask"], bool)
    ours = completion_logps(model, batch_of(case), gradients=False, adapters_off=True).numpy()
    assert np.abs(ours - np.array(case["ref_per_token_logps"]))[mask].max() <= TOLERANCE
    policy = completion_logps(model, batch_of(case), gradients=False).numpy()
    assert np.abs(policy - ours)[mask].max() > 1e-3  # the adapters matter


@pytest.mark.parametrize("name", sorted(WANT["cases"]))
def test_loss_and_lora_gradients_equal_trl(model, name, capsys):
    case = WANT["cases"][name]
    batch = batch_of(case)
    rewards = weighted_rewards(rewards_per_function(), WANT["reward_weights"])
    advantages = group_advantages(rewards, WANT["num_generations"], case["scale_rewards"])
    reference = completion_logps(model, batch, gradients=False, adapters_off=True) if case["beta"] else None
    variables = lora_variables(model)
    with tf.GradientTape() as tape:
        logps, entropies = completion_logps(model, batch, entropy=True)
        loss, metrics = grpo_loss(logps, advantages, batch["completion_mask"], case["old_per_token_logps"],
                                  reference, case["loss_type"], case["beta"], WANT["epsilon"], WANT["epsilon_high"],
                                  WANT["max_completion_length"], case["num_items_in_batch"], entropies)
    grads = dict(zip(variables, tape.gradient(loss, list(variables.values()))))
    theirs = np.load(FIXTURES / "gradients.npz")
    names = sorted(k.split("/", 1)[1] for k in theirs if k.startswith(name + "/"))
    assert names == sorted(variables)
    differences = {"loss": abs(float(loss) - case["loss"]),
                   "metrics": max(abs(float(metrics[k]) - v) for k, v in case["metrics"].items()),
                   "gradients": max(np.abs(grads[k].numpy().T - theirs[f"{name}/{k}"]).max() for k in variables)}
    assert sorted(metrics) == sorted(case["metrics"])
    with capsys.disabled():
        print(f"\n{name}: max |zoo - TRL| " + ", ".join(f"{k} {v:.1e}" for k, v in differences.items()))
    assert max(differences.values()) <= TOLERANCE


def test_an_unscorable_completion_leaves_its_group_and_gets_no_advantage():
    """Every function None: TRL leaves the row out of its group's mean and std and gives it advantage 0; a None of
    one function only is skipped in the weighted sum."""
    rewards = weighted_rewards([[1.0, np.nan], [np.nan, np.nan], [0.0, 2.0], [3.0, 1.0]], [1.0, 0.5])
    np.testing.assert_array_equal(rewards[[0, 2, 3]], [1.0, 1.0, 3.5])
    assert np.isnan(rewards[1])
    advantages = group_advantages(rewards, 2, "none")
    np.testing.assert_allclose(advantages, [0.0, 0.0, -1.25, 1.25])


def test_bad_settings_are_refused_by_name():
    logps = tf.zeros([2, 3])
    with pytest.raises(ValueError, match="num_generations must be an integer >= 2"):
        group_advantages([1.0, 2.0], 1)
    with pytest.raises(ValueError, match="3 rewards do not make groups of 2"):
        group_advantages([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="Unknown scale_rewards 'std'"):
        group_advantages([1.0, 2.0], 2, "std")
    with pytest.raises(ValueError, match="Unknown GRPO loss_type 'ppo'"):
        grpo_loss(logps, [1.0, -1.0], tf.ones([2, 3]), loss_type="ppo")
    with pytest.raises(ValueError, match="'dr_grpo' divides by max_completion_length"):
        grpo_loss(logps, [1.0, -1.0], tf.ones([2, 3]), loss_type="dr_grpo")
    with pytest.raises(ValueError, match="pass ref_logps"):
        grpo_loss(logps, [1.0, -1.0], tf.ones([2, 3]), beta=0.04)
    with pytest.raises(ValueError, match="epsilon \\(the PPO clip range\\) must be a number > 0"):
        grpo_loss(logps, [1.0, -1.0], tf.ones([2, 3]), epsilon=0.0)
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        weighted_rewards([[1.0], [2.0]], [1.0, 2.0])


def test_a_training_step_applies_trls_gradients():
    """zoo.grpo.train_step (the reference scored with the adapters off in the step) moves every LoRA factor by
    TRL's gradient: SGD with learning rate 1 subtracts it."""
    import keras

    name = "dapo-beta0.04-mu2-group"
    case = WANT["cases"][name]
    model = zoo.hub.load(REPO / "tests/fixtures/dpo/model", tokenizer=False)
    zoo.hub.load_adapter(model, FIXTURES / "adapter")
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=None)
    settings = zoo.grpo.Grpo(case["loss_type"], case["beta"], WANT["epsilon"], WANT["epsilon_high"],
                             num_generations=WANT["num_generations"],
                             max_completion_length=WANT["max_completion_length"], num_iterations=case["mu"]).check()
    advantages = np.array(case["advantages"], np.float32)
    variables = lora_variables(model)
    before = {k: v.numpy() for k, v in variables.items()}
    loss, _ = zoo.grpo.train_step(model, batch_of(case), advantages, settings, case["old_per_token_logps"],
                                  num_items=case["num_items_in_batch"])
    theirs = np.load(FIXTURES / "gradients.npz")
    assert abs(float(loss) - case["loss"]) <= TOLERANCE
    moved = max(np.abs((before[k] - v.numpy()).T - theirs[f"{name}/{k}"]).max() for k, v in variables.items())
    assert moved <= TOLERANCE


def test_sampling_lays_out_g_completions_per_prompt_as_trl():
    from tests.common import TINY_DEC

    model = zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, vocab_size=61))
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    settings = zoo.grpo.Grpo(num_generations=2, max_completion_length=4)
    free = zoo.grpo.sample(model, prompts, settings, sampler="greedy")
    assert free["truncated"].all() and (free["completion_lengths"] == 4).all()
    stop = int(free["completion_ids"][0, 1])  # the first prompt's second greedy token now ends its completions
    length = free["completion_ids"][0].tolist().index(stop) + 1
    out = zoo.grpo.sample(model, prompts, settings, stop_token_ids=[stop], sampler="greedy")
    np.testing.assert_array_equal(out["prompt_ids"], [[0, 0, 5, 6, 7]] * 2 + [[9, 10, 11, 12, 13]] * 2)
    np.testing.assert_array_equal(out["prompt_mask"], [[0, 0, 1, 1, 1]] * 2 + [[1] * 5] * 2)
    assert out["completion_lengths"][:2].tolist() == [length] * 2 and not out["truncated"][:2].any()
    np.testing.assert_array_equal(out["completion_mask"][0], [1] * length + [0] * (4 - length))
    np.testing.assert_array_equal(out["completion_ids"][0], free["completion_ids"][0, :length].tolist()
                                  + [0] * (4 - length))
    wide = zoo.grpo.sample(model, prompts, settings, stop_token_ids=[stop], sampler="greedy", prompt_multiple=4)
    assert wide["prompt_ids"].shape == (4, 8) and (wide["completion_ids"] == out["completion_ids"]).all()
    scored = [completion_logps(model, {k: tf.constant(b[k]) for k in zoo.grpo.BATCH_KEYS}, gradients=False).numpy()
              for b in (out, wide)]  # more left padding: masked out, and rotary positions shift alike
    np.testing.assert_allclose(scored[1] * out["completion_mask"], scored[0] * out["completion_mask"], atol=1e-5)
    masked = zoo.grpo.sample(model, prompts, zoo.grpo.Grpo(num_generations=2, max_completion_length=4,
                                                           mask_truncated_completions=True),
                             stop_token_ids=[stop], sampler="greedy")
    for i in range(4):
        assert masked["completion_mask"][i].sum() == (0 if masked["truncated"][i] else masked["completion_lengths"][i])
    with pytest.raises(ValueError, match="num_generations must be an integer >= 2"):
        zoo.grpo.Grpo(num_generations=1).check()


def test_int4_base_and_full_checkpointing_train_only_the_adapters_with_the_same_gradients():
    """The memory tools under GRPO: on an int4 base with LoRA, `full` checkpointing (the policy applies under the
    tape, training=False, as TRL's disable_dropout) gives the LoRA gradients `none` gives, the reference being
    the adapters off; one update moves the adapters and nothing of the int4 base."""
    import keras

    from tests.common import TINY_DEC

    keras.utils.set_random_seed(0)
    model = zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, vocab_size=61))
    zoo.quantization.quantize_base(model, "int4")
    zoo.lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
    for adapter in zoo.lora.adapters(model).values():  # B starts at zero: give the adapters something to do
        adapter.lora_kernel_b.assign(tf.random.normal(adapter.lora_kernel_b.shape, stddev=0.1, seed=1))
    settings = zoo.grpo.Grpo("grpo", beta=0.04, num_generations=2, max_completion_length=5).check()
    batch = zoo.grpo.sample(model, [[5, 6, 7], [9, 10, 11, 12]], settings, seed=3)
    batch = {k: tf.constant(batch[k]) for k in zoo.grpo.BATCH_KEYS}
    advantages = tf.constant([1.0, -1.0, 0.5, -0.5])

    def lora_gradients(policy):
        model.set_checkpointing(policy)
        reference = completion_logps(model, batch, gradients=False, adapters_off=True)
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            logps = completion_logps(model, batch)
            loss, _ = grpo_loss(logps, advantages, batch["completion_mask"], None, reference, "grpo", 0.04)
        return [g.numpy() for g in tape.gradient(loss, variables)]

    none, full = lora_gradients("none"), lora_gradients("full")
    factors = {id(getattr(a, f"lora_kernel_{p}")) for a in zoo.lora.adapters(model).values() for p in "ab"}
    assert {id(v) for v in model.trainable_variables} == factors  # the adapters' A and B only
    assert max(np.abs(a).max() for a in none) > 1e-3
    for a, b in zip(none, full):
        np.testing.assert_allclose(b, a, atol=1e-6)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=None)
    frozen = {v.path: v.numpy() for v in model.non_trainable_variables if "seed_generator" not in v.path}
    assert any(v.dtype == "int8" for v in model.non_trainable_variables)  # int4 packed two to a byte
    trained = {v.path: v.numpy() for v in model.trainable_variables}
    zoo.grpo.train_step(model, batch, advantages, settings)
    variables = {v.path: v for v in model.variables}
    assert [p for p, v in frozen.items() if not np.array_equal(variables[p].numpy(), v)] == []
    assert all(not np.array_equal(v.numpy(), trained[v.path]) for v in model.trainable_variables)


def test_the_fused_update_takes_the_step_the_tape_takes():
    """Full weights, `full` checkpointing, beta 0: under the fused update (each block updated as its gradients
    appear, after the exact global clip's norm pass) a GRPO step gives the loss, the figures and the weights of the
    plain update."""
    import keras

    from tests.common import TINY_DEC

    settings = zoo.grpo.Grpo("grpo", num_generations=2, max_completion_length=5).check()
    models = []
    for fused in (False, True):
        keras.utils.set_random_seed(0)
        model = zoo.get("dec-base", task="causal_lm", checkpointing="full", **dict(TINY_DEC, vocab_size=61))
        model.set_fused_update(fused)
        model.compile(optimizer=keras.optimizers.SGD(0.5, global_clipnorm=0.01), loss=None)
        models.append(model)
    batch = zoo.grpo.sample(models[0], [[5, 6, 7], [9, 10, 11, 12]], settings, seed=3)
    batch = {k: tf.constant(batch[k]) for k in zoo.grpo.BATCH_KEYS}
    advantages = tf.constant([1.0, -1.0, 0.5, -0.5])
    before = [v.numpy() for v in models[0].trainable_variables]
    (plain_loss, plain), (fused_loss, fused) = [zoo.grpo.train_step(m, batch, advantages, settings) for m in models]
    assert abs(float(plain_loss) - float(fused_loss)) <= 1e-6
    assert all(abs(float(plain[k]) - float(fused[k])) <= 1e-6 for k in plain)
    for a, b in zip(models[0].trainable_variables, models[1].trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-6)
    assert max(np.abs(a.numpy() - s).max() for s, a in zip(before, models[0].trainable_variables)) > 1e-4
