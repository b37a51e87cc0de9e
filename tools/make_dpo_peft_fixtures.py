"""Preference-tuning figures from TRL's own DPOTrainer (trl 1.16): LoRA DPO with the adapters-off reference, and
how the trainer tokenizes preference rows. For the zoo's tests, which have neither torch, transformers, PEFT nor TRL.

Writes `tests/fixtures/dpo_peft/`:
  adapter/        a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, float32) for the tiny Llama
                  of tests/fixtures/dpo/model: r 4, alpha 8, dropout 0, bias none, on q/k/v/o/gate/up/down_proj.
                  lora_A is PEFT's own (seeded) initialisation; every lora_B is redrawn N(0, 0.05^2) (seeded), so
                  that the adapters change the policy and the reference (adapters off) differs from it
  peft.json       the DPO step on tests/fixtures/dpo/expected.json's 4-pair batch (TRL's padded batch, recorded there;
                  its last pair has an empty prompt and no BOS):
                  `ref_chosen_logps`, `ref_rejected_logps` (the adapters off: TRL's `compute_ref_log_probs`, which
                  equals the base model's `logps_fused` of expected.json), `chosen_logps`, `rejected_logps` (the
                  policy, adapters on, through TRL's fused LM head), `loss` (`DPOTrainer.training_step`), `metrics`
                  (what `_compute_loss` logged: rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
                  logps/chosen, logps/rejected), `grad_norm` (the global norm before clipping), settings, versions;
                  under `ipo`, TRL's IPO step (β 0.5) with the same adapter on the batch as it is (`loss`,
                  `grad_norm`) and on the batch whose completion mask marks the tokens scored, position 0 cleared
                  (`loss_scored`, `grad_norm_scored`, `metrics`; zoo's IPO count, docs/dpo.md), and how far the
                  two steps' LoRA gradients lie apart (`gradients_apart`: max |difference| / largest entry)
  peft_ipo_gradients.npz   d loss / d every LoRA parameter of the IPO step on the tokens scored
  peft_gradients.npz   d loss / d every LoRA parameter, float32, named as in adapter_model.safetensors
  peft_after_step.npz  every LoRA parameter after one AdamW step (lr 1e-3, no weight decay, global clip 1.0),
                  through the trainer's own `create_optimizer` and `_clip_grad_norm`
  data.json       preference rows (plain explicit, with and without eos; an empty prompt, which this tokenizer
                  starts with no BOS; plain implicit; a prompt ending in a space; conversational explicit and
                  implicit; a multi-turn prompt; non-ASCII) as
                  `DPOTrainer._prepare_dataset` tokenized them (its `prompt_ids`, `chosen_ids`, `rejected_ids`
                  columns) with tests/fixtures/chat's tokenizer.json as a PreTrainedTokenizerFast and the Qwen2.5
                  template of tests/fixtures/chat/qwen2.5.json, and the trainer's collator output per group
                  (`input_ids`, `attention_mask`, `completion_mask`)

How the LoRA reference is TRL's own: a PeftModel handed to DPOTrainer with ref_model=None gets a frozen copy of its
adapter named "ref" (peft >= 0.20), which at step 0 equals the policy. The reference is the model with its adapters
disabled when TRL builds the adapter itself, from `peft_config`: so the base model and a LoraConfig go to DPOTrainer,
and the lora_B of `trainer.model` are redrawn afterwards (the only change made to TRL's objects). Everything else runs
TRL's code: `training_step` -> `compute_loss` -> `_compute_loss`, whose reference forward is
`use_adapter(model, None)` (= `disable_adapter()`).

    # a throwaway venv outside the repo: torch, transformers, PEFT and TRL are not keras-zoo dependencies
    python3 -m venv /tmp/dpovenv && /tmp/dpovenv/bin/pip install torch==2.13.0 transformers==5.24.0 trl==1.16.0 \\
        peft accelerate
    /tmp/dpovenv/bin/python tools/make_dpo_peft_fixtures.py
"""

import json
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "dpo_peft"
DPO = REPO / "tests" / "fixtures" / "dpo"
CHAT = REPO / "tests" / "fixtures" / "chat"
SEED = 3536
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", target_modules=TARGETS)
B_SCALE = 0.05
BETA, LEARNING_RATE, MAX_GRAD_NORM = 0.1, 1e-3, 1.0
IPO_BETA = 0.5

# Preference rows, grouped by format: _prepare_dataset decides plain/conversational and explicit/implicit from a
# dataset's first row, as the trainer does.
SKY = [{"role": "user", "content": "What color is the sky?"}]
ROWS = {
    "plain-explicit": [
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
        {"prompt": "Two plus two is ", "chosen": "four", "rejected": "five<|im_end|>"},  # a space at the boundary;
        {"prompt": "Grüße aus", "chosen": " Köln — schön!", "rejected": " Zürich."},        # eos already there
        {"prompt": "Say it: ", "chosen": "yes", "rejected": " no"},  # the space merges into one side's answer only
        {"prompt": "", "chosen": "Yes, gladly.", "rejected": "No."},  # no prompt, no BOS: the answers start at 0
    ],
    "plain-implicit": [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Paris is in France.", "rejected": "Paris is in Texas."},
    ],
    "conversational-explicit": [
        {"prompt": SKY, "chosen": [{"role": "assistant", "content": "It is blue."}],
         "rejected": [{"role": "assistant", "content": "It is green."}]},
        {"prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi!"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Grüße auf Deutsch?"}],
         "chosen": [{"role": "assistant", "content": "Grüße! Schönen Tag."}],
         "rejected": [{"role": "assistant", "content": "No."}]},
    ],
    "conversational-implicit": [
        {"chosen": SKY + [{"role": "assistant", "content": "It is blue."}],
         "rejected": SKY + [{"role": "assistant", "content": "It is green, naturally."}]},
        {"chosen": [{"role": "user", "content": "One word: café?"}, {"role": "assistant", "content": "Coffee."},
                    {"role": "user", "content": "And thé?"}, {"role": "assistant", "content": "Tea — bien sûr."}],
         "rejected": [{"role": "user", "content": "One word: café?"}, {"role": "assistant", "content": "Coffee."},
                      {"role": "user", "content": "And thé?"}, {"role": "assistant", "content": "Water."}]},
    ],
}


def tokenizer():
    """tests/fixtures/chat's tokenizer with Qwen2.5-Instruct's special tokens and template, as make_chat_fixtures."""
    from transformers import PreTrainedTokenizerFast

    qwen = json.loads((CHAT / "qwen2.5.json").read_text(encoding="utf-8"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(CHAT / "tokenizer.json"), **qwen["special_tokens"])
    tok.chat_template = qwen["template"]
    return tok


def trainer_for(model, tok, out_dir, peft_config=None, loss_type="sigmoid", beta=BETA):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=out_dir, beta=beta, loss_type=[loss_type], learning_rate=LEARNING_RATE,
                     weight_decay=0.0, max_grad_norm=MAX_GRAD_NORM, lr_scheduler_type="constant",
                     per_device_train_batch_size=3, use_cpu=True, bf16=False, report_to=[], seed=SEED,
                     max_length=None, disable_dropout=True)
    stub = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])  # the trainer wants one
    return DPOTrainer(model=model, ref_model=None, args=args, train_dataset=stub, processing_class=tok,
                      peft_config=peft_config)


def lora_name(name):
    """PEFT's parameter name as the saved adapter file spells it (without the adapter name)."""
    return name.replace(".default.", ".")


def save_random_b_adapter(model, folder, seed, scale=B_SCALE) -> dict:
    """The PEFT model's adapters with B drawn N(0, scale^2) (A as PEFT draws it: B = 0 would make the first step's
    gradients of A zero), saved to `folder` with the base model's path relative to the repository. Returns the
    trainable parameters by name."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    lora = {name: p for name, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for name, p in lora.items():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "README.md").unlink(missing_ok=True)
    config = folder / "adapter_config.json"
    settings = {**json.loads(config.read_text()), "base_model_name_or_path": "tests/fixtures/dpo/model"}
    config.write_text(json.dumps(settings, indent=2) + "\n")
    return lora


def peft_case(tok, work):
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(SEED)
    base = transformers.LlamaForCausalLM.from_pretrained(DPO / "model", attn_implementation="eager",
                                                         dtype=torch.float32)
    trainer = trainer_for(base, tok, work, peft.LoraConfig(task_type="CAUSAL_LM", **LORA))
    model = trainer.model
    assert isinstance(model, peft.PeftModel) and "ref" not in model.peft_config  # the reference: adapters off
    lora = save_random_b_adapter(model, ROOT / "adapter", SEED)
    assert lora and all(".lora_A." in n or ".lora_B." in n for n in lora), sorted(lora)[:4]
    (ROOT / "adapter" / "adapter_model.safetensors").chmod(0o644)
    saved = load_file(ROOT / "adapter" / "adapter_model.safetensors")
    assert sorted(saved) == sorted(lora_name(n) for n in lora), (sorted(saved)[:3], sorted(lora)[:3])

    expected = json.loads((DPO / "expected.json").read_text())
    batch = {k: torch.tensor(v) for k, v in expected["batch"].items()}
    n = len(expected["pairs"])
    model.train()
    ref_chosen, ref_rejected = trainer.compute_ref_log_probs(model, batch)
    base_logps = torch.tensor(expected["logps_fused"])
    assert torch.allclose(torch.cat([ref_chosen, ref_rejected]), base_logps, atol=1e-5)
    with torch.no_grad():
        labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
        policy = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                       fused_lm_head=True, use_cache=False).log_probs.sum(dim=1)

    trainer.current_gradient_accumulation_steps = 1
    trainer._metrics["train"].clear()
    loss = float(trainer.training_step(model, batch))
    metrics = {k: v[0] for k, v in trainer._metrics["train"].items() if k.startswith(("rewards/", "logps/"))}
    delta = (policy[:n] - ref_chosen) - (policy[n:] - ref_rejected)
    assert abs(float(-torch.nn.functional.logsigmoid(BETA * delta).mean()) - loss) < 1e-6
    assert abs(metrics["logps/chosen"] - float(policy[:n].mean())) < 1e-5
    gradients = {lora_name(k): p.grad.detach().numpy().astype(np.float32).copy() for k, p in lora.items()}
    assert all(np.abs(g).max() > 0 for g in gradients.values())

    trainer.create_optimizer()
    grad_norm = float(trainer._clip_grad_norm(model))
    trainer.optimizer.step()
    after = {lora_name(k): p.detach().numpy().astype(np.float32).copy() for k, p in lora.items()}
    optimizer = trainer.optimizer
    group = optimizer.param_groups[0]
    record = {
        "lora": {**LORA, "lora_B": f"N(0, {B_SCALE}^2), torch.Generator seed {SEED}"},
        "batch": "tests/fixtures/dpo/expected.json's batch (chosen rows, then rejected rows)",
        "loss_type": "sigmoid", "beta": BETA,
        "ref_chosen_logps": ref_chosen.tolist(), "ref_rejected_logps": ref_rejected.tolist(),
        "chosen_logps": policy[:n].tolist(), "rejected_logps": policy[n:].tolist(),
        "loss": loss, "metrics": metrics, "grad_norm": grad_norm,
        "optimizer": {"class": type(getattr(optimizer, "optimizer", optimizer)).__name__, "lr": group["lr"],
                      "betas": list(group["betas"]), "eps": group["eps"],
                      "weight_decay": [g["weight_decay"] for g in optimizer.param_groups],
                      "max_grad_norm": MAX_GRAD_NORM, "clipped": grad_norm > MAX_GRAD_NORM},
    }
    np.savez(ROOT / "peft_gradients.npz", **gradients)
    np.savez(ROOT / "peft_after_step.npz", **after)
    return record


def ipo_case(tok, work):
    """TRL's IPO step with the saved adapter, on the batch as it is and on the tokens scored."""
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(SEED)
    base = transformers.LlamaForCausalLM.from_pretrained(DPO / "model", attn_implementation="eager",
                                                         dtype=torch.float32)
    trainer = trainer_for(base, tok, work, peft.LoraConfig(task_type="CAUSAL_LM", **LORA), "ipo", IPO_BETA)
    model = trainer.model
    saved = load_file(ROOT / "adapter" / "adapter_model.safetensors")
    lora = {name: p for name, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for name, p in lora.items():
            p.copy_(saved[lora_name(name)])
    expected = json.loads((DPO / "expected.json").read_text())
    batch = {k: torch.tensor(v) for k, v in expected["batch"].items()}
    scored_mask = batch["completion_mask"].clone()
    scored_mask[:, 0] = 0  # position 0 predicts nothing: its token is never scored
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    steps = {}
    for name, inputs in (("trl", batch), ("scored", {**batch, "completion_mask": scored_mask})):
        model.zero_grad(set_to_none=True)
        trainer._metrics["train"].clear()
        loss = float(trainer.training_step(model, inputs))
        metrics = {k: v[0] for k, v in trainer._metrics["train"].items() if k.startswith(("rewards/", "logps/"))}
        gradients = {lora_name(k): p.grad.detach().numpy().astype(np.float32).copy() for k, p in lora.items()}
        steps[name] = loss, metrics, gradients
    (loss, metrics, theirs), (loss_scored, metrics_scored, gradients) = steps["trl"], steps["scored"]
    assert metrics == metrics_scored  # the log-probabilities and rewards do not read the mask's position 0
    largest = max(np.abs(g).max() for g in gradients.values())
    np.savez(ROOT / "peft_ipo_gradients.npz", **gradients)
    return {"loss_type": "ipo", "beta": IPO_BETA, "loss": loss, "loss_scored": loss_scored, "metrics": metrics,
            "grad_norm": float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in theirs.values()))),
            "grad_norm_scored": float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in gradients.values()))),
            "gradients_apart": float(max(np.abs(theirs[k] - gradients[k]).max() for k in gradients) / largest)}


def data_case(tok, work):
    """The trainer's own dataset processing and collator on ROWS."""
    import torch
    import transformers
    from datasets import Dataset

    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM.from_pretrained(DPO / "model", dtype=torch.float32)
    trainer = trainer_for(model, tok, work)
    groups = {}
    for name, rows in ROWS.items():
        processed = trainer._prepare_dataset(Dataset.from_list(rows), tok, trainer.args, name)
        columns = [{k: processed[i][k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                   for i in range(len(rows))]
        batch = trainer.data_collator(columns)
        groups[name] = {"rows": rows, "processed": columns,
                        "batch": {k: v.tolist() for k, v in batch.items()}}
    return {"template": "tests/fixtures/chat/qwen2.5.json's", "tokenizer": "tests/fixtures/chat/tokenizer.json",
            "special_tokens": dict(tok.special_tokens_map), "pad_token_id": tok.pad_token_id,
            "max_length": trainer.args.max_length, "groups": groups}


def versions():
    import importlib.metadata as md

    return {name: md.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets",
                                                 "tokenizers", "safetensors")}


def make():
    ROOT.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    with tempfile.TemporaryDirectory() as work:
        record = {"versions": versions(), **peft_case(tok, work)}
        record["ipo"] = ipo_case(tok, work)
        data = {"versions": record["versions"], **data_case(tok, work)}
    (ROOT / "peft.json").write_text(json.dumps(record, indent=1) + "\n")
    (ROOT / "data.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
    print(json.dumps({k: record[k] for k in ("loss", "grad_norm", "metrics", "ipo")}))
    print(f"{size / 1024:.0f} KiB -> {ROOT}")


if __name__ == "__main__":
    make()
