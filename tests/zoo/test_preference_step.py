"""zoo.preference: the DPO / SimPO training step with no second model. The reference with LoRA's adapters
off is the base model exactly; stored reference log-probabilities train exactly as the in-step reference;
the step's loss, rewards and gradients are the ops' on the policy's and reference's scores; bad settings
are refused by name. Parity with TRL's DPOTrainer + PEFT: tests/recipes/test_dpo.py."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import REPO, TINY_DEC
from zoo.ops.preference import dpo_loss, sequence_logps

VOCAB, PAIRS, SEQ = 97, 4, 12


def tiny(seed=0, lora=True):
    keras.utils.set_random_seed(seed)
    model = zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, vocab_size=VOCAB))
    if lora:
        zoo.lora.enable_lora(model, rank=4, alpha=8, targets="all-linear")
        rng = np.random.default_rng(seed + 1)
        for layer in zoo.lora.adapters(model).values():  # B is zero at first: make the adapters matter
            layer.lora_kernel_b.assign(rng.normal(0, 0.05, layer.lora_kernel_b.shape).astype("float32"))
    return model


def batch(seed=0):
    rng = np.random.default_rng(seed)
    x = {"token_ids": rng.integers(1, VOCAB, (PAIRS, 2, SEQ)).astype("int32"),
         "padding_mask": np.ones((PAIRS, 2, SEQ), "int32")}
    weights = np.zeros((PAIRS, 2, SEQ), "float32")
    for p in range(PAIRS):  # uneven prompts and completions, right-padded
        start, end = 2 + p % 3, SEQ - (p % 2) * 3
        weights[p, :, start:end] = 1
        x["padding_mask"][p, :, end:] = 0
    y = {"targets": rng.integers(1, VOCAB, (PAIRS, 2, SEQ)).astype("int32"), "weights": weights}
    return x, y


def scores(model, x, y):
    rows = zoo.preference.rows
    hidden = model.backbone({k: rows(tf.constant(v)) for k, v in x.items()})["sequence_output"]
    return sequence_logps(hidden, model.lm_logits, rows(tf.constant(y["targets"])), rows(tf.constant(y["weights"])),
                          chunk_size=4, gradients=False).numpy()


def test_adapters_off_is_the_base_model_exactly():
    x, y = batch()
    with_lora = tiny(lora=True)
    base = tiny(lora=False)
    with zoo.lora.adapters_off(with_lora):
        off = scores(with_lora, x, y)
    np.testing.assert_array_equal(off, scores(base, x, y))
    assert np.abs(scores(with_lora, x, y) - off).max() > 1e-3  # the adapters are on again, and they matter
    with pytest.raises(ValueError, match="no LoRA adapters to switch off"):
        with zoo.lora.adapters_off(base):
            pass


def one_step(model, data, **settings):
    zoo.preference.set_preference(model, "dpo", beta=0.1, **settings)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=None)
    logs = model.train_on_batch(*data, return_dict=True)
    return logs, [v.numpy() for v in model.trainable_variables]


def test_stored_reference_trains_as_the_in_step_reference():
    x, y = batch()
    model = tiny()
    start = [v.numpy() for v in model.trainable_variables]
    stored = zoo.preference.reference_logps(model, [(x, y)], adapters_off=True)
    assert stored.shape == (PAIRS, 2)
    logs_in_step, weights_in_step = one_step(model, (x, y), reference="adapters")
    model = tiny()
    logs_stored, weights_stored = one_step(model, (x, {**y, "reference_logps": stored}), reference="stored")
    for name in logs_in_step:
        np.testing.assert_allclose(logs_stored[name], logs_in_step[name], rtol=1e-6, atol=1e-7, err_msg=name)
    moved = max(np.abs(a - b).max() for a, b in zip(weights_stored, start))
    assert moved > 1e-4
    for a, b in zip(weights_stored, weights_in_step):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_the_policy_pass_recomputes_its_blocks_without_dropout(monkeypatch):
    """The policy runs under the tape with training=False (dropout off, as TRL's disable_dropout): `full` still
    recomputes each block there (it once kept every activation: dec-1b DPO 11.4 GiB against SFT's 2.1), and
    the step is the one without recomputation."""
    from zoo.layers import block

    replays = []

    def counted(fn, *tensors):
        replays.append(fn)
        return real(fn, *tensors)

    real = block.recompute
    monkeypatch.setattr(block, "recompute", counted)
    x, y = batch(5)
    model = tiny(6)
    model.set_checkpointing("full")
    _, recomputed = one_step(model, (x, y))
    assert len(replays) == TINY_DEC["num_layers"]  # the policy pass's blocks; the reference pass has no tape
    _, kept = one_step(tiny(6), (x, y))
    for a, b in zip(recomputed, kept):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_the_step_is_the_dpo_loss_of_the_scores_and_its_metrics():
    x, y = batch(1)
    model = tiny(2)
    with zoo.lora.adapters_off(model):
        reference = scores(model, x, y)
    policy = scores(model, x, y)
    losses, chosen, rejected = dpo_loss(policy[:PAIRS], policy[PAIRS:], reference[:PAIRS], reference[PAIRS:], 0.1)
    zoo.preference.set_preference(model, "dpo", beta=0.1)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=None)
    logs = model.test_on_batch(x, y, return_dict=True)
    np.testing.assert_allclose(logs["loss"], np.mean(losses), rtol=1e-6)
    np.testing.assert_allclose(logs["rewards/chosen"], np.mean(chosen), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logs["rewards/margins"], np.mean(chosen - rejected), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logs["rewards/accuracies"], np.mean(chosen > rejected))
    np.testing.assert_allclose(logs["logps/rejected"], policy[PAIRS:].mean(), rtol=1e-6)


def test_gradients_are_those_of_the_mean_loss_with_the_reference_held():
    x, y = batch(3)
    model = tiny(4)
    with zoo.lora.adapters_off(model):
        reference = tf.constant(scores(model, x, y))
    rows = zoo.preference.rows
    variables = model.trainable_variables
    with tf.GradientTape() as tape:  # whole logits, no chunks: an independent route to the same gradient
        hidden = model.backbone({k: rows(tf.constant(v)) for k, v in x.items()})["sequence_output"]
        per = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=rows(tf.constant(y["targets"])),
                                                               logits=model.lm_logits(hidden))
        policy = tf.reduce_sum(per * rows(tf.constant(y["weights"])), axis=1)
        losses, _, _ = dpo_loss(policy[:PAIRS], policy[PAIRS:], reference[:PAIRS], reference[PAIRS:], 0.1)
        loss = tf.reduce_mean(losses)
    expected = [g.numpy() for g in tape.gradient(loss, variables)]
    before = [v.numpy() for v in variables]
    _, after = one_step(model, (x, y))  # SGD(0.5): w - 0.5 g
    for w0, w1, g in zip(before, after, expected):
        np.testing.assert_allclose((w0 - w1) / 0.5, g, rtol=1e-4, atol=1e-6)


def test_simpo_trains_without_a_reference():
    x, y = batch(5)
    model = tiny(6, lora=False)
    zoo.preference.set_preference(model, "simpo", beta=2.0, gamma=1.0)
    model.compile(optimizer=keras.optimizers.SGD(1e-2), loss=None, run_eagerly=True)  # numpy batches reach the step
    first = model.train_on_batch(x, y, return_dict=True)["loss"]
    for _ in range(3):
        last = model.train_on_batch(x, y, return_dict=True)["loss"]
    assert last < first


def test_bad_settings_and_batches_are_refused_by_name():
    with_lora, base = tiny(), tiny(lora=False)
    with pytest.raises(ValueError, match="beta must be a positive number"):
        zoo.preference.set_preference(with_lora, "dpo", beta=0.0)
    with pytest.raises(ValueError, match="beta must be a positive number"):
        zoo.preference.set_preference(with_lora, "dpo", beta=-1)
    with pytest.raises(ValueError, match="Unknown DPO loss_type 'hinge'"):
        zoo.preference.set_preference(with_lora, "dpo", loss_type="hinge")
    with pytest.raises(ValueError, match="Unknown preference loss 'orpo'"):
        zoo.preference.set_preference(with_lora, "orpo")
    with pytest.raises(ValueError, match="SimPO has no reference"):
        zoo.preference.set_preference(with_lora, "simpo", reference="adapters")
    with pytest.raises(ValueError, match="this model has no LoRA"):
        zoo.preference.set_preference(base, "dpo", reference="adapters")
    assert zoo.preference.set_preference(base, "dpo").reference == "stored"  # "auto" without LoRA
    base.compile(optimizer=keras.optimizers.SGD(0.1), loss=None)
    x, y = batch()
    with pytest.raises(ValueError, match="reference='stored' reads each batch's y\\['reference_logps'\\]"):
        base.train_on_batch(x, y)
    with pytest.raises(ValueError, match="'token_ids' of shape \\[pairs, 2, sequence\\]"):
        base.train_on_batch({k: v[:, 0] for k, v in x.items()}, y)
    with pytest.raises(ValueError, match="Preference tuning scores completions with an LM head"):
        zoo.preference.set_preference(zoo.get("enc-base", task="masked_lm", num_layers=1, hidden_dim=32,
                                              num_heads=2, intermediate_dim=64, vocab_size=VOCAB), "dpo")


def test_the_planner_counts_two_rows_a_pair_and_refuses_what_the_step_refuses():
    lora = dict(lora_rank=16, lora_targets="all-linear", quantize="int4")
    pairs = zoo.memory.estimate("dec-1b", 2, 1024, "mixed_bfloat16", "full", preference=True, **lora)
    rows = zoo.memory.estimate("dec-1b", 4, 1024, "mixed_bfloat16", "full", **lora)
    assert pairs.total == rows.total > zoo.memory.estimate("dec-1b", 2, 1024, "mixed_bfloat16", "full", **lora).total
    with pytest.raises(ValueError, match="without the fused update or packed rows"):
        zoo.memory.estimate("dec-1b", 2, 1024, "mixed_bfloat16", "full", fused=True, preference=True)


# --- parity with TRL's DPOTrainer + PEFT (tests/fixtures/dpo_peft, tools/make_dpo_peft_fixtures.py) -------------
def trl_pairs():
    """tests/fixtures/dpo's padded batch (TRL's collator: chosen rows, then rejected) as [pairs, 2, S] rows; its
    last pair has an empty prompt and no BOS."""
    batch = {k: np.array(v) for k, v in json.loads((REPO / "tests/fixtures/dpo/expected.json").read_text())[
        "batch"].items()}
    half = len(batch["input_ids"]) // 2
    pair = lambda a: np.stack([a[:half], a[half:]], axis=1)  # noqa: E731
    ids, mask, completion = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    x = {"token_ids": pair(ids[:, :-1]).astype("int32"), "padding_mask": pair(mask[:, :-1]).astype("int32")}
    return x, {"targets": pair(ids[:, 1:]).astype("int32"), "weights": pair(completion[:, 1:]).astype("float32")}


PEFT = REPO / "tests" / "fixtures" / "dpo_peft"


def fixture_lora_model(**preference):
    model = zoo.hub.load(REPO / "tests/fixtures/dpo/model", tokenizer=False)
    zoo.hub.load_adapter(model, PEFT / "adapter")
    zoo.preference.set_preference(model, "dpo", **preference)  # the reference: the adapters off, as TRL's
    return model


def lora_gradients(model, x, y):
    """({PEFT's name: LoRA factor}, {PEFT's name: d loss / d it, PEFT's layout}) through the step's own pieces:
    its reference, scores and loss (the lengths IPO divides by included)."""
    adapters = zoo.lora.adapters(model)
    variables = {f"base_model.model.{name}.lora_{part}.weight": getattr(layer, f"lora_kernel_{part.lower()}")
                 for name, layer in adapters.items() for part in ("A", "B")}
    step = model.preference_step
    with tf.GradientTape() as tape:
        inputs, targets, weights = step._rows(x, y)
        reference = step._reference(model, inputs, targets, weights, y)
        loss = step._loss(zoo.preference.sequence_scores(model, inputs, targets, weights), reference, weights)
    grads = tape.gradient(loss, list(variables.values()))
    return variables, {k: g.numpy().T for k, g in zip(variables, grads)}


def test_lora_dpo_equals_trl_dpo_trainer_with_peft(capsys):
    want = json.loads((PEFT / "peft.json").read_text())
    assert want["versions"]["trl"] == "1.16.0" and want["loss_type"] == "sigmoid"
    model = fixture_lora_model(beta=want["beta"])
    x, y = trl_pairs()
    figures = {"ref": zoo.preference.reference_logps(model, [(x, y)], adapters_off=True),
               "policy": zoo.preference.reference_logps(model, [(x, y)])}
    differences = {
        "reference logps": np.abs(figures["ref"] - np.stack([want["ref_chosen_logps"], want["ref_rejected_logps"]],
                                                            1)).max(),
        "policy logps": np.abs(figures["policy"] - np.stack([want["chosen_logps"], want["rejected_logps"]], 1)).max()}
    # Keras folds Adam's bias corrections into the learning rate, so its epsilon meets sqrt(v) where torch's meets
    # sqrt(v / (1 - beta_2^t)): at step 1, Keras' epsilon * sqrt(1 - beta_2) is torch's epsilon.
    adamw = keras.optimizers.AdamW(1e-3, weight_decay=0.0, epsilon=1e-8 * np.sqrt(1 - 0.999), global_clipnorm=1.0)
    model.compile(optimizer=adamw, loss=None)

    variables, grads = lora_gradients(model, x, y)  # before the step below moves them
    theirs = np.load(PEFT / "peft_gradients.npz")
    assert sorted(theirs) == sorted(variables)  # every LoRA factor, no other trained variable
    differences["gradients"] = max(np.abs(grads[k] - theirs[k]).max() for k in variables)
    assert np.sqrt(sum(np.sum(g ** 2) for g in grads.values())) == pytest.approx(want["grad_norm"], rel=1e-5)

    assert want["grad_norm"] > 1.0  # the step below clips
    # one AdamW step, clipped to global norm 1.0 (TRL's norm was 1.14); its logs are the loss and metrics of the
    # weights before it (one trace: test_on_batch would trace the same forward again)
    logs = model.train_on_batch(x, y, return_dict=True)
    differences["loss"] = abs(logs["loss"] - want["loss"])
    differences["metrics"] = max(abs(logs[k] - v) for k, v in want["metrics"].items())
    after = np.load(PEFT / "peft_after_step.npz")
    differences["after one AdamW step"] = max(np.abs(v.numpy().T - after[k]).max() for k, v in variables.items())
    with capsys.disabled():
        print("\nLoRA DPO vs TRL DPOTrainer + PEFT, max |zoo - TRL|: "
              + ", ".join(f"{k} {v:.1e}" for k, v in differences.items()))
    # the log-probabilities are float32 sums near -42, 3.8e-6 apart: within 4 of those steps (TRL's own values moved
    # by one between two machines); the rest within the 1e-5
    spacing = np.spacing(np.float32(np.abs(figures["policy"]).max()))
    assert max(differences.pop("reference logps"), differences.pop("policy logps")) <= 4 * spacing
    assert max(differences.values()) <= 1e-5


def test_lora_ipo_equals_trl_on_the_tokens_scored(capsys):
    """The issue's case: TRL's IPO step (β 0.5, LoRA, the adapters-off reference) on a batch whose last pair has an
    empty prompt and no BOS, so that its completions' first token has no prediction. zoo's step equals TRL's step
    on the batch whose completion mask marks the tokens scored (position 0 cleared) in loss, metrics and every
    LoRA gradient. trl 1.16 as it is divides that pair's log-ratios by one token more than it sums: its loss and
    gradients differ by the figures recorded (docs/dpo.md)."""
    want = json.loads((PEFT / "peft.json").read_text())["ipo"]
    assert want["loss_type"] == "ipo"
    model = fixture_lora_model(beta=want["beta"], loss_type="ipo")
    x, y = trl_pairs()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=None)
    logs = model.test_on_batch(x, y, return_dict=True)
    variables, grads = lora_gradients(model, x, y)
    theirs = np.load(PEFT / "peft_ipo_gradients.npz")
    assert sorted(theirs) == sorted(variables)
    largest = max(np.abs(g).max() for g in theirs.values())
    differences = {"loss": abs(logs["loss"] - want["loss_scored"]),
                   "metrics": max(abs(logs[k] - v) for k, v in want["metrics"].items()),
                   "gradients (relative to the largest)": max(np.abs(grads[k] - theirs[k]).max()
                                                              for k in grads) / largest}
    with capsys.disabled():
        print("\nLoRA IPO vs TRL on the tokens scored, max |zoo - TRL|: "
              + ", ".join(f"{k} {v:.1e}" for k, v in differences.items())
              + f"; TRL as it is: loss {want['loss']:.4f} (zoo {logs['loss']:.4f}), gradients "
              f"{want['gradients_apart']:.1%} of the largest apart")
    assert max(differences.values()) <= 1e-5
    assert abs(logs["loss"] - want["loss"]) > 1e-2  # the batch tells the two counts apart
