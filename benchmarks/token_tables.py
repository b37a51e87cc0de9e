"""How much a quantized token table costs the LM head of a real checkpoint: the logits of SmolLM2-135M-Instruct
(the real GGUF weights, dequantised; its embedding is its tied head) with only the table quantized, against the
float model, on held-out news text.

    python benchmarks/token_tables.py [--rows 8 --sequence-length 128]

Rows: int8 with a scale per row (zoo.checks.TABLE_MODE, what a quantized base keeps its tables in, through
zoo.ops.quantized_head's slices) and Keras' int4 (blocks of 128 along the width, what the tables were before);
every other weight float32. Measures: max |logits - float| / max |float logits|, the mean KL(float || quantized) of
the next-token distributions, and how often the top-1 token agrees. Prints a table and one JSON line.
"""

import argparse
import csv
import sys
import tempfile
import zipfile
from pathlib import Path

import _harness


def texts(archive, count):
    with zipfile.ZipFile(archive) as z, z.open("NewsArticles.csv") as raw:
        lines = (line.decode("utf-8", errors="replace") for line in raw)
        articles = [" ".join(row["text"].split()) for row in csv.DictReader(lines) if row["text"].strip()]
    return articles[-count:]  # the last articles: benchmarks/finetune_smollm2.py holds them out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="articles, one row each")
    parser.add_argument("--sequence-length", type=int, default=128)
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    import zoo
    from zoo.chat import Chat
    from zoo.quantization import quantization_config

    paths = _harness.fetch("smollm2", "news")
    folder = zoo.hub.convert_gguf(paths["smollm2"], Path(tempfile.mkdtemp(prefix="token-tables-")) / "SmolLM2")
    tokenizer = Chat.find(folder).tokenizer.tokenizer
    ids = np.zeros((args.rows, args.sequence_length), np.int32)
    for row, text in enumerate(texts(paths["news"], args.rows)):
        encoded = tokenizer.encode(text).ids[:args.sequence_length]
        ids[row, :len(encoded)] = encoded
    x = {"token_ids": tf.constant(ids), "padding_mask": tf.constant((ids != 0).astype(np.int32))}
    real = ids != 0

    def logits(mode):
        model = zoo.hub.load(folder, tokenizer=False)
        if mode:
            model.backbone.token_embedding.quantize(mode, type_check=False, config=quantization_config(mode))
        return model.lm_logits(model.backbone(x, training=False)["sequence_output"]).numpy()[real]

    reference = logits(None)
    log_p = tf.nn.log_softmax(reference).numpy()
    rows = {}
    for mode in ("int8", "int4"):
        got = logits(mode)
        log_q = tf.nn.log_softmax(got).numpy()
        rows[mode] = {"max_rel": float(np.abs(got - reference).max() / np.abs(reference).max()),
                      "mean_kl": float(np.mean(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1))),
                      "top1_agree": float(np.mean(got.argmax(-1) == reference.argmax(-1)))}
        keras.backend.clear_session()
    print(f"SmolLM2-135M-Instruct, {int(real.sum())} held-out news positions; only the token table quantized")
    print(f"{'table':6s} {'max |dlogit| / max |logit|':>27s} {'mean KL(float||q)':>18s} {'top-1 agrees':>13s}")
    for mode, r in rows.items():
        print(f"{mode:6s} {r['max_rel']:27.2e} {r['mean_kl']:18.2e} {r['top1_agree']:13.1%}")
    _harness.print_metrics({"benchmark": "token_tables", "weights": "SmolLM2-135M-Instruct Q4_1 GGUF, dequantised",
                            "positions": int(real.sum()), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
