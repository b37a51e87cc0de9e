"""Preference-tuning ops (zoo/ops/preference.py): the chunked per-sequence log-probabilities equal the
whole-logits computation in value and gradients (tied, untied and frozen heads; float32 and mixed_bfloat16),
and on a tiny Llama that TRL itself scored (tests/fixtures/dpo, tools/make_dpo_fixtures.py: trl 1.16,
transformers 5.24) zoo's log-probabilities, DPO / IPO / robust / conservative-DPO / SimPO losses, rewards,
metrics and gradients equal TRL's to 1e-5. One pair has an empty prompt and no BOS (its completions start at
position 0, which nothing predicts): there trl 1.16's IPO divides by one token more than it scores, and zoo's
IPO is TRL's on the scored tokens (docs/dpo.md)."""

import functools
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from tests.common import REPO, TINY_DEC, allocator_peak
from zoo import hub
from zoo.ops.preference import METRIC_NAMES, dpo_loss, preference_metrics, sequence_logps, simpo_loss, token_logps

FIXTURES = REPO / "tests" / "fixtures" / "dpo"
VOCAB = 97
BATCH = 3
TOLERANCE = 1e-5  # the parity bar with TRL


def decoder(tied, frozen=False):
    keras.utils.set_random_seed(0)
    model = zoo.get("dec-base", task="causal_lm", **dict(TINY_DEC, vocab_size=VOCAB, tie_embeddings=tied))
    model.backbone.token_embedding.trainable = not frozen
    return model


@functools.cache
def shared_decoder(tied, frozen=False):
    """One float32 decoder per head for the tests that only read its head (`lm_logits`, its variables)."""
    return decoder(tied, frozen)


def data(seq, dtype="float32"):
    rng = np.random.default_rng(seq)
    h = tf.cast(rng.standard_normal((BATCH, seq, 64)).astype("float32"), dtype)
    y = tf.constant(rng.integers(0, VOCAB, (BATCH, seq)), tf.int32)
    w = (rng.uniform(size=(BATCH, seq)) < 0.6).astype("float32")
    w[:, 0] = 1.0
    coefficients = tf.constant(rng.standard_normal(BATCH).astype("float32"))  # a different d loss / d logps per row
    return h, y, tf.constant(w), coefficients


def whole(model, y, w):
    """The reference: the whole [B, S, vocab] logits."""
    def logps(h):
        per = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model.lm_logits(h))
        return tf.reduce_sum(per * w, axis=1)
    return logps


def value_and_grads(model, logps_fn, h, coefficients, compile_):
    variables = model.backbone.token_embedding.trainable_variables

    def run(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            logps = logps_fn(h)
            objective = tf.reduce_sum(logps * coefficients)
        grads = tape.gradient(objective, [h, *variables])
        return logps, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in
                       zip(grads, [h, *variables])]

    logps, grads = (tf.function(run) if compile_ else run)(h)
    return logps.numpy(), [g.numpy().astype("float32") for g in grads]


def relative(ref, got):
    """max |difference| relative to the reference tensor's largest entry."""
    return float(np.abs(ref - got).max() / max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("head", ["tied", "untied", "frozen"])
@pytest.mark.parametrize("seq,chunk", [(16, 4), (13, 5)])
def test_sequence_logps_equals_whole_logits(head, seq, chunk):
    model = shared_decoder(tied=head != "untied", frozen=head == "frozen")
    h, y, w, coefficients = data(seq)
    ref_logps, ref_grads = value_and_grads(model, whole(model, y, w), h, coefficients, compile_=False)
    # d hidden, then the head's variables: the tied table, or (untied) the input table (no gradient here) and the head
    assert len(ref_grads) == {"frozen": 1, "tied": 2, "untied": 3}[head]
    assert np.abs(ref_grads[0]).max() > 0 and np.abs(ref_grads[-1]).max() > 0
    for compile_ in (False, True):
        logps, grads = value_and_grads(model, lambda x: sequence_logps(x, model.lm_logits, y, w, chunk), h,
                                       coefficients, compile_)
        np.testing.assert_allclose(logps, ref_logps, rtol=1e-6)
        for r, g in zip(ref_grads, grads):
            assert relative(r, g) < 1e-6


@pytest.mark.parametrize("head", ["tied", "untied", "frozen"])
def test_token_logps_and_entropies_equal_whole_logits(head):
    """GRPO's per-token log-probabilities: a different d loss / d logp at every position reaches the hidden states
    and the head as through the whole logits; the entropies are the whole distributions'."""
    model = shared_decoder(tied=head != "untied", frozen=head == "frozen")
    h, y, _, _ = data(13)
    coefficients = tf.constant(np.random.default_rng(5).standard_normal((BATCH, 13)).astype("float32"))
    log_probs = lambda x: tf.nn.log_softmax(model.lm_logits(x))  # noqa: E731
    whole_tokens = lambda x: tf.gather(log_probs(x), y, batch_dims=2)  # noqa: E731
    ref_logps, ref_grads = value_and_grads(model, whole_tokens, h, coefficients, compile_=False)
    for compile_ in (False, True):
        logps, grads = value_and_grads(model, lambda x: token_logps(x, model.lm_logits, y, 5), h, coefficients,
                                       compile_)
        np.testing.assert_allclose(logps, ref_logps, rtol=1e-6, atol=1e-6)
        for r, g in zip(ref_grads, grads):
            assert relative(r, g) < 1e-6
    _, entropies = token_logps(h, model.lm_logits, y, 5, gradients=False, entropy=True)
    expected = -tf.reduce_sum(tf.exp(log_probs(h)) * log_probs(h), axis=-1)
    np.testing.assert_allclose(entropies.numpy(), expected.numpy(), rtol=1e-5)


def test_sequence_logps_without_gradients():
    model = shared_decoder(tied=True, frozen=False)
    h, y, w, _ = data(13)
    with tf.GradientTape() as tape:
        tape.watch(h)
        logps = sequence_logps(h, model.lm_logits, y, w, 5, gradients=False)
    np.testing.assert_allclose(logps.numpy(), whole(model, y, w)(h).numpy(), rtol=1e-6)
    assert tape.gradient(logps, h) is None


@pytest.mark.parametrize("head", ["untied", "frozen"])
def test_sequence_logps_mixed_bfloat16(head):
    """bfloat16 hidden states and head compute, float32 logits: per-row values and d hidden agree closely,
    the head's gradient (a bfloat16 matmul summed over positions, per chunk here) at bfloat16's precision
    (test_lm_loss's tolerances)."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = decoder(tied=False, frozen=head == "frozen")
        h, y, w, coefficients = data(13, dtype="bfloat16")
        ref_logps, ref_grads = value_and_grads(model, whole(model, y, w), h, coefficients, compile_=True)
        logps, grads = value_and_grads(model, lambda x: sequence_logps(x, model.lm_logits, y, w, 5), h,
                                       coefficients, compile_=True)
    finally:
        keras.config.set_dtype_policy("float32")
    np.testing.assert_allclose(logps, ref_logps, rtol=1e-6)
    assert relative(ref_grads[0], grads[0]) < 1e-2
    for r, g in zip(ref_grads[1:], grads[1:]):
        assert relative(r, g) < 2e-2


MEMORY_SHAPE = (3, 512, 8000, 64, 64)  # batch, positions, vocabulary, hidden, chunk: the memory tests' shape


def memory_inputs():
    """(head, hidden states, labels) at MEMORY_SHAPE: the whole float32 logits 47 MiB, a chunk's 5.9 MiB."""
    batch, seq, vocab, hidden, _ = MEMORY_SHAPE
    keras.utils.set_random_seed(0)
    head = keras.layers.Dense(vocab, use_bias=False)
    head.build((None, None, hidden))
    return head, tf.random.normal([batch, seq, hidden]), tf.random.uniform([batch, seq], 0, vocab, tf.int32)


@pytest.mark.memory
def test_gradient_memory_is_chunk_sized():
    """Allocator peak of a tf.function gradient computation: the whole logits are 3 x 512 x 8000 float32
    (47 MiB); the chunked log-probabilities hold a chunk's, with a trainable head and with a frozen one."""
    batch, seq, vocab, hidden, chunk = MEMORY_SHAPE
    head, h, y = memory_inputs()
    w = tf.ones([batch, seq])

    def peak(logps_fn):
        @tf.function
        def step(h):
            with tf.GradientTape() as tape:
                tape.watch(h)
                loss = tf.reduce_sum(logps_fn(h) * tf.constant([1.0, -2.0, 0.5]))
            grads = tape.gradient(loss, [h, *head.trainable_variables])
            return loss, [tf.reduce_sum(g) for g in grads]

        # measured alone: after the unmeasured first call every call peaked the same to 0.01 MiB (6 calls of each of
        # the three, oneDNN on and off); CI's flipped run (oneDNN off, after the other memory tests, beside the suite)
        # once read 25.0 MiB in both of two calls of the trainable head against 10-18 alone: the least of four
        return allocator_peak(lambda: float(step(h)[0]), repeats=4)

    def full(x):
        return tf.reduce_sum(-tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=head(x)) * w, axis=1)

    logits = batch * seq * vocab * 4
    peaks = {"whole": peak(full), "trainable": peak(lambda x: sequence_logps(x, head, y, w, chunk))}
    head.trainable = False
    peaks["frozen"] = peak(lambda x: sequence_logps(x, head, y, w, chunk))
    print(f"\nallocator peaks (MiB): { {k: round(v / 2**20, 1) for k, v in peaks.items()} }")
    assert peaks["whole"] > logits, peaks  # the allocator sees the whole logits: the measurement is real
    chunk_bytes = 3 * batch * chunk * vocab * 4  # logits, softmax, d logits of one chunk
    grads = batch * seq * hidden * 4 + vocab * hidden * 4
    for name in ("trainable", "frozen"):
        assert peaks[name] < 0.5 * peaks["whole"], peaks
        assert peaks[name] <= chunk_bytes + 3 * grads, peaks


@pytest.mark.memory
def test_the_logged_entropy_adds_one_rows_logits_at_most():
    """GRPO's update takes the per-token log-probabilities and TRL's logged entropy under a tape (frozen head: LoRA)
    or rebuilds each chunk in the backward (trainable head). The entropy is taken a row at a time before each chunk's
    cross-entropy: one row's [chunk, vocab] temporary more, not a chunk's nor every chunk's."""
    batch, seq, vocab, hidden, chunk = MEMORY_SHAPE
    head, h, y = memory_inputs()

    def step(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            logps, entropies = token_logps(h, head, y, chunk, entropy=True)
            loss = tf.reduce_sum(logps * tf.constant([[1.0], [-2.0], [0.5]]))
        grads = tape.gradient(loss, [h, *head.trainable_variables])
        return loss, tf.reduce_sum(entropies), [tf.reduce_sum(g) for g in grads]

    one_chunk = batch * chunk * vocab * 4  # [batch, chunk, vocab] float32: 5.9 MiB
    for trainable in (True, False):
        head.trainable = trainable
        traced = tf.function(step)  # traced per head: token_logps reads its trainable variables when traced
        peak = allocator_peak(lambda: float(traced(h)[0]), repeats=2)
        print(f"\ntrainable head {trainable}: {peak / one_chunk:.2f} chunks")
        # Measured (oneDNN on and off), in chunks: 2.2-3.1 without the entropy (the logits, their softmax gradient,
        # the head's matmul gradient), 3.1-3.44 with it (one row of three more). The whole chunk's entropy ordered
        # the same way peaked at 4.5-4.8, the log-softmax read beside the cross-entropy at 6.5-10.0. With oneDNN off
        # after the other memory tests in one process (test_measure.py's flipped run) the fixed form read 3.75 and
        # 4.03: bound 5.5, below the old form's least by 1 chunk (the whole-chunk form is not told apart here).
        assert peak <= 5.5 * one_chunk, (trainable, peak / one_chunk)


# --- parity with TRL ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def expected():
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(scope="module")
def fixture_model():
    return hub.load(FIXTURES / "model", tokenizer=False)


def pair_inputs(expected):
    """TRL's batch (chosen rows, then rejected rows) and what sequence_logps takes: hidden[:, :-1] predicts
    token_ids[:, 1:]; the weights are the shifted completion mask, and the lengths the step divides by (IPO,
    SimPO) their sums, the tokens scored."""
    batch = {k: np.array(v) for k, v in expected["batch"].items()}
    x = {"token_ids": batch["input_ids"].astype("int32"), "padding_mask": batch["attention_mask"].astype("int32")}
    weights = batch["completion_mask"][:, 1:].astype("float32")
    return x, x["token_ids"][:, 1:], weights, weights.sum(1)


def zoo_logps(model, expected, chunk_size=4):
    x, labels, weights, _ = pair_inputs(expected)
    hidden = model.backbone(x)["sequence_output"]
    return sequence_logps(hidden[:, :-1], model.lm_logits, labels, weights, chunk_size)


def test_fixture_is_trl_1_16(expected):
    assert expected["versions"]["trl"] == "1.16.0"
    # TRL's fused LM head and transformers' whole logits agree (the fixture's own cross-check)
    np.testing.assert_allclose(expected["logps_fused"], expected["logps_logits"], rtol=0, atol=1e-5)


def test_logps_equal_trl(fixture_model, expected, capsys):
    logps = zoo_logps(fixture_model, expected).numpy()
    difference = float(np.abs(logps - np.array(expected["logps_fused"])).max())
    with capsys.disabled():
        print(f"\nmax |zoo - TRL| per-sequence log-probability: {difference:.2e} (values {logps.min():.1f}.."
              f"{logps.max():.1f})")
    assert difference <= TOLERANCE


def split(values):
    values = np.asarray(values, "float32")
    return values[:len(values) // 2], values[len(values) // 2:]


CASES = {"dpo-sigmoid": dict(loss_type="sigmoid"), "dpo-ipo-scored": dict(loss_type="ipo"),
         "dpo-robust": dict(loss_type="robust", label_smoothing=0.1),
         "dpo-cdpo": dict(loss_type="sigmoid", label_smoothing=0.1)}  # TRL's loss_type="aot" on one pair


def zoo_loss(case, expected, logps, lengths=None):
    """zoo's (losses, chosen_rewards, rejected_rewards) for a fixture case, from [2P] log-probabilities; the
    lengths (IPO, SimPO) default to the step's, the tokens scored."""
    chosen, rejected = logps[:len(logps) // 2], logps[len(logps) // 2:]
    lengths = split(pair_inputs(expected)[3] if lengths is None else lengths)
    options = expected["cases"][case]
    if case == "simpo":
        return simpo_loss(chosen, rejected, *lengths, beta=options["beta"], gamma=options["gamma"])
    return dpo_loss(chosen, rejected, expected["ref_chosen_logps"], expected["ref_rejected_logps"],
                    beta=options["beta"], chosen_lengths=lengths[0], rejected_lengths=lengths[1],
                    **CASES.get(case, dict(loss_type=options["loss_type"])))


def test_the_fixture_holds_a_pair_with_an_empty_prompt_and_no_bos(expected):
    """The last pair's completions start at position 0 (no prompt, no BOS): their first token has no
    prediction, so each side scores one token fewer than its completion holds; every other pair's prompt
    comes first, and its completion's tokens are the tokens scored."""
    mask = np.array(expected["batch"]["completion_mask"])
    pairs = len(expected["pairs"])
    assert expected["pairs"][-1]["prompt_ids"] == [] and all(p["prompt_ids"] for p in expected["pairs"][:-1])
    unscored = [0] * (pairs - 1) + [1]
    assert mask[:, 0].tolist() == unscored * 2
    assert (mask.sum(1) - pair_inputs(expected)[3]).tolist() == unscored * 2


@pytest.mark.parametrize("case", [*CASES, "simpo"])
def test_losses_rewards_and_metrics_equal_trl(case, expected):
    """Given TRL's log-probabilities, zoo's losses and metrics are TRL's (IPO: TRL's on the batch whose
    completion mask marks the tokens scored, "dpo-ipo-scored"; the next test shows the one difference)."""
    options = expected["cases"][case]
    logps = np.array(expected["logps_fused"], "float32")
    losses, chosen_rewards, rejected_rewards = zoo_loss(case, expected, logps)
    np.testing.assert_allclose(losses.numpy(), options["losses"], rtol=0, atol=TOLERANCE)
    assert float(tf.reduce_mean(losses)) == pytest.approx(options["loss"], abs=TOLERANCE)
    if case == "simpo":
        average = split(options["average_logps"])
        np.testing.assert_allclose(chosen_rewards.numpy(), options["chosen_rewards"], rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(rejected_rewards.numpy(), options["rejected_rewards"], rtol=0, atol=TOLERANCE)
        metrics = preference_metrics(chosen_rewards, rejected_rewards, *average)
        assert float(metrics["logps/chosen"]) == pytest.approx(float(average[0].mean()), abs=TOLERANCE)
        return
    if options["metrics"] is None:  # one pair at a time in TRL: no batch metrics
        return
    metrics = preference_metrics(chosen_rewards, rejected_rewards, *split(logps))
    assert sorted(metrics) == sorted(METRIC_NAMES) == sorted(options["metrics"])
    for name in METRIC_NAMES:
        assert float(metrics[name]) == pytest.approx(options["metrics"][name], abs=TOLERANCE), name


def test_ipo_divides_by_the_tokens_scored_where_trl_counts_the_unscored_first_one(expected, capsys):
    """IPO's average log-ratio: trl 1.16 divides each sequence's sum by `completion_mask.sum()`, which counts
    the last pair's first completion token (4 and 3), though nothing predicts it and its log-probability is not
    in the sum (3 and 2 are). zoo divides by the tokens it sums. Everything else is TRL's: the other pairs' losses,
    the rewards and metrics (test above), and zoo given TRL's counts is TRL's loss, pair by pair."""
    logps = np.array(expected["logps_fused"], "float32")
    trl, trl_scored = expected["cases"]["dpo-ipo"], expected["cases"]["dpo-ipo-scored"]
    completion_lengths = np.array(expected["batch"]["completion_mask"]).sum(1)
    assert trl["lengths"] == completion_lengths.tolist() and trl_scored["lengths"] == pair_inputs(expected)[3].tolist()
    ours = zoo_loss("dpo-ipo", expected, logps)[0].numpy()
    np.testing.assert_allclose(ours, trl_scored["losses"], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(ours[:-1], trl["losses"][:-1], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(zoo_loss("dpo-ipo", expected, logps, completion_lengths)[0].numpy(), trl["losses"],
                               rtol=0, atol=TOLERANCE)
    # the last pair written out: log-ratios over 3 and 2 scored tokens, TRL's divided by 4 and 3
    chosen = logps[len(logps) // 2 - 1] - expected["ref_chosen_logps"][-1]
    rejected = logps[-1] - expected["ref_rejected_logps"][-1]
    target = 1 / (2 * trl["beta"])
    assert trl["losses"][-1] == pytest.approx((chosen / 4 - rejected / 3 - target) ** 2, abs=TOLERANCE)
    assert ours[-1] == pytest.approx((chosen / 3 - rejected / 2 - target) ** 2, abs=TOLERANCE)
    with capsys.disabled():
        print(f"\nIPO, the pair with an empty prompt and no BOS: zoo {ours[-1]:.4f}, TRL {trl['losses'][-1]:.4f} "
              f"(TRL on the scored tokens {trl_scored['losses'][-1]:.4f}); batch loss zoo {ours.mean():.4f}, TRL "
              f"{trl['loss']:.4f}")
    assert abs(ours[-1] - trl["losses"][-1]) > 0.1  # the fixture tells the two counts apart


@pytest.mark.parametrize("case", ["dpo-sigmoid", "dpo-ipo-scored", "simpo"])
def test_gradients_equal_trl(case, fixture_model, expected, capsys):
    """d loss / d parameters through the whole model (backbone + chunked log-probabilities), against
    TRL's backward of the same loss (tools/make_dpo_fixtures.py GRADIENTS), relative to each tensor's largest
    entry: IPO's gradients reach 9 (its loss is 24 at beta 0.1), where float32 itself leaves 1.6e-5 absolute.
    IPO against TRL's own on the tokens scored; against TRL's as it is (the pair with no BOS and an empty prompt
    divided by one token more) the gradients differ, by the figure printed."""
    entries = {e.key: e for e in hub.weight_map(fixture_model)}
    names = expected["gradient_names"]
    variables = [entries[name.removeprefix("model.")].variable for name in names]
    with tf.GradientTape() as tape:
        losses = zoo_loss(case, expected, zoo_logps(fixture_model, expected))[0]
        loss = tf.reduce_mean(losses)
    grads = tape.gradient(loss, variables)
    theirs = np.load(FIXTURES / "gradients.npz")
    differences = {}
    for name, grad in zip(names, grads):
        entry = entries[name.removeprefix("model.")]
        ours = grad.numpy().T if entry.transpose else grad.numpy()
        want = theirs[f"{case}/{name}"]
        assert np.abs(want).max() > 1e-4  # the parameter gets a real gradient
        differences[name] = (float(np.abs(ours - want).max()), relative(want, ours))
    with capsys.disabled():
        print(f"\n{case}: gradient max |zoo - TRL| (absolute, relative to the largest entry) {differences}")
        if case == "dpo-ipo-scored":
            apart = {name: relative(theirs[f"dpo-ipo/{name}"], theirs[f"{case}/{name}"]) for name in names}
            print(f"TRL's IPO as it is against TRL's on the tokens scored, relative: {apart}")
            assert min(apart.values()) > 1e-3  # the two counts give different gradients
    assert max(r for _, r in differences.values()) <= TOLERANCE


def test_bad_arguments_are_refused():
    logps = tf.constant([-3.0, -4.0])
    for beta in (0, -0.1, 0.0, "0.1", True):
        with pytest.raises(ValueError, match="beta must be a positive number"):
            dpo_loss(logps, logps, logps, logps, beta=beta)
        with pytest.raises(ValueError, match="beta must be a positive number"):
            simpo_loss(logps, logps, [2, 3], [2, 3], beta=beta)
    with pytest.raises(ValueError, match="Unknown DPO loss_type 'hinge'; known: sigmoid, ipo, robust"):
        dpo_loss(logps, logps, logps, logps, loss_type="hinge")
    with pytest.raises(ValueError, match="pass chosen_lengths"):
        dpo_loss(logps, logps, logps, logps, loss_type="ipo")
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 0.5\)"):
        dpo_loss(logps, logps, logps, logps, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="'ipo' has no label smoothing"):
        dpo_loss(logps, logps, logps, logps, loss_type="ipo", label_smoothing=0.1, chosen_lengths=[1, 1],
                 rejected_lengths=[1, 1])
    with pytest.raises(ValueError, match="gamma"):
        simpo_loss(logps, logps, [2, 3], [2, 3], gamma=-1.0)
    with pytest.raises(ValueError, match="chunk_size must be a positive"):
        sequence_logps(tf.zeros([1, 4, 8]), lambda x: x, tf.zeros([1, 4], tf.int32), tf.ones([1, 4]), chunk_size=0)
