"""Tokenizers for training: keras-hub WordPiece for the BERT family, keras-hub
byte-level BPE for the Llama family, each loaded from files or trained on the
corpus when the model has none (zoo models ship shapes, not vocabularies).
Every encoder trains BERT's kind (its pipelines need [CLS], [SEP], [MASK] and
[PAD]) and every decoder Llama's: `family_of(spec)` says which.

WordPiece vocabularies are trained with keras-hub's
`compute_word_piece_vocabulary`. keras-hub has no BPE trainer, so byte-level BPE
merges are learned with Hugging Face `tokenizers` (a keras-hub dependency) and
loaded into keras-hub's `BytePairTokenizer`, which is what runs in tf.data.
"""

import os
import shutil

import keras_hub
import tensorflow as tf

from zoo.hub import tokenizers

WORDPIECE_SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
EOS = "<|endoftext|>"
WORDPIECE_FILE = tokenizers.WORDPIECE_FILE
BPE_FILES = tokenizers.BPE_FILES


def family_of(spec) -> str:
    """The tokenizer family ("bert" or "llama") a run of `spec` trains or reads: ModernBERT
    takes BERT's WordPiece, Qwen and Gemma Llama's byte-level BPE (a checkpoint's own
    tokenizer comes through zoo.hub instead)."""
    return "llama" if spec.is_decoder else "bert"


def files_in(folder, family) -> bool:
    names = (WORDPIECE_FILE,) if family == "bert" else BPE_FILES
    return all(os.path.isfile(os.path.join(folder, name)) for name in names)


def load(path, family, lowercase=True):
    """A keras-hub tokenizer from `path`: a vocab.txt (or a folder holding one) for
    the BERT family; a folder with vocab.json and merges.txt for the Llama family.
    The files are read by `zoo.hub.tokenizers`, as `zoo.hub.load` reads them."""
    if family == "bert":
        return tokenizers.wordpiece(path, lowercase=lowercase, special_tokens=False, dtype="int32")
    return tokenizers.byte_pair(path, unsplittable_tokens=[EOS], dtype="int32")


def train(texts: tf.data.Dataset, family, vocabulary_size, folder, lowercase=True, max_documents=20_000):
    """Learn a vocabulary of at most `vocabulary_size` tokens from the first
    `max_documents` documents of `texts` and write its files into `folder`."""
    os.makedirs(folder, exist_ok=True)
    texts = texts.take(max_documents)
    if family == "bert":
        keras_hub.tokenizers.compute_word_piece_vocabulary(
            texts.batch(256), vocabulary_size, vocabulary_output_file=os.path.join(folder, WORDPIECE_FILE),
            lowercase=lowercase, reserved_tokens=WORDPIECE_SPECIALS,
        )
    else:
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer()
        stream = (t.decode("utf-8") for t in texts.as_numpy_iterator())
        bpe.train_from_iterator(stream, vocab_size=vocabulary_size, min_frequency=2, special_tokens=[EOS],
                                 show_progress=False)  # its bars print blank lines off a terminal
        bpe.save_model(folder)
    return load(folder, family, lowercase)


def special_ids(tokenizer) -> dict:
    """Ids of the special tokens a pipeline needs, by role."""
    vocabulary = set(tokenizer.get_vocabulary())
    if isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        roles = dict(zip(("pad", "cls", "sep", "unk", "mask"), WORDPIECE_SPECIALS))
        missing = [token for token in roles.values() if token not in vocabulary]
        if missing:
            raise ValueError(f"The vocabulary lacks the special token(s) {missing}; add them or train a vocabulary.")
    else:
        eos = next((name for name in tokenizers.END_OF_TEXT if name in vocabulary), None)
        if eos is None:
            names = ", ".join(tokenizers.END_OF_TEXT)
            raise ValueError(f"The vocabulary has no end-of-text token (looked for {names}); add one or train a "
                             "vocabulary.")
        roles = {"eos": eos}
    return {role: tokenizer.token_to_id(token) for role, token in roles.items()}


def copy(source, family, folder):
    """Copy the vocabulary files at `source` (as `load` takes it) into `folder`, so
    that a run's output is self-contained and a resumed run tokenizes the same way."""
    os.makedirs(folder, exist_ok=True)
    if family == "bert":
        vocab = source if os.path.isfile(source) else os.path.join(source, WORDPIECE_FILE)
        shutil.copyfile(vocab, os.path.join(folder, WORDPIECE_FILE))
    else:
        for name in BPE_FILES:
            shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))
