"""GRPO figures from TRL's own GRPOTrainer (trl 1.16) with a PEFT LoRA adapter: advantages, loss and LoRA gradients
on a fixed batch, for the zoo's tests, which have neither torch, transformers, PEFT nor TRL.

Writes `tests/fixtures/grpo/`:
  adapter/        a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, float32) for the tiny Llama of
                  tests/fixtures/dpo/model (2 layers, hidden 64): r 2, alpha 4, dropout 0, on q/v/down_proj; lora_A is
                  PEFT's seeded initialisation, every lora_B is redrawn N(0, 0.05^2) (seeded) so that the policy and
                  the reference (the adapters off, TRL's reference for a PEFT model) differ
  grpo.json       the batch: 2 prompts (left-padded), G = 3 completions each (right-padded; one ends without eos: a
                  truncated completion), two reward functions' outputs (one None) with weights [1.0, 0.5], and per
                  case (loss type x beta x mu, scale_rewards, mask_truncated_completions) what TRL made of it:
                  `advantages` (`_generate_and_score_completions`, with `_generate` replaced by the fixed completions:
                  the only change to TRL's objects besides lora_B), `ref_per_token_logps` (the adapters off),
                  `old_per_token_logps` (mu 2: the policy's, moved by fixed noise, as a policy that has taken a step
                  since it sampled; mu 1: none, TRL's `per_token_logps.detach()`), `completion_mask`, `loss`
                  (`compute_loss`) and its metrics (kl, entropy, clip_ratio/*); GRPOConfig's other settings are its
                  defaults, among them importance_sampling_level "token" and use_bias_correction_kl True (the KL term
                  weighted by the importance ratio), with epsilon 0.2 and epsilon_high 0.28
  gradients.npz   per case `<case>/<PEFT parameter name>`: d loss / d every LoRA parameter, float32

    # the shared throwaway venv (torch CPU, transformers 5.24, trl 1.16, peft 0.21): not keras-zoo dependencies
    /tmp/ref-venv/bin/python tools/make_grpo_fixtures.py
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "grpo"
MODEL = REPO / "tests" / "fixtures" / "dpo" / "model"
SEED = 4646
LORA = dict(r=2, lora_alpha=4, lora_dropout=0.0, bias="none", target_modules=["q_proj", "v_proj", "down_proj"])
B_SCALE = 0.05
G, MAX_COMPLETION = 3, 6
EPSILON, EPSILON_HIGH = 0.2, 0.28
OLD_NOISE = 0.3
WEIGHTS = [1.0, 0.5]
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
# the token ids (< the model's 128), as `_generate` returns them: prompts, then G completions per prompt
PROMPTS = [[8, 112, 82, 102, 24], [31, 77]]
COMPLETIONS = [[22, 54, 42, 79, 2], [16, 105, 2], [99, 13, 40, 61, 5, 88],  # the third: 6 tokens, no eos: truncated
               [45, 2], [7, 64, 91, 2], [120, 3, 57, 2]]
ROWS = [{"prompt": "a", "score": s, "style": t} for s, t in
        zip([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], [0.2, None, 0.5, 0.1, 0.9, 0.3])]


def score(prompts, completions, score, **kwargs):
    return score


def style(prompts, completions, style, **kwargs):
    return style


def cases():
    out = [dict(loss_type=t, beta=b, mu=m, scale_rewards="group", mask_truncated=False)
           for t in LOSS_TYPES for b in (0.0, 0.04) for m in (1, 2)]
    out += [dict(loss_type="grpo", beta=0.04, mu=2, scale_rewards=s, mask_truncated=False) for s in ("batch", "none")]
    out += [dict(loss_type="dapo", beta=0.04, mu=2, scale_rewards="group", mask_truncated=True)]
    return out


def name(case):
    masked = "-masked" if case["mask_truncated"] else ""
    return "{loss_type}-beta{beta}-mu{mu}-{scale_rewards}".format(**case) + masked


def lora_name(parameter):
    return parameter.replace(".default.", ".")


def trainer_for(case, tok, work):
    import peft
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(SEED)
    base = transformers.LlamaForCausalLM.from_pretrained(MODEL, attn_implementation="eager", dtype=torch.float32)
    args = GRPOConfig(output_dir=work, loss_type=case["loss_type"], beta=case["beta"], num_iterations=case["mu"],
                      scale_rewards=case["scale_rewards"], mask_truncated_completions=case["mask_truncated"],
                      epsilon=EPSILON, epsilon_high=EPSILON_HIGH, num_generations=G,
                      max_completion_length=MAX_COMPLETION, per_device_train_batch_size=len(COMPLETIONS),
                      reward_weights=WEIGHTS, use_cpu=True, bf16=False, report_to=[], seed=SEED,
                      disable_dropout=True, log_completions=False)
    return GRPOTrainer(model=base, reward_funcs=[score, style], args=args, train_dataset=Dataset.from_list(ROWS),
                       processing_class=tok, peft_config=peft.LoraConfig(task_type="CAUSAL_LM", **LORA))


def run_case(case, tok, work):
    import torch
    from safetensors.torch import load_file

    trainer = trainer_for(case, tok, work)
    model = trainer.model
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    saved = ROOT / "adapter" / "adapter_model.safetensors"
    if not saved.exists():
        from make_dpo_peft_fixtures import save_random_b_adapter

        save_random_b_adapter(model, ROOT / "adapter", SEED, B_SCALE)
    weights = load_file(saved)
    with torch.no_grad():
        for n, p in lora.items():
            p.copy_(weights[lora_name(n)])

    prompts = [PROMPTS[i // G] for i in range(len(COMPLETIONS))]
    texts = [tok.decode(c) for c in COMPLETIONS]

    def fixed_generate(_prompts):
        return prompts, COMPLETIONS, None, texts, None, {}, None, None

    trainer._generate = fixed_generate
    model.train()
    inputs = trainer._generate_and_score_completions([dict(r) for r in ROWS])
    old = None
    if case["mu"] == 2:
        with torch.no_grad():  # the policy's log-probabilities, moved: a policy one step past its samples
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            current, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, ids.shape[1]
                                                                       - inputs["prompt_ids"].shape[1])
        noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(SEED + 1)) * OLD_NOISE
        old = current + noise
        inputs["old_per_token_logps"] = old
    else:
        inputs.pop("old_per_token_logps", None)
    trainer._metrics["train"].clear()
    trainer.current_gradient_accumulation_steps = 1
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()
               if k in ("kl", "entropy") or k.startswith("clip_ratio/")}
    gradients = {lora_name(n): p.grad.detach().numpy().astype(np.float32).copy() for n, p in lora.items()}
    assert all(np.abs(g).max() > 0 for g in gradients.values()), name(case)
    record = {**case, "loss": float(loss), "metrics": metrics,
              "advantages": inputs["advantages"].tolist(),
              "completion_mask": inputs["completion_mask"].tolist(),
              "num_items_in_batch": float(inputs["num_items_in_batch"]),
              "old_per_token_logps": None if old is None else old.tolist(),
              "ref_per_token_logps": inputs["ref_per_token_logps"].tolist() if case["beta"] else None}
    batch = {k: inputs[k].tolist() for k in ("prompt_ids", "prompt_mask", "completion_ids")}
    return record, batch, gradients


def versions():
    import importlib.metadata as md

    return {n: md.version(n) for n in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")}


def make():
    sys.path.insert(0, str(REPO / "tools"))
    from make_dpo_peft_fixtures import tokenizer

    ROOT.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    records, arrays, batch = {}, {}, None
    with tempfile.TemporaryDirectory() as work:
        for case in cases():
            record, batch, gradients = run_case(case, tok, work)
            records[name(case)] = record
            arrays.update({f"{name(case)}/{k}": v for k, v in gradients.items()})
    (ROOT / "adapter" / "adapter_model.safetensors").chmod(0o644)
    out = {"versions": versions(), "lora": {**LORA, "lora_B": f"N(0, {B_SCALE}^2), torch.Generator seed {SEED}"},
           "num_generations": G, "max_completion_length": MAX_COMPLETION, "epsilon": EPSILON,
           "epsilon_high": EPSILON_HIGH, "reward_weights": WEIGHTS, "rows": ROWS, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.pad_token_id, "prompts": PROMPTS, "completions": COMPLETIONS, "batch": batch,
           "cases": records}
    (ROOT / "grpo.json").write_text(json.dumps(out, indent=1) + "\n")
    np.savez(ROOT / "gradients.npz", **arrays)
    size = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
    print(json.dumps({k: (v["loss"], v["metrics"]) for k, v in records.items()}, indent=1))
    print(f"{size / 1024:.0f} KiB -> {ROOT}")


if __name__ == "__main__":
    make()
