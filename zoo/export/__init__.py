"""Export a zoo model: a SavedModel for TF Serving (with `generate` signatures for
decoders), a .tflite file for devices (the serving graph, or a decoder's prefill/decode
pair with its key/value cache), and how far each file is from Keras.

    serving.py      the inference graph both formats are built from
    tf_serving.py   the SavedModel; generate.py its generation signatures
    tflite_file.py  the serving graph as .tflite, with a parity report
    litert.py       prefill/decode .tflite files and the loop that runs them
    convert.py      the converter, and how int8 weights are made
    stand_in.py     int8 files of models too large to convert: stand-ins, real weights after
    size.py         file size and converter memory, known before converting

GGUF files for llama.cpp are written by zoo.hub.write_gguf. Details: docs/export.md.
"""

from zoo.export.convert import INT8_MODES, QUANTIZATIONS
from zoo.export.generate import GENERATE_SIGNATURE, GENERATE_TEXT_SIGNATURE
from zoo.export.litert import LiteRTExport, LiteRTGenerator, tflite_generator
from zoo.export.serving import check_exportable, mask_count, serving_model, text_packer
from zoo.export.size import FLATBUFFER_LIMIT, check_flatbuffer, tflite_bytes
from zoo.export.tf_serving import TEXT_SIGNATURE, saved_model
from zoo.export.tflite_file import ParityReport, compare, parity_batch, run_tflite, tflite

FORMATS = ("saved_model", "tflite")

__all__ = [
    "FLATBUFFER_LIMIT", "FORMATS", "GENERATE_SIGNATURE", "GENERATE_TEXT_SIGNATURE", "INT8_MODES", "QUANTIZATIONS",
    "TEXT_SIGNATURE", "LiteRTExport", "LiteRTGenerator", "ParityReport", "check_exportable", "check_flatbuffer",
    "compare", "mask_count", "parity_batch", "run_tflite", "saved_model", "serving_model", "text_packer", "tflite",
    "tflite_bytes", "tflite_generator",
]
