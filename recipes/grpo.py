"""The GRPO recipe on the skeleton (recipes.runner): online RL with verifiable rewards, as TRL's GRPOTrainer, on a
pretrained (usually instruction-tuned) decoder with no second model in memory.

Its data are TRL's prompt-only rows (JSONL): `prompt` as text, or as messages rendered with the checkpoint's chat
template and its generation prompt; every other column goes to the reward functions (recipes.rewards), one entry
per completion. A prompt longer than sequence_length - max_completion_length is dropped and counted (or, with
truncate_prompts, cut to its last tokens, as TRL's max_prompt_length cuts from the left). Its batches
are prompt rows; its step (zoo.grpo.GrpoStep) samples G completions of each with the policy, rewards them, and
trains on them; its metrics are TRL's (reward, rewards/<function>/mean, completions/..., kl, entropy,
clip_ratio/...).

    zoo train --recipe grpo --weights smollm2-135m-instruct/ --data problems.jsonl --out-dir runs/grpo \\
        --lora-rank 16 --lora-targets all-linear --rewards recipes.rewards:numeric_answer --num-generations 8
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

import zoo
from recipes import kinds, rewards
from recipes.conversation import read_rows, save_chat, tokenizer_and_template
from recipes.kinds import Examples
from zoo.chat import Chat

FORMATS = {"prompt-only": ("prompt",)}


class GrpoTuning(kinds.Kind):
    """Its data: prompt rows (token ids, text or messages, and their columns); its step: zoo.grpo's, run eagerly."""

    eager = True  # the step calls Python reward functions between its traced generation and update

    def check(self, recipe, source):
        if recipe.weights is None:
            raise ValueError("GRPO starts from a pretrained decoder (usually an instruction-tuned one): pass weights= "
                             "(--weights FOLDER).")
        if source.validation_every:
            raise ValueError("GRPO has no validation pass yet: drop --validation-every.")
        rewards.load(recipe.reward_paths)  # a path that does not import stops the run here, before reading

    def read(self, recipe, source, out_dir) -> Examples:
        tokenizer, template = tokenizer_and_template(recipe, out_dir)
        _, rows = read_rows(source.path, FORMATS, "TRL's prompt-only rows: 'prompt' as text or messages")
        limit = recipe.sequence_length - recipe.max_completion_length
        chat = Chat(template, tokenizer) if template is not None else None
        prompts, kept, too_long, truncated = [], [], 0, 0
        for number, row in enumerate(rows, 1):
            prompt = row["prompt"]
            if isinstance(prompt, list):
                if chat is None:
                    raise ValueError(f"{source.path}, row {number}: a conversational prompt, and the checkpoint has "
                                     "no chat template; give text prompts or a template (--chat-template FILE).")
                ids = chat.prompt_ids(prompt, **(recipe.chat_template_kwargs or {}))
            elif isinstance(prompt, str) and prompt:
                ids = tokenizer.encode([prompt], [None])[0].ids
            else:
                raise ValueError(f"{source.path}, row {number}: 'prompt' must be text or a list of messages; got "
                                 f"{type(prompt).__name__}.")
            if len(ids) > limit and recipe.truncate_prompts:
                ids, truncated = ids[-limit:], truncated + 1
            elif len(ids) > limit:
                too_long += 1
                continue
            prompts.append(np.asarray(ids, np.int32))
            kept.append({**row, "_row": number})
        print(f"GRPO prompts: {len(kept)} of {len(rows)} kept ({truncated} cut to their last {limit} tokens); "
              f"{too_long} longer than {limit} tokens (sequence_length - max_completion_length) dropped.")
        if len(kept) < recipe.batch_size:
            raise ValueError(f"{len(kept)} prompt(s) make no batch of {recipe.batch_size}; lower --batch-size, give "
                             "more prompts, or raise --sequence-length.")
        stops = chat.stop_ids if chat is not None else []
        return Examples(train={"prompts": prompts, "rows": kept, "stops": stops, "tokenizer": tokenizer},
                        data={"prompts": len(kept), "too_long": too_long, "truncated": truncated},
                        beside_tokenizer=functools.partial(save_chat, tokenizer, template),
                        tokens_per_batch=recipe.batch_size * recipe.num_generations * recipe.max_completion_length)

    def before_fit(self, recipe, model, cluster, out_dir, examples):
        """The step, on the built (and resumed) model: its prompts, rewards and sampler."""
        train = examples.train
        functions = rewards.load(recipe.reward_paths)
        decode = train["tokenizer"].tokenizer.decode

        def score(indices, sampled):
            picked = [train["rows"][i] for i in indices]
            conversational = isinstance(picked[0]["prompt"], list)
            completions = []
            for ids, length in zip(sampled["completion_ids"], sampled["completion_lengths"]):
                text = decode([int(t) for t in ids[:length]], skip_special_tokens=True)
                completions.append([{"role": "assistant", "content": text}] if conversational else text)
            columns = {k: [row.get(k) for row in picked] for k in picked[0] if k not in ("prompt", "_row")}
            return rewards.score(functions, recipe.weights_of_rewards, [row["prompt"] for row in picked],
                                 completions, columns, rows=[row["_row"] for row in picked])

        sampler = "top_k" if recipe.top_k else ("top_p" if recipe.top_p < 1.0 else "random")
        options = {"temperature": recipe.temperature, **({"top_k": recipe.top_k} if recipe.top_k else {}),
                   **({"top_p": recipe.top_p} if sampler == "top_p" else {})}
        step = zoo.grpo.GrpoStep(recipe.grpo_settings, train["prompts"], score,
                                 [rewards.name_of(f) for f in functions], train["stops"], 0, recipe.seed, sampler,
                                 **options)
        zoo.grpo.set_grpo(model, step)

    def datasets(self, recipe, examples, tokenizer, skip, distributed):
        """Prompt rows, shuffled with the seed each epoch, `batch_size` a step, from batch `skip` on; each batch
        repeated num_iterations times (the step samples once and updates mu times, as TRL's sampler repeats)."""
        count = len(examples.train["prompts"])
        rows = tf.data.Dataset.range(count).shuffle(count, seed=recipe.seed, reshuffle_each_iteration=True)
        batches = rows.repeat().batch(recipe.batch_size, drop_remainder=True)
        if recipe.num_iterations > 1:
            batches = batches.flat_map(lambda b: tf.data.Dataset.from_tensors(b).repeat(recipe.num_iterations))
        return batches.skip(skip).map(lambda b: {"rows": tf.cast(b, tf.int32)}), None

    def logged(self, key) -> bool:
        return super().logged(key) or key.startswith(("reward", "completions/", "kl", "entropy", "clip_ratio/",
                                                      "frac_reward_zero_std", "tokens_per_second/"))


kinds.register("grpo", GrpoTuning())
