"""Exact parameter counts of the full-size checkpoints issues 23 and 36 register, from transformers itself.

Each model is built on the meta device (no memory, no download) from the values of its
published config.json, and its parameters are counted once each (a tied LM head is the
embedding). The configs are written from the files on the Hugging Face Hub as known to us;
nothing here is downloaded. Run in the throwaway torch venv:

    /tmp/hfvenv/bin/python tools/hf_param_counts.py        # a table and one JSON line
"""

import json

MODERNBERT_BASE = dict(
    vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
    hidden_activation="gelu", max_position_embeddings=8192, norm_eps=1e-5, norm_bias=False, attention_bias=False,
    mlp_bias=False, decoder_bias=True, classifier_bias=False, classifier_activation="gelu", classifier_pooling="mean",
    global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0, local_rope_theta=10000.0,
    pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)
# The values the Llama 3.1/3.2, Qwen2.5 and Qwen3 checkpoints share, by family (each entry adds its sizes).
LLAMA3 = dict(
    vocab_size=128256, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5,
    rope_theta=500000.0, attention_bias=False, mlp_bias=False, bos_token_id=128000, eos_token_id=128001,
    rope_scaling=dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192))
QWEN25 = dict(
    vocab_size=151936, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
    use_sliding_window=False, sliding_window=32768, bos_token_id=151643, eos_token_id=151643)
QWEN3 = dict(
    vocab_size=151936, num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=40960,
    rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, use_sliding_window=False, sliding_window=None,
    max_window_layers=36, bos_token_id=151643, eos_token_id=151645)
# name -> (transformers class, config class, config.json values). Keys and values as in the Hub files
# (transformers 4 format: top-level rope_theta, sliding_window_pattern, global_rope_theta, ...), which
# transformers 5 converts on load exactly as it does from_pretrained.
CHECKPOINTS = {
    # Qwen/Qwen2.5-0.5B config.json (model card: 0.49B parameters, 0.36B without embeddings)
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
        max_window_layers=24, bos_token_id=151643, eos_token_id=151643)),
    # Qwen/Qwen3-0.6B config.json (model card: 0.6B parameters, 0.44B without embeddings)
    "qwen3-0.6b": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=None, max_window_layers=28, bos_token_id=151643, eos_token_id=151645)),
    # google/gemma-3-1b-pt config.json (Gemma3ForCausalLM, model_type gemma3_text; "1B")
    "gemma3-1b": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
        query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6, attn_logit_softcapping=None,
        final_logit_softcapping=None, attention_bias=False, tie_word_embeddings=True, pad_token_id=0,
        bos_token_id=2, eos_token_id=1)),
    # google/gemma-3-4b-pt config.json's text_config (Gemma3ForConditionalGeneration; its language model as
    # Gemma3ForCausalLM: model card "4B" with the 417M-parameter vision tower, which is not counted here)
    "gemma3-4b": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=256, sliding_window=1024,
        sliding_window_pattern=6, attn_logit_softcapping=None, final_logit_softcapping=None, attention_bias=False,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)),
    # meta-llama/Llama-3.2-3B config.json (model card: 3.21B parameters)
    "llama3.2-3b": ("LlamaForCausalLM", "LlamaConfig", dict(
        LLAMA3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24, head_dim=128,
        rope_scaling=dict(LLAMA3["rope_scaling"], factor=32.0), tie_word_embeddings=True)),
    # meta-llama/Llama-3.1-8B config.json (model card: 8.03B parameters)
    "llama3.1-8b": ("LlamaForCausalLM", "LlamaConfig", dict(
        LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, head_dim=128,
        rope_scaling=dict(LLAMA3["rope_scaling"], factor=8.0), tie_word_embeddings=False)),
    # Qwen/Qwen2.5-3B config.json (model card: 3.09B parameters)
    "qwen2.5-3b": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        QWEN25, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, max_window_layers=36, tie_word_embeddings=True)),
    # Qwen/Qwen2.5-7B config.json (model card: 7.61B parameters)
    "qwen2.5-7b": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        QWEN25, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072, sliding_window=131072,
        max_window_layers=28, tie_word_embeddings=False)),
    # Qwen/Qwen3-4B config.json (model card: 4.0B parameters)
    "qwen3-4b": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        tie_word_embeddings=True)),
    # Qwen/Qwen3-8B config.json (model card: 8.2B parameters)
    "qwen3-8b": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        tie_word_embeddings=False)),
    # answerdotai/ModernBERT-base config.json (model card: 149M parameters)
    "modernbert-base": ("ModernBertForMaskedLM", "ModernBertConfig", MODERNBERT_BASE),
    # answerdotai/ModernBERT-large config.json (model card: 395M parameters): base's, but for these sizes
    "modernbert-large": ("ModernBertForMaskedLM", "ModernBertConfig", dict(
        MODERNBERT_BASE, hidden_size=1024, intermediate_size=2624, num_hidden_layers=28, num_attention_heads=16)),
}
# the other heads the issue names, counted on the same backbones
EXTRA_HEADS = {"modernbert-base": ("ModernBertForSequenceClassification", 2),
               "modernbert-large": ("ModernBertForSequenceClassification", 2)}


def count(module):
    """Parameters counted once each (a tied head shares the embedding's tensor)."""
    return sum(p.numel() for p in module.parameters())


def build(cls_name, config_name, values, **extra):
    import torch
    import transformers

    config = getattr(transformers, config_name)(**values, **extra)
    with torch.device("meta"):
        return getattr(transformers, cls_name)(config), config


def main():
    rows = {}
    for name, (cls_name, config_name, values) in CHECKPOINTS.items():
        model, config = build(cls_name, config_name, values)
        base = model.model
        embedding = base.get_input_embeddings().weight.numel()
        kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers  # Llama has none
        row = {
            "class": cls_name,
            "params": count(model),
            "backbone": count(base),
            "embedding": embedding,
            "non_embedding": count(model) - embedding,
            "tied": bool(config.tie_word_embeddings),
            "layer_types": {kind: kinds.count(kind) for kind in sorted(set(kinds))},
            "rope": config.rope_parameters,
            "sliding_window": getattr(config, "sliding_window", None),
        }
        if name in EXTRA_HEADS:
            head, labels = EXTRA_HEADS[name]
            row[f"{head}(num_labels={labels})"] = count(build(head, config_name, values, num_labels=labels)[0])
        rows[name] = row
    print(f"{'name':18} {'class':24} {'params':>13} {'backbone':>13} {'embedding':>12} {'non-embedding':>13}")
    for name, row in rows.items():
        print(f"{name:18} {row['class']:24} {row['params']:13,d} {row['backbone']:13,d} {row['embedding']:12,d} "
              f"{row['non_embedding']:13,d}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
