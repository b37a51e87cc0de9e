"""GGUF files written by zoo and what transformers reads from them, for
`tests/zoo/test_gguf_writer.py` (which has neither torch nor transformers).

transformers' GGUF loader is an independent reader of llama.cpp's layout: it maps
the tensor names, un-permutes the query/key rows and builds the tokenizer from the
metadata its own way. So zoo writes the files once (`make`, keras-zoo's venv), and
transformers loads each one (`check`, the throwaway torch venv) and records its
logits and its tokenization beside them in `tests/fixtures/gguf/expected.npz`:

    python tools/make_gguf_fixtures.py make                  # keras-zoo's venv
    /tmp/hfvenv/bin/python tools/make_gguf_fixtures.py check # torch, transformers, gguf

The models are the tiny transformers Llama of tests/fixtures/hf/llama-rope-parameters
(grouped-query attention: 4 query heads, 2 KV heads; rope theta 500000; rms eps 1e-2),
written untied as q8_0 and, with the LM head tied to the embedding, as f16. The
tokenizer is a 100-token byte-level BPE trained here with `tokenizers` on a few
sentences (vocab.json + merges.txt, committed next to the files).
"""

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "gguf"
SOURCE = REPO / "tests" / "fixtures" / "hf" / "llama-rope-parameters"
# file name -> (quantize, tie the head to the embedding)
FILES = {"llama-q8_0.gguf": ("q8_0", False), "llama-tied-f16.gguf": ("f16", True)}
CORPUS = ["The quick brown fox jumps over the lazy dog.", "A tiny model writes a tiny file, and the file is read back.",
          "Hello world! Tokens are merged, then merged again.", "the theory: then there, these three."]
TEXT = "The lazy fox reads the tiny file again."
VOCAB_SIZE = 100  # below the model's 128: the file pads with [PAD100].. as llama.cpp does
SPECIAL = "<|endoftext|>"
sys.path.insert(0, str(REPO))  # this checkout's zoo, not an installed one


def train_tokenizer(folder):
    """A byte-level BPE (GPT-2 pre-tokenizer) of VOCAB_SIZE tokens: id 0 is the special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[SPECIAL], show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.model.save(str(folder))  # vocab.json + merges.txt


def models():
    """(file name, zoo model, quantize) for each fixture file."""
    from zoo import hub
    from zoo.hub.tokenizers import byte_pair

    tokenizer = byte_pair(ROOT / "tokenizer", unsplittable_tokens=[SPECIAL])
    for name, (quantize, tied) in FILES.items():
        model = hub.load(SOURCE, tie_embeddings=True) if tied else hub.load(SOURCE)
        model.__dict__["tokenizer"] = tokenizer
        yield name, model, quantize


def make():
    from zoo.hub.gguf_writer import write_gguf

    train_tokenizer(ROOT / "tokenizer")
    for name, model, quantize in models():
        path = write_gguf(model, ROOT / name, quantize=quantize, bos_token_id=0, eos_token_id=0,
                          name="keras-zoo tiny llama", overwrite=True)
        print(f"{path}: {path.stat().st_size / 1024:.1f} KiB")


def check():
    """transformers' side: load each file (model and tokenizer), record logits and the text's ids."""
    import torch
    import transformers

    inputs = np.load(SOURCE / "expected.npz", allow_pickle=False)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    out = {"input_ids": ids, "attention_mask": mask}
    for name in FILES:
        model = transformers.AutoModelForCausalLM.from_pretrained(ROOT, gguf_file=name, dtype=torch.float32,
                                                                  attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        tokenizer = transformers.AutoTokenizer.from_pretrained(ROOT, gguf_file=name)
        key = name.removesuffix(".gguf")
        out[f"logits/{key}"] = logits
        out[f"text_ids/{key}"] = np.asarray(tokenizer(TEXT, add_special_tokens=False)["input_ids"], np.int64)
        config = model.config
        print(f"{name}: {type(model).__name__}, tied={config.tie_word_embeddings}, heads {config.num_attention_heads}/"
              f"{config.num_key_value_heads}, theta {config.rope_parameters['rope_theta']}, eps {config.rms_norm_eps}, "
              f"{type(tokenizer).__name__} {len(tokenizer)} tokens, text -> {out[f'text_ids/{key}'].tolist()}")
    np.savez(ROOT / "expected.npz", **out)
    (ROOT / "versions.json").write_text(json.dumps({"transformers": transformers.__version__,
                                                    "torch": torch.__version__}, indent=2) + "\n")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "make":
        make()
    elif command == "check":
        check()
    else:
        sys.exit(__doc__)
