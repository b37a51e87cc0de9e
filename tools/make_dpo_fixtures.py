"""Preference-tuning figures computed by TRL itself, for `tests/zoo/test_preference.py` (which has neither
torch, transformers nor TRL).

Writes `tests/fixtures/dpo/`:
  model/          a tiny LlamaForCausalLM (2 layers, hidden 64, 4 heads / 2 KV heads, vocab 128, untied head),
                  every parameter redrawn as tools/make_hf_fixtures.py does, saved in bfloat16 (half the bytes)
                  with `save_pretrained(safe_serialization=True)`; TRL computes in float32 from those values
  expected.json   versions; the pairs (prompt / chosen / rejected token ids) and TRL's padded batch
                  (`DataCollatorForPreference`: chosen rows, then rejected rows, right-padded; input_ids,
                  attention_mask, completion_mask); the policy's per-sequence log-probabilities two ways
                  (`logps_fused`: TRL's fused LM head, `add_fused_lm_head` + `model(..., fused_lm_head=True)
                  .log_probs` summed, what `DPOTrainer._compute_loss` sums; `logps_logits`: transformers'
                  whole logits + TRL's `selective_log_softmax`), the given reference log-probabilities, and per
                  loss case TRL's loss, per-pair losses, logged metrics and the lengths IPO divides by
  gradients.npz   d loss / d a few named parameters (`<case>/<Hugging Face name>`), float32, for GRADIENT_CASES

The loss cases run TRL's own code on that batch:
  dpo-sigmoid, dpo-ipo, dpo-robust   `DPOTrainer._compute_loss` (trl 1.16) on a stand-in `self` holding the
                  attributes it reads (precompute_ref_logps=True: the reference log-probabilities are given);
                  per-pair losses repeat the trainer's formula (it returns only their mean);
  dpo-ipo-scored  the same IPO on the batch whose completion mask marks the scored tokens only (position 0
                  cleared: its token has no prediction). The log-probabilities are unchanged (TRL's labels at
                  position 0 are shifted away); IPO's average then divides by the tokens it sums, as zoo's does,
                  where trl 1.16 divides by `completion_mask.sum()`, which counts the unscored first token of a
                  completion that starts the sequence (the last pair: an empty prompt and no BOS, docs/dpo.md);
  dpo-cdpo        conservative DPO (label smoothing in the sigmoid loss, TRL's DPO sigmoid before 1.0): trl 1.16's
                  `loss_type="aot"` on one pair at a time, where its sort over the batch is the identity and the
                  loss is exactly -(1 - ε) log σ(βΔ) - ε log σ(-βΔ); the gradient of the mean over the pairs;
  simpo           `CPOTrainer.get_batch_logps(..., average_log_prob=True)` + `CPOTrainer.cpo_loss` with
                  loss_type="simpo", cpo_alpha=0 (trl.experimental.cpo).

    # a throwaway venv outside the repo: torch, transformers and TRL are not keras-zoo dependencies
    python3 -m venv /tmp/dpovenv && /tmp/dpovenv/bin/pip install torch==2.13.0 transformers==5.24.0 trl==1.16.0 peft
    /tmp/dpovenv/bin/python tools/make_dpo_fixtures.py
"""

import collections
import json
import sys
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "dpo"
SEED = 3535
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
# (prompt, chosen, rejected) lengths: uneven, so that padding and length normalisation matter. No pair has a BOS
# (as Qwen2/Qwen3's tokenizers add none), and the last has an empty prompt: its completions start at position 0,
# whose token nothing predicts (scored: 3 and 2 tokens of 4 and 3)
LENGTHS = [(5, 4, 7), (3, 6, 2), (8, 3, 3), (0, 4, 3)]
# reference = policy + offset (chosen, rejected)
REFERENCE_OFFSETS = [(-1.5, 2.0), (0.75, -0.5), (3.0, 1.0), (-0.5, 1.5)]
BETA, LABEL_SMOOTHING, SIMPO_BETA, SIMPO_GAMMA = 0.1, 0.1, 2.0, 1.0
GRADIENTS = ("lm_head.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight")
# robust and conservative DPO differ from sigmoid DPO only in d loss / d logps, which the loss tests check
GRADIENT_CASES = ("dpo-sigmoid", "dpo-ipo", "dpo-ipo-scored", "simpo")
CASES = {"dpo-sigmoid": dict(loss_type="sigmoid", label_smoothing=0.0),
         "dpo-ipo": dict(loss_type="ipo", label_smoothing=0.0),
         "dpo-ipo-scored": dict(loss_type="ipo", label_smoothing=0.0),
         "dpo-robust": dict(loss_type="robust", label_smoothing=LABEL_SMOOTHING),
         "dpo-cdpo": dict(loss_type="aot", label_smoothing=LABEL_SMOOTHING)}


def pairs():
    rng = np.random.default_rng(SEED)
    return [{"prompt_ids": rng.integers(3, 128, p).tolist(), "chosen_ids": rng.integers(3, 128, c).tolist(),
             "rejected_ids": rng.integers(3, 128, r).tolist()} for p, c, r in LENGTHS]


def stand_in(model, accelerator, loss_type, label_smoothing):
    """The attributes `DPOTrainer._compute_loss` reads, as `DPOTrainer.__init__` sets them."""
    return types.SimpleNamespace(
        model=model, accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        ref_model=None, f_divergence_type="reverse_kl", f_alpha_divergence_coef=0.5, loss_types=[loss_type],
        loss_weights=[1.0], beta=BETA, label_smoothing=label_smoothing, use_weighting=False,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        _total_train_tokens=0, _tp_size=1)


def grads(model):
    named = dict(model.named_parameters())
    result = {name: named[name].grad.detach().float().numpy().copy() for name in GRADIENTS}
    model.zero_grad(set_to_none=True)
    return result


def per_pair(loss_type, eps, chosen_ratio, rejected_ratio, chosen_len, rejected_len):
    """The per-pair losses `_compute_loss` averages (its own lines, on its own tensors)."""
    import torch.nn.functional as F

    delta = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        return -F.logsigmoid(BETA * delta)
    if loss_type == "ipo":
        return (chosen_ratio / chosen_len.clamp(min=1.0) - rejected_ratio / rejected_len.clamp(min=1.0)
                - 1 / (2 * BETA)) ** 2
    if loss_type == "robust":
        return (-(1 - eps) * F.logsigmoid(BETA * delta) + eps * F.logsigmoid(-BETA * delta)) / (1 - 2 * eps)
    return -F.logsigmoid(BETA * delta) * (1 - eps) - F.logsigmoid(-BETA * delta) * eps  # aot, one pair


def make():
    import accelerate
    import peft
    import safetensors
    import torch
    import transformers
    import trl
    from trl.experimental.cpo import CPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer
    from trl.trainer.utils import add_fused_lm_head, selective_log_softmax

    sys.path.insert(0, str(REPO))
    from tools.make_hf_fixtures import randomise

    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, architectures=["LlamaForCausalLM"]))
    randomise(model, SEED)
    ROOT.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(ROOT / "model", safe_serialization=True)  # half the bytes
    (ROOT / "model" / "generation_config.json").unlink(missing_ok=True)
    # computed in float32 from the bfloat16 values (exact in float32, as zoo loads them)
    model = transformers.LlamaForCausalLM.from_pretrained(ROOT / "model", attn_implementation="eager",
                                                          dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))  # as DPOTrainer does
    model.train()  # no dropout in this config; "train" is the mode _compute_loss logs under
    accelerator = accelerate.Accelerator(cpu=True)
    examples = pairs()
    batch = DataCollatorForPreference(pad_token_id=0)(examples)
    n = len(examples)

    with torch.no_grad():
        labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
        fused = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                      fused_lm_head=True, use_cache=False).log_probs.sum(dim=1)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        shifted = labels[:, 1:]
        token_logps = selective_log_softmax(logits[:, :-1], shifted.clamp(min=0))
        whole = (token_logps * (shifted != -100)).sum(dim=1)
    offsets = torch.tensor(REFERENCE_OFFSETS, dtype=torch.float32)
    reference = torch.stack([fused[:n], fused[n:]], dim=1) + offsets
    inputs = {**batch, "ref_chosen_logps": reference[:, 0].clone(), "ref_rejected_logps": reference[:, 1].clone()}
    scored_mask = batch["completion_mask"].clone()
    scored_mask[:, 0] = 0  # position 0 predicts nothing: its token is never scored
    starts = batch["completion_mask"][:, 0].tolist()  # only the last pair's completions start the sequence
    assert starts == [0] * (n - 1) + [1] + [0] * (n - 1) + [1], starts
    scored = {**inputs, "completion_mask": scored_mask}
    lengths = {"completion": batch["completion_mask"].sum(dim=1).float(), "scored": scored_mask.sum(dim=1).float()}

    cases, gradients = {}, {}
    for case, options in CASES.items():
        loss_type, eps = options["loss_type"], options["label_smoothing"]
        if loss_type == "aot":  # one pair at a time: the mean of the pairs' losses
            total = 0.0
            for i in range(n):
                single = DataCollatorForPreference(pad_token_id=0)([examples[i]])
                single.update(ref_chosen_logps=inputs["ref_chosen_logps"][i:i + 1],
                              ref_rejected_logps=inputs["ref_rejected_logps"][i:i + 1])
                this = stand_in(model, accelerator, loss_type, eps)
                loss_i = DPOTrainer._compute_loss(this, model, single, False)
                (loss_i / n).backward()
                total += float(loss_i)
            loss, logged = total / n, None
        else:
            this = stand_in(model, accelerator, loss_type, eps)
            loss = DPOTrainer._compute_loss(this, model, scored if case.endswith("-scored") else inputs, False)
            loss.backward()
            loss, logged = float(loss.detach()), {k: v[0] for k, v in this._metrics["train"].items()
                                         if k.startswith(("rewards/", "logps/"))}
        found = grads(model)
        if case in GRADIENT_CASES:
            gradients.update({f"{case}/{k}": v for k, v in found.items()})
        chosen_ratio, rejected_ratio = fused[:n] - reference[:, 0], fused[n:] - reference[:, 1]
        counted = lengths["scored" if case.endswith("-scored") else "completion"]
        losses = per_pair(loss_type, eps, chosen_ratio, rejected_ratio, counted[:n], counted[n:])
        assert abs(float(losses.mean()) - loss) < 1e-6, (case, float(losses.mean()), loss)
        cases[case] = {**options, "beta": BETA, "loss": loss, "losses": losses.tolist(), "metrics": logged,
                       "lengths": counted.tolist()}

    # SimPO: CPOTrainer's own log-probabilities (length-averaged) and loss, gradient of losses.mean()
    cpo = types.SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=SIMPO_GAMMA, beta=SIMPO_BETA,
                                label_smoothing=0.0, accelerator=accelerator)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    average = CPOTrainer.get_batch_logps(logits, labels.clone(), average_log_prob=True)
    losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(cpo, average[:n], average[n:])
    losses.mean().backward()
    gradients.update({f"simpo/{k}": v for k, v in grads(model).items()})
    cases["simpo"] = {"beta": SIMPO_BETA, "gamma": SIMPO_GAMMA, "label_smoothing": 0.0,
                      "loss": float(losses.mean()), "losses": losses.tolist(), "average_logps": average.tolist(),
                      "chosen_rewards": chosen_rewards.tolist(), "rejected_rewards": rejected_rewards.tolist()}

    expected = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "accelerate": accelerate.__version__, "peft": peft.__version__,
                     "safetensors": safetensors.__version__},
        "pairs": examples,
        "batch": {k: v.tolist() for k, v in batch.items()},
        "logps_fused": fused.tolist(), "logps_logits": whole.tolist(),
        "ref_chosen_logps": inputs["ref_chosen_logps"].tolist(),
        "ref_rejected_logps": inputs["ref_rejected_logps"].tolist(),
        "cases": cases,
        "gradient_names": list(GRADIENTS),
    }
    (ROOT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    np.savez(ROOT / "gradients.npz", **gradients)
    size = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
    print(f"fused vs whole-logits logps: max |diff| {float((fused - whole).abs().max()):.2e}")
    print(json.dumps({k: v["loss"] for k, v in cases.items()}))
    print(f"{size / 1024:.0f} KiB -> {ROOT}")


if __name__ == "__main__":
    make()
