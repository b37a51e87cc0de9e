"""A `Recipe` is everything about training a model that is not its shape: the task,
precision, optimizer, schedule, batch geometry and checkpointing. Recipes are frozen data,
like `zoo.ModelSpec`, so a registered name always means the same training run; every
registered model has one under its own name (the 3B-8B checkpoints' are LoRA fine-tuning of
the released weights, which `recipes.get(name, weights=...)` fills in), and "classify" /
"finetune-lm" / "sft" / "dpo" / "simpo" / "grpo" fine-tune any model from weights. Where each default
comes from: docs/training.md (Where the defaults come from).

A `Recipe` is its sections (`SECTIONS`: Model, Memory, LoRA, Optimizer, Batches, SFT, Chat, Preference, GRPO, Data,
Logging), each a frozen dataclass that checks its own fields; the fields stay flat (`recipe.beta`, run.json),
and each says through `option` how `zoo train` offers it (recipes.cli builds the flags from them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import zoo
from recipes import pretrained
from zoo import checks, lora
from zoo.checks import QUANTIZATION_MODES, ROUNDINGS, WEIGHTS_DTYPES
from zoo.memory.optimizer_state import RECIPE_OPTIMIZERS, check_weights
from zoo.models.base import has_segments
from zoo.ops.grpo import LOSS_TYPES as GRPO_LOSS_TYPES
from zoo.ops.grpo import SCALE_REWARDS
from zoo.ops.preference import DPO_LOSS_TYPES
from zoo.registry import Registry
from zoo.training.fused import CLIPS

# A recipe trains one task head of zoo's (zoo.models.TASKS); the backbone alone is not trained.
TASKS = ("masked_lm", "causal_lm", "classifier")
LEGACY_TASKS = {"mlm": "masked_lm", "clm": "causal_lm", "classify": "classifier"}  # run.json before 0.2
DECAYS = ("linear", "cosine")
LOSS_ON = ("assistant", "all")  # SFT: "assistant": assistant turns, or the completion; "all": every token
# DPO on conversations: "spans": the answer's chat span, as SFT trains it; "trl": every token after the prompt's
COMPLETION_MASKS = ("spans", "trl")


def option(default=dataclasses.MISSING, help="", *, factory=None, recipes=None, cli=True, **argparse):
    """A recipe field with what `zoo train` needs to offer it as a flag (recipes.cli builds the flags from these):
    its `help`, argparse's keywords where the field's type does not say them (`choices`, `metavar`), `cli=False`
    for a field with no flag, and `recipes`: the recipes that read it, where its section's differ."""
    meta = {"help": help, "cli": cli, "argparse": argparse, "recipes": recipes}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def check(ok, message):
    if not ok:
        raise ValueError(message)


# Each section holds one concern's fields and checks them (`check`, given the whole recipe, for the rules that
# tie a field to another section's). `Recipe` is all of them, in this order: fields stay flat (recipe.beta,
# run.json's "recipe"), and `recipes` names the recipes that read a section (None: every recipe), so that a
# flag given to a recipe that would ignore it is refused by name (recipes.cli).
@dataclass(frozen=True)
class Model:
    """What is trained: the task head, the model's shape, the weights it starts from."""

    recipes = None
    task: str = option(cli=False)
    model: str | None = option(cli=False)  # a registered name; None: the shape of `weights`
    model_overrides: dict = option(factory=dict, cli=False)
    # a Hugging Face folder or Hub repo id to start from (recipes.pretrained)
    weights: str | None = option(None, cli=False)

    def check(self):
        check(self.task in TASKS, f"Unknown task {self.task!r}; known tasks: {', '.join(TASKS)}.")
        if self.weights is None:
            check(self.model is not None, "A recipe needs a registered model name, or weights= to start from.")
        else:
            check(self.vocabulary is None, "weights= brings the checkpoint's own tokenizer; drop vocabulary=.")
            if self.model is not None:
                pretrained.check_shape(self.weights, self.model)
        kind = "decoder" if self.spec.is_decoder else "encoder"  # raises for an unknown model
        want = "decoder" if self.task == "causal_lm" else "encoder"
        check(kind == want, f"Task {self.task!r} needs a{'n' * (want == 'encoder')} {want} model; {self.name!r} "
              f"is a {self.spec.family} {kind}.")

    @property
    def spec(self) -> zoo.ModelSpec:
        """The model's spec after `model_overrides` (num_classes is a task argument)."""
        overrides = {k: v for k, v in self.model_overrides.items() if k != "num_classes"}
        base = pretrained.checkpoint(self.weights).spec if self.weights else zoo.spec(self.model)
        return base.replace(**overrides)

    @property
    def segments(self) -> bool:
        """Whether the model takes segment ids (BERT does; ModernBERT and the decoders do not)."""
        return has_segments(self.spec)

    @property
    def name(self) -> str:
        """The model, as messages name it: its registered name, or the weights it starts from."""
        return self.model or self.weights


@dataclass(frozen=True)
class Memory:
    """Precision, the weights' dtype and what trades time for memory (docs/memory.md)."""

    recipes = None
    precision: str = option("mixed_bfloat16", "recipe field precision")
    # "bfloat16": no float32 copy, updates rounded (zoo.optimizers; docs/memory.md)
    weights_dtype: str = option("float32", "recipe field weights_dtype: bfloat16 stores the weights with no float32 "
                                "copy and rounds each update stochastically (adamw, lion, adafactor; docs/memory.md)",
                                choices=WEIGHTS_DTYPES)
    # bfloat16 weights: "stochastic" (None means it) or "nearest" (only by name)
    rounding: str | None = option(None, "with --weights-dtype bfloat16: 'stochastic' (the default) or 'nearest' "
                                  "(loses small updates; for comparisons)", choices=ROUNDINGS)
    # activation recomputation policy (zoo.ops.recompute), or "auto" (zoo.memory.choose)
    checkpointing: str = option("none", "recipe field checkpointing")
    # for "auto", and on a CPU the run's RSS check: bytes or "24GiB"; None: the device's memory (RAM on CPU)
    memory_budget: str | int | None = option(None, "with --checkpointing auto: e.g. 24GiB (default: this device's "
                                             "memory); on a CPU also what the run's planned peak RSS is checked "
                                             "against (default: the memory available now)")
    # the optimizer step inside the backward pass (zoo.training.fused); needs checkpointing "full"
    fused: bool = option(False, "apply the optimizer inside the backward pass, block by block (needs --checkpointing "
                         "full): the whole model's gradients never exist at once (docs/memory.md)")
    # with fused: "global" (exact, a norm pass first) or "per-block" (cheaper, not exact)
    fused_clip: str = option("global", "with --fused: 'global' (exact global-norm clip, a norm pass first; default) "
                             "or 'per-block'", choices=CLIPS)
    # causal LM: positions per loss chunk (zoo.ops.lm_loss); None: default; 0: unchunked
    loss_chunk: int | None = option(None, "causal LM: positions per chunk of the loss (default: chosen; 0: "
                                    "unchunked logits)")

    def check(self):
        check(self.precision in zoo.PRECISIONS,
              f"Unknown precision {self.precision!r}; known: {', '.join(zoo.PRECISIONS)}.")
        self._weights()
        check(self.checkpointing in (*zoo.POLICIES, "auto"),
              f"Unknown checkpointing policy {self.checkpointing!r}; known: {', '.join(zoo.POLICIES)}, auto.")
        if self.fused:
            checks.fused(self.checkpointing, self.accumulation_steps)
        check(self.fused_clip in CLIPS, f"Unknown fused_clip {self.fused_clip!r}; known: {', '.join(CLIPS)}.")
        check(self.loss_chunk is None or (isinstance(self.loss_chunk, int) and self.loss_chunk >= 0),
              f"loss_chunk must be None (the default chunk), 0 (unchunked) or a positive number of positions; "
              f"got {self.loss_chunk!r}.")
        if self.memory_budget is not None:
            zoo.memory.parse_bytes(self.memory_budget)  # raises with the accepted forms

    def _weights(self) -> tuple:
        """zoo.checks.weights for this recipe: (dtype policy, rounding); a LoRA base is frozen."""
        return checks.weights(self.weights_dtype, self.precision, self.rounding, self.accumulation_steps,
                              frozen=self.lora_rank is not None)

    @property
    def dtype_policy(self) -> str:
        """The Keras dtype policy the model is built with: `precision`, or "bfloat16" for bfloat16 weights."""
        return self._weights()[0]

    @property
    def weights_rounding(self) -> str | None:
        """How updates are rounded into the weights: None (float32 weights), "stochastic" or "nearest"."""
        return self._weights()[1]


@dataclass(frozen=True)
class LoRA:
    """LoRA on the weights (zoo.lora): only the adapters (and a new classifier) train; docs/lora.md."""

    recipes = None
    lora_rank: int | None = option(None, "train LoRA adapters of this rank on --weights, everything else frozen "
                                   "(docs/lora.md)")  # None: every weight trains
    # the update is scaled by alpha / rank; None: 2 x rank
    lora_alpha: float | None = option(None, "LoRA alpha: the update is scaled by alpha / rank (default 2 x rank)")
    # comma-separated projection names or "all-linear"; None: PEFT's default
    lora_targets: str | None = option(None, "comma-separated projections (q_proj,v_proj,... / query,value,...) or "
                                      "all-linear (default: PEFT's for the family)")
    # "int8" or "int4": the frozen base through Keras' Model.quantize (needs LoRA)
    quantize: str | None = option(None, "with --lora-rank: quantize the frozen base (Keras' Model.quantize, "
                                  "weight-only)", choices=QUANTIZATION_MODES)

    def check(self):
        checks.lora(self.lora_rank, self.lora_alpha, self.quantize, fused=self.fused)
        check(self.lora_rank is not None or self.lora_targets is None,
              "lora_targets applies to LoRA only; set lora_rank (--lora-rank) too, or drop lora_targets.")
        if self.lora_rank is not None:
            lora.check_targets(self.spec, self.task, self.targets)

    @property
    def targets(self):
        """`lora_targets` as zoo.lora.enable_lora takes them (None, "all-linear" or a list of names)."""
        if self.lora_targets is None or self.lora_targets == lora.ALL_LINEAR:
            return self.lora_targets
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    @property
    def alpha(self) -> float | None:
        """LoRA alpha: `lora_alpha`, or twice the rank (alpha 32 at rank 16)."""
        return None if self.lora_rank is None else self.lora_alpha or 2 * self.lora_rank


@dataclass(frozen=True)
class Optimizer:
    """The optimizer (`optimizer` picks it; each reads the fields it has, recipes/optim.py) and its schedule:
    linear warmup from 0, then `decay` down to min_lr_ratio * learning_rate."""

    recipes = None
    learning_rate: float = option(1e-4, "recipe field learning_rate")
    beta_1: float = option(0.9, cli=False)
    beta_2: float = option(0.999, cli=False)
    epsilon: float = option(1e-6, cli=False)
    weight_decay: float = option(0.01, cli=False)  # never applied to norms and biases
    clipnorm: float | None = option(1.0, cli=False)  # global gradient norm, as BERT / TinyLlama / HF Trainer clip
    # zoo.memory.RECIPE_OPTIMIZERS: "adamw", "adafactor", "keras-adafactor" or "lion"
    optimizer: str = option("adamw", "recipe field optimizer (default: the recipe's, adamw); lion keeps half AdamW's "
                            "state, adafactor (factored) almost none; keras-adafactor is Keras' (docs/training.md: "
                            "Optimizers)", choices=RECIPE_OPTIMIZERS)
    warmup_steps: int = option(10_000, "recipe field warmup_steps")
    steps: int = option(1_000_000, cli=False)  # --steps stretches the schedule instead (Recipe.with_steps)
    decay: str = option("linear", cli=False)
    min_lr_ratio: float = option(0.0, cli=False)

    def check(self):
        check(self.optimizer in RECIPE_OPTIMIZERS,
              f"Unknown optimizer {self.optimizer!r}; known optimizers: {', '.join(RECIPE_OPTIMIZERS)}.")
        check_weights(self.optimizer, self.weights_dtype)
        check(self.decay in DECAYS, f"Unknown decay {self.decay!r}; known: {', '.join(DECAYS)}.")
        checks.positive("steps", self.steps)
        check(0 <= self.warmup_steps <= self.steps,
              f"warmup_steps={self.warmup_steps} must be between 0 and steps={self.steps}.")
        check(self.learning_rate > 0, f"learning_rate must be positive, got {self.learning_rate}.")
        check(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}.")
        check(self.clipnorm is None or self.clipnorm > 0, f"clipnorm must be positive or None, got {self.clipnorm}.")


@dataclass(frozen=True)
class Batches:
    """Batch geometry: rows of `sequence_length` positions, `batch_size` a micro-batch, `accumulation_steps`
    micro-batches an update."""

    recipes = None
    batch_size: int = option(32, "recipe field batch_size")
    sequence_length: int = option(128, "recipe field sequence_length")
    accumulation_steps: int = option(1, "recipe field accumulation_steps")

    def check(self):
        for name in ("batch_size", "sequence_length", "accumulation_steps"):
            checks.positive(name, getattr(self, name))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.accumulation_steps * self.sequence_length


@dataclass(frozen=True)
class SFT:
    """Supervised fine-tuning (recipes.sft): JSONL rows of messages, prompt/completion or text (recipes.sft_data)."""

    recipes = ("sft",)
    supervised: bool = option(False, cli=False)  # causal LM on examples, the loss weighted per token
    loss_on: str = option("assistant", "--recipe sft: the loss on assistant turns / completions only (default) or on "
                          "every token", choices=LOSS_ON)
    # whole examples packed into each row, attention within each (best-fit decreasing)
    packing: bool = option(False, "--recipe sft: pack whole examples into each row (best-fit decreasing); attention "
                           "stays within each example and positions restart (docs/chat.md)")

    def check(self):
        check(self.loss_on in LOSS_ON, f"Unknown loss_on {self.loss_on!r}; known: {', '.join(LOSS_ON)}.")
        if self.supervised:
            check(self.task == "causal_lm", "Supervised fine-tuning trains a decoder (task causal_lm).")


@dataclass(frozen=True)
class Chat:
    """The chat template the conversation rows of SFT and preference tuning are rendered with (recipes.conversation)."""

    recipes = ("sft", "dpo", "simpo", "grpo")
    # a .jinja file replacing the checkpoint's own template
    chat_template: str | None = option(None, "--recipe sft: a .jinja chat template instead of the checkpoint's own",
                                       metavar="FILE")
    # the template's keyword arguments (enable_thinking, date_string, ...)
    chat_template_kwargs: dict | None = option(
        None, "--recipe sft / dpo: the chat template's keyword arguments, e.g. '{\"enable_thinking\": false}' (a "
        "row's chat_template_kwargs override them)", metavar="JSON")

    def check(self):
        check(self.supervised or self.preference is not None or self.grpo or (
            not self.packing and self.chat_template is None and self.loss_on == "assistant"
            and self.chat_template_kwargs is None),
            "packing, chat_template(_kwargs) and loss_on belong to supervised fine-tuning: use recipe 'sft' "
            "(--recipe sft); a causal LM over a corpus already fills every row.")


@dataclass(frozen=True)
class Preference:
    """Preference tuning (recipes.dpo): JSONL rows of prompt / chosen / rejected (recipes.dpo_data,
    zoo.preference); the reference model's home is recipes.reference."""

    recipes = ("dpo", "simpo")
    preference: str | None = option(None, cli=False)  # "dpo" or "simpo": a causal LM on preference pairs
    beta: float = option(0.1, "--recipe dpo / simpo / grpo: DPO's beta (IPO's tau; default 0.1), SimPO's (default "
                         "2.0), GRPO's KL coefficient to the reference, LoRA's base (default 0: none)",
                         recipes=("dpo", "simpo", "grpo"))
    loss_type: str = option("sigmoid", "--recipe dpo: the DPO loss (TRL's names)", choices=DPO_LOSS_TYPES,
                            recipes=("dpo",))
    # DPO sigmoid: conservative DPO's epsilon; robust: the flip rate
    label_smoothing: float = option(0.0, "--recipe dpo: sigmoid: conservative DPO's epsilon; robust: the label flip "
                                    "rate", recipes=("dpo",))
    simpo_gamma: float = option(1.0, "--recipe simpo: the target reward margin (default 1.0)", recipes=("simpo",))
    # conversational pairs: what is scored of each answer (docs/dpo.md, "Which tokens are scored")
    completion_mask: str = option("spans", "--recipe dpo / simpo: conversational pairs score each answer's chat span "
                                  "(its text and end-of-turn token, what SFT trains; default) or, with 'trl', every "
                                  "token after the prompt's, as TRL's DPOTrainer (the separator after the end-of-turn "
                                  "token too)", choices=COMPLETION_MASKS)
    # a Hugging Face folder scored once before training; None: LoRA's base, or the start
    reference: str | None = option(None, "--recipe dpo: a reference model that scores every pair once before training "
                                   "(default: the base without its LoRA adapters, or the starting weights; "
                                   "docs/dpo.md)", metavar="FOLDER", recipes=("dpo",))

    def check(self):
        if self.preference is None:
            return
        check(self.task == "causal_lm" and not self.supervised, "Preference tuning trains a decoder (task "
              "causal_lm) on pairs; it is not supervised fine-tuning (supervised=False).")
        check(not self.packing and self.loss_on == "assistant", "Preference tuning scores each completion on "
              "its own padded row: drop packing and loss_on.")
        check(not self.fused, "Preference tuning does not run under the fused update; drop --fused.")
        check(self.completion_mask in COMPLETION_MASKS, f"Unknown completion_mask {self.completion_mask!r}; known: "
              f"{', '.join(COMPLETION_MASKS)}.")
        check(self.preference != "simpo" or self.reference is None, "SimPO has no reference; drop --reference.")
        zoo.preference.Preference(self.preference, self.beta, self.loss_type, self.label_smoothing,
                                  self.simpo_gamma, None if self.preference == "simpo" else "stored").check()

    @property
    def preference_reference(self) -> str | None:
        """Where a preference run's reference comes from (zoo.preference): "adapters" (a LoRA run's base,
        in the step), "stored" (scored once before training: by `reference`, or the starting weights),
        None (SimPO, or no preference tuning)."""
        if self.preference != "dpo":
            return None
        return "adapters" if self.lora_rank and self.reference is None else "stored"


@dataclass(frozen=True)
class GRPO:
    """GRPO (recipes.grpo): prompt-only JSONL rows, G completions of each sampled by the policy and rewarded by
    Python functions (recipes.rewards), the loss as TRL's (zoo.grpo, zoo.ops.grpo). `batch_size` counts prompts:
    a step trains on batch_size x num_generations completions."""

    recipes = ("grpo",)
    grpo: bool = option(False, cli=False)  # a causal LM trained on sampled, rewarded completions
    rewards: str = option("recipes.rewards:numeric_answer", "--recipe grpo: the reward functions by import path, "
                          "pkg.module:function, comma-separated", metavar="PATHS")
    reward_weights: str | None = option(None, "--recipe grpo: one weight per reward function, comma-separated "
                                        "(default 1.0 each)", metavar="WEIGHTS")
    num_generations: int = option(8, "--recipe grpo: completions sampled per prompt (G >= 2)")
    max_completion_length: int = option(256, "--recipe grpo: tokens a completion may have; prompts get the rest of "
                                        "sequence_length")
    grpo_loss_type: str = option("dapo", "--recipe grpo: the loss (TRL's names)", choices=GRPO_LOSS_TYPES)
    clip_epsilon: float = option(0.2, "--recipe grpo: the PPO clip range of the importance ratio")
    clip_epsilon_high: float | None = option(None, "--recipe grpo: the upper clip range (default: clip_epsilon)")
    scale_rewards: str = option("group", "--recipe grpo: divide advantages by the group's std, the batch's, or not",
                                choices=SCALE_REWARDS)
    num_iterations: int = option(1, "--recipe grpo: updates on each sampled batch (mu)")
    mask_truncated_completions: bool = option(False, "--recipe grpo: a completion cut at max_completion_length "
                                              "trains nothing")
    truncate_prompts: bool = option(False, "--recipe grpo: keep the last tokens of a prompt longer than "
                                    "sequence_length - max_completion_length, instead of dropping it")
    temperature: float = option(1.0, "--recipe grpo: the sampling temperature")
    top_k: int = option(0, "--recipe grpo: sample among the k likeliest tokens (0: all)")
    top_p: float = option(1.0, "--recipe grpo: sample within top-p (nucleus) probability mass (1.0: all)")

    def check(self):
        if not self.grpo:
            return
        check(self.task == "causal_lm" and not self.supervised and self.preference is None,
              "GRPO trains a decoder (task causal_lm) on sampled completions; it is neither supervised nor "
              "preference tuning.")
        check(not self.packing, "GRPO does not run on packed rows; drop packing.")
        check(self.accumulation_steps == 1, "GRPO's step is one update on its sampled batch: accumulation_steps=1.")
        self.grpo_settings.check()
        check(not self.beta or self.lora_rank, "GRPO's KL term (beta > 0) is to the base with LoRA's adapters off; "
              "train LoRA (--lora-rank), or set beta 0 (a stored reference is not offered yet).")
        check(self.max_completion_length < self.sequence_length, f"max_completion_length "
              f"{self.max_completion_length} leaves no room for a prompt in sequence_length {self.sequence_length}.")
        check(bool(self.reward_paths), "GRPO needs at least one reward function (--rewards pkg.module:function).")
        weights = self.weights_of_rewards
        check(weights is None or len(weights) == len(self.reward_paths), f"{len(weights or ())} reward weights for "
              f"{len(self.reward_paths)} reward functions: give one each.")
        check(self.temperature > 0 and self.top_k >= 0 and 0 < self.top_p <= 1, "temperature must be > 0, top_k >= 0 "
              f"and top_p in (0, 1]; got {self.temperature}, {self.top_k}, {self.top_p}.")

    @property
    def reward_paths(self) -> list[str]:
        return [p.strip() for p in (self.rewards or "").split(",") if p.strip()]

    @property
    def weights_of_rewards(self) -> list[float] | None:
        if self.reward_weights is None:
            return None
        try:
            return [float(w) for w in str(self.reward_weights).split(",") if w.strip()]
        except ValueError:
            raise ValueError(f"reward_weights are numbers, comma-separated; got {self.reward_weights!r}.") from None

    @property
    def grpo_settings(self) -> zoo.grpo.Grpo:
        return zoo.grpo.Grpo(self.grpo_loss_type, self.beta, self.clip_epsilon, self.clip_epsilon_high,
                             self.scale_rewards, self.num_generations, self.max_completion_length,
                             self.num_iterations, self.mask_truncated_completions)


@dataclass(frozen=True)
class Data:
    """How a corpus becomes batches (recipes.data, recipes.vocab), and the seed every recipe's order follows."""

    recipes = None
    mask_rate: float = option(0.15, cli=False)  # masked_lm only
    max_predictions: int = option(20, cli=False)  # masked_lm only: masked positions per sequence
    # tokenizer files; None: the weights' tokenizer, or one trained on the corpus
    vocabulary: str | None = option(None, "recipe field vocabulary")
    lowercase: bool = option(True, cli=False)  # WordPiece (BERT uncased)
    shuffle_buffer: int = option(10_000, cli=False)
    seed: int = option(0, cli=False)

    def check(self):
        checks.positive("shuffle_buffer", self.shuffle_buffer)
        check(0.0 < self.mask_rate < 1.0, f"mask_rate must be in (0, 1), got {self.mask_rate}.")


@dataclass(frozen=True)
class Logging:
    """Logging and checkpoints, in optimizer steps."""

    recipes = None
    log_every: int = option(100, "recipe field log_every")
    checkpoint_every: int = option(1000, "recipe field checkpoint_every")
    keep_checkpoints: int = option(2, cli=False)
    notes: str = option("", cli=False)

    def check(self):
        for name in ("log_every", "checkpoint_every", "keep_checkpoints"):
            checks.positive(name, getattr(self, name))


SECTIONS = (Model, Memory, LoRA, Optimizer, Batches, SFT, Chat, Preference, GRPO, Data, Logging)


@dataclass(frozen=True)
class Recipe(Logging, Data, GRPO, Preference, Chat, SFT, Batches, Optimizer, LoRA, Memory, Model):
    """One training run's choices, section by section (`SECTIONS`, each checking its own fields); see the module
    docstring for the sources."""

    def __post_init__(self):
        object.__setattr__(self, "task", LEGACY_TASKS.get(self.task, self.task))
        if isinstance(self.lora_targets, (list, tuple)):  # stored as run.json keeps it
            object.__setattr__(self, "lora_targets", ",".join(self.lora_targets))
        for section in SECTIONS:
            section.check(self)
        defaults = self.defaults()
        for name in defaults:  # what the API was given: a field this recipe ignores, set away from its default
            if getattr(self, name) != defaults[name]:
                refuse_if_foreign(self, name)

    # -------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The recipe whose data and loss train it (recipes.kinds): "dpo", "simpo", "grpo", "sft" or "documents"."""
        return self.preference or ("grpo" if self.grpo else "sft" if self.supervised else "documents")

    @property
    def from_weights(self) -> bool:
        """Whether the recipe only trains pretrained weights (LoRA adapters, chat or preference tuning): it
        cannot start from random ones, and is what `zoo train MODEL --weights ...` runs for a model whose own
        recipe it is. A registered one holds no weights; the run must be given them."""
        return bool(self.lora_rank or self.supervised or self.preference or self.grpo)

    def replace(self, **changes) -> Recipe:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"Unknown recipe field(s) {unknown}; valid fields: {', '.join(sorted(known))}.")
        return dataclasses.replace(self, **changes)

    def with_steps(self, steps: int) -> Recipe:
        """The same schedule shape over `steps` updates: warmup keeps its fraction of the run."""
        warmup = round(self.warmup_steps * steps / self.steps)
        return self.replace(steps=steps, warmup_steps=min(warmup, steps))

    @classmethod
    def defaults(cls) -> dict:
        """Every field's default (fields without one left out)."""
        fields = dataclasses.fields(cls)
        return {f.name: f.default for f in fields if f.default is not dataclasses.MISSING} | {
            f.name: f.default_factory() for f in fields if f.default_factory is not dataclasses.MISSING}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def section_of(name) -> type:
    """The section that defines field `name`."""
    return next(s for s in SECTIONS if name in s.__annotations__)


def refuse_if_foreign(recipe, name):
    """Field `name` refused by name where `recipe`'s kind does not read it (a DPO field on a pre-training or SFT
    run), with the recipes that do (issue 48): the run would otherwise ignore it and record it in run.json."""
    field = next(f for f in dataclasses.fields(Recipe) if f.name == name)
    owners = field.metadata.get("recipes") or section_of(name).recipes
    if owners and recipe.kind not in owners:
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"{flag} belongs to the {' / '.join(owners)} recipe{'s' * (len(owners) > 1)}, and this "
                         f"run's recipe is of kind {recipe.kind!r}, which does not read it: drop {flag}, or pass "
                         f"--recipe {owners[0]}.")


_RECIPES = Registry("recipe", Recipe)
register, names = _RECIPES.register, _RECIPES.names


def get(name: str | None = None, weights: str | None = None, **changes) -> Recipe:
    """A registered recipe, optionally starting from pretrained weights.

    Args:
        name: a recipe name (`recipes.names()`: each model's own, "classify",
            "finetune-lm", "sft", "dpo", "simpo") or any registered model name (a model registered later with
            `zoo.register` gets its family's pretraining recipe). None, with `weights`:
            the fine-tuning recipe of the checkpoint's kind ("classify" for encoders,
            "finetune-lm" for decoders).
        weights: a Hugging Face folder or Hub repo id to start from. A recipe name
            trains the checkpoint's own shape; a model name must match it.
        **changes: recipe fields to replace (`batch_size=16`, `model_overrides={...}`).

    Returns:
        A frozen `Recipe`.

    Example:
    >>> recipes.get("classify", weights="path/to/all-MiniLM-L6-v2", steps=300)
    >>> recipes.get("llama3.1-8b", weights="path/to/Llama-3.1-8B-Instruct")  # its LoRA recipe, its weights
    >>> recipes.get("enc-base", batch_size=16)
    """
    if isinstance(name, Recipe):
        recipe = name
    elif name is None:
        if weights is None:
            raise ValueError("recipes.get() needs a recipe or model name, or weights= to start from.")
        decoder = pretrained.checkpoint(weights).spec.is_decoder
        recipe = _RECIPES.get("finetune-lm" if decoder else "classify")
    elif name not in _RECIPES and name in zoo.names():
        family_default = "dec-base" if zoo.spec(name).is_decoder else "enc-base"
        recipe = _RECIPES.get(family_default).replace(model=name)
    else:
        recipe = _RECIPES.get(name, hint=" (or any zoo model name)")
    if weights is not None:
        model = name if name in zoo.names() else None
        changes = {"model": model, "weights": weights, "vocabulary": None, **changes}
    return recipe.replace(**changes) if changes else recipe


def _bert(model, **kw):
    return Recipe(
        task="masked_lm", model=model, learning_rate=1e-4, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
        weight_decay=0.01, clipnorm=1.0, warmup_steps=10_000, steps=1_000_000, decay="linear",
        batch_size=32, accumulation_steps=8, sequence_length=128, mask_rate=0.15, max_predictions=20,
        notes="BERT pretraining (Devlin et al. 2019): batch 256 as 32 x 8 accumulated micro-batches.", **kw,
    )


def _llama(model, learning_rate, min_lr_ratio, decay, steps, notes, **kw):
    return Recipe(
        task="causal_lm", model=model, learning_rate=learning_rate, beta_1=0.9, beta_2=0.95, epsilon=1e-8,
        weight_decay=0.1, clipnorm=1.0, warmup_steps=2000, steps=steps, decay=decay,
        min_lr_ratio=min_lr_ratio, batch_size=8, accumulation_steps=64, sequence_length=2048,
        lowercase=False, notes=notes, **kw,
    )


register("enc-mini", _bert("enc-mini"))
register("enc-base", _bert("enc-base"))
register("enc-large", _bert("enc-large", checkpointing="selective"))
register("enc-1b", _bert("enc-1b", checkpointing="full"))
register("dec-base", _llama("dec-base", 3e-3, 0.1, "linear", 600_000,
                            "SmolLM2-135M: 1M-token batches as 8 x 2048 x 64 accumulated; WSD approximated by linear."))
register("dec-large", _llama("dec-large", 3e-3, 0.1, "linear", 600_000,
                             "SmolLM2-360M: 1M-token batches as 8 x 2048 x 64 accumulated; WSD approximated by linear.",
                             checkpointing="selective"))
register("dec-1b", _llama("dec-1b", 4e-4, 0.1, "cosine", 1_430_000,
                          "TinyLlama-1.1B: cosine 4e-4 -> 4e-5; 2M-token batches need 8 x 2048 x 128, here 64.",
                          checkpointing="full"))
# The newer families' names pretrain with the settings of the zoo model nearest their size; to
# fine-tune a released checkpoint, use finetune-lm or classify with its weights.
for _name, _like in {"qwen2.5-0.5b": "dec-large", "qwen3-0.6b": "dec-large", "gemma3-1b": "dec-1b",
                     "modernbert-base": "enc-base", "modernbert-large": "enc-large"}.items():
    _source = _RECIPES.get(_like)
    register(_name, _source.replace(model=_name, notes=f"{_like}'s recipe on the {_name} shape "
                                                       f"({_source.notes.split(':')[0]})."))
# The 3B-8B checkpoints are fine-tuned, not pretrained, here: their recipes train LoRA adapters on the released
# weights (`recipes.get(name, weights=FOLDER)`; a run without weights is refused), on chat / instruction rows
# (recipes.sft), with the settings the authors' or PyTorch's fine-tuning configs publish for each checkpoint (cited
# in notes; docs/training.md). The frozen base is stored in bfloat16, as those configs load it; the adapters train
# in float32. QLoRA: quantize="int4" (--quantize int4). Full fine-tuning: recipe "sft" at the full rate in notes.
_TORCHTUNE = "torchtune recipes/configs/{config}_lora_single_device.yaml (and _lora.yaml)"
_ATTENTION_AND_MLP = "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # torchtune: q, v, output_proj + the MLP


def _lora_sft(model, learning_rate, warmup_steps, weight_decay, clipnorm, lora_rank, lora_alpha, lora_targets,
              accumulation_steps, notes, beta_2=0.999):
    return Recipe(
        task="causal_lm", model=model, supervised=True, precision="bfloat16", checkpointing="full",
        lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets, learning_rate=learning_rate,
        beta_1=0.9, beta_2=beta_2, epsilon=1e-8, weight_decay=weight_decay, clipnorm=clipnorm,
        warmup_steps=warmup_steps, steps=1000, decay="cosine", min_lr_ratio=0.0, batch_size=1,
        accumulation_steps=accumulation_steps, sequence_length=2048, lowercase=False, log_every=50,
        checkpoint_every=200, notes=notes,
    )


def _torchtune(model, config, lora_rank, sequences, full_lr, authors):
    """torchtune's single-device LoRA config of the checkpoint: AdamW lr 3e-4, weight decay 0.01, 100 warmup steps
    then cosine to 0, no gradient clipping (clip_grad_norm: null), alpha 2 x rank, activation checkpointing."""
    source = _TORCHTUNE.format(config=config)
    return _lora_sft(
        model, 3e-4, 100, 0.01, None, lora_rank, 2.0 * lora_rank, _ATTENTION_AND_MLP, sequences,
        f"LoRA fine-tuning, {source}: AdamW lr 3e-4, weight decay 0.01, 100 warmup steps then cosine, no clipping, "
        f"rank {lora_rank}, alpha {2 * lora_rank}, q/v/o + MLP, {sequences} sequences per update (here 1 x "
        f"{sequences} accumulated). Full fine-tuning ({config}_full*.yaml): lr {full_lr}, recipe 'sft'. {authors}")


_LLAMA_COOKBOOK = ("Meta's llama-cookbook (src/llama_cookbook/configs/training.py, peft.py) defaults differ: lr 1e-4, "
                   "no weight decay, no warmup, lr x 0.85 per epoch, no clipping, rank 8, alpha 32, q/v only.")
_QWEN25_GUIDE = ("Qwen's Qwen2.5 guide (QwenLM docs/source/training/SFT/llama_factory.rst) runs LoRA on q/v at lr "
                 "5e-6, torchtune's full-fine-tuning rate, with 100 warmup steps, weight decay 0.1, cosine: not taken.")


_QWEN3_SWIFT = ("LoRA fine-tuning, Qwen's Qwen3 guide (QwenLM/Qwen3 docs/source/training/ms_swift.md, its Qwen3-8B "
                "example): lr 1e-4, rank 8, alpha 32, all-linear, warmup 5%, 1 x 16 accumulated, max_length 2048; "
                "ms-swift's defaults (swift/trainers/arguments.py): weight decay 0.1, beta2 0.95, cosine; "
                "Hugging Face Trainer's max_grad_norm 1.0. Full fine-tuning (the same guide): lr 1e-5, recipe 'sft'.")

register("llama3.1-8b", _torchtune("llama3.1-8b", "llama3_1/8B", 8, 16, "2e-5", _LLAMA_COOKBOOK))
register("llama3.2-3b", _torchtune("llama3.2-3b", "llama3_2/3B", 64, 32, "2e-5", _LLAMA_COOKBOOK))
register("qwen2.5-3b", _torchtune("qwen2.5-3b", "qwen2_5/3B", 8, 16, "5e-6", _QWEN25_GUIDE))
register("qwen2.5-7b", _torchtune("qwen2.5-7b", "qwen2_5/7B", 8, 16, "5e-6", _QWEN25_GUIDE))
for _name in ("qwen3-4b", "qwen3-8b"):
    register(_name, _lora_sft(_name, 1e-4, 50, 0.1, 1.0, 8, 32.0, lora.ALL_LINEAR, 16, _QWEN3_SWIFT, beta_2=0.95))
# Google's Gemma 3 QLoRA guide (ai.google.dev/gemma/docs/core/huggingface_text_finetune_qlora): LoRA r 16, alpha
# 16, all-linear; SFTConfig lr 2e-4, max_grad_norm 0.3, warmup_ratio 0.03, a constant rate (here linear decay to
# the same rate), batch 1 x 4 accumulated, bf16, Trainer's AdamW (no weight decay).
register("gemma3-4b", dataclasses.replace(
    _lora_sft("gemma3-4b", 2e-4, 30, 0.0, 0.3, 16, 16.0, lora.ALL_LINEAR, 4,
              "LoRA fine-tuning, Google's Gemma 3 QLoRA guide (ai.google.dev/gemma/docs/core/"
              "huggingface_text_finetune_qlora): lr 2e-4 constant after 3% warmup, max_grad_norm 0.3, rank 16, "
              "alpha 16, all-linear, 1 x 4 accumulated, bfloat16. QLoRA: --quantize int4."),
    decay="linear", min_lr_ratio=1.0))
register("finetune-lm", Recipe(
    task="causal_lm", model="dec-base", learning_rate=5e-5, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
    weight_decay=0.0, clipnorm=1.0, warmup_steps=0, steps=1000, decay="linear", batch_size=8,
    sequence_length=512, lowercase=False, log_every=50, checkpoint_every=200,
    notes="Causal-LM fine-tuning from weights (Hugging Face run_clm.py / Trainer defaults: lr 5e-5, "
          "no warmup, linear decay, no weight decay, clipping 1.0); any decoder: recipes.get(weights=...).",
))
register("sft", Recipe(
    task="causal_lm", model="dec-base", supervised=True, learning_rate=2e-5, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
    weight_decay=0.0, clipnorm=1.0, warmup_steps=0, steps=1000, decay="linear", batch_size=8,
    sequence_length=1024, lowercase=False, log_every=50, checkpoint_every=200,
    notes="Supervised fine-tuning on conversations (TRL SFTConfig defaults: lr 2e-5, linear decay, no warmup, no "
          "weight decay, clipping 1.0, max_length 1024); with LoRA, PEFT's examples use lr 1e-4 to 2e-4.",
))
register("dpo", Recipe(
    task="causal_lm", model="dec-base", preference="dpo", beta=0.1, learning_rate=1e-6, beta_1=0.9, beta_2=0.999,
    epsilon=1e-8, weight_decay=0.0, clipnorm=1.0, warmup_steps=0, steps=1000, decay="linear", batch_size=8,
    sequence_length=1024, lowercase=False, log_every=50, checkpoint_every=200,
    notes="DPO (Rafailov et al. 2023) with TRL DPOConfig's defaults: beta 0.1, sigmoid loss, lr 1e-6, linear decay, "
          "no warmup, no weight decay, clipping 1.0, max_length 1024; with LoRA, TRL's examples use lr 5e-6 to 5e-5.",
))
register("simpo", Recipe(
    task="causal_lm", model="dec-base", preference="simpo", beta=2.0, simpo_gamma=1.0, learning_rate=8e-7,
    beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.0, clipnorm=1.0, warmup_steps=0, steps=1000,
    decay="linear", batch_size=8, sequence_length=1024, lowercase=False, log_every=50, checkpoint_every=200,
    notes="SimPO (Meng et al. 2024), reference-free: the paper's beta 2.0, gamma 1.0 (gamma/beta 0.5), lr 8e-7 "
          "(its Llama-3-Instruct settings), linear decay, clipping 1.0.",
))
register("grpo", Recipe(
    task="causal_lm", model="dec-base", grpo=True, beta=0.0, learning_rate=1e-6, beta_1=0.9, beta_2=0.999,
    epsilon=1e-8, weight_decay=0.0, clipnorm=1.0, warmup_steps=0, steps=1000, decay="linear", batch_size=2,
    sequence_length=768, lowercase=False, log_every=10, checkpoint_every=100,
    notes="GRPO (Shao et al. 2024) with TRL GRPOConfig's defaults: loss dapo, beta 0, clip 0.2, 8 generations, "
          "max_completion_length 256, temperature 1, lr 1e-6, linear decay, no warmup, no weight decay, clipping "
          "1.0; batch_size counts prompts.",
))
register("classify", Recipe(
    task="classifier", model="enc-base", learning_rate=2e-5, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
    weight_decay=0.01, clipnorm=1.0, warmup_steps=100, steps=1000, decay="linear", batch_size=32,
    sequence_length=128, log_every=50, checkpoint_every=200,
    notes="BERT GLUE fine-tuning (Devlin et al. 2019, A.3); any encoder: recipes.get('classify', model=...).",
))
