"""Shapes and helpers the tests share. Fixtures live in the conftest.py files.

Every unit test shrinks a registered model to a tiny shape; full-size models are
exercised in benchmarks/ only.
"""

import os
from pathlib import Path

import keras

REPO = Path(__file__).resolve().parents[1]

# The shape every unit test shrinks a registered model to.
TINY = dict(num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, vocab_size=128)
TINY_DEC = dict(TINY, num_kv_heads=2)  # grouped-query attention: 2 query heads per KV head
# Recipes train a vocabulary of 512 on real text.
TINY_RECIPE = dict(TINY, vocab_size=512)
TINY_RECIPE_DEC = dict(TINY_RECIPE, num_kv_heads=2)


def fresh_process_env(without=(), **changes):
    """The environment of a fresh Python process a test starts: this one's without pytest-xdist's PYTEST_*
    variables (the child is not a worker) and the names in `without`, the repository importable, then `changes`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in without}
    return {**env, "PYTHONPATH": str(REPO), **changes}


def one_stack_for_every_op():
    """TensorFlow records the Python stack of every op it adds to a graph (100+ frames deep under pytest), for its
    error messages only. Tracing is this suite's largest cost (~40% of its CPU seconds, py-spy, 2026-12-07) and the
    recording ~15% of a trace: a decoder's step traced 4 times took 3.09-3.35 s of CPU with it, 2.64-2.77 s without
    (AVX2-only EPYC). Every op gets this one short stack instead, so an error raised inside a traced graph names
    this function where it would name the op's line: ZOO_TEST_OP_STACKS=1 records them again (tests/conftest.py, and
    the training processes tests/recipes/distribute_child.py starts)."""
    from tensorflow.python.util import tf_stack

    def op_stacks_are_off_in_the_tests_set_zoo_test_op_stacks_1():
        return tf_stack.extract_stack()  # on this thread: XLA reads the frames' file names back

    stack = [op_stacks_are_off_in_the_tests_set_zoo_test_op_stacks_1()]
    tf_stack.extract_stack = lambda stacklevel=1: stack[0]


def allocator_peak(run, repeats=5):
    """Bytes TF's allocator peaked at during `run()` above what was allocated before it: the
    least over `repeats` calls, after one unmeasured call (tracing). The executor runs whatever is
    ready on its threads, so one call in three peaks a few tensors higher than its schedule
    (measured: 20 MiB steps at 25-32 MiB, more often after other tests in the process); what the
    schedule holds is in every call, so the least call is the measurement. The tests' processes always
    have the allocator's statistics (tests/conftest.py), whatever the CPU and oneDNN."""
    from zoo.memory import PeakMemory
    from zoo.memory.measure import ALLOCATOR

    run()
    peaks = []
    for _ in range(repeats):
        with PeakMemory("CPU:0") as peak:
            run()
        assert peak.measure == ALLOCATOR, peak.measure
        peaks.append(peak.used_bytes)
    return min(peaks)


def exact_gelu(backbone):
    """keras-hub's BERT uses tanh-approximate GELU; the checkpoints (hidden_act='gelu') use erf."""
    for i in range(backbone.num_layers):
        backbone.get_layer(f"transformer_layer_{i}")._feedforward_intermediate_dense.activation = (
            lambda z: keras.activations.gelu(z, approximate=False))
    return backbone


def tiny_recipe(recipe, steps=20, **changes):
    """`recipe` shrunk to test size: 2 layers x 64, vocabulary 512, 32-token rows."""
    import recipes

    recipe = recipes.get(recipe)
    shape = TINY_RECIPE_DEC if recipe.task == "causal_lm" else TINY_RECIPE
    base = dict(model_overrides=shape, batch_size=8, sequence_length=32, accumulation_steps=1, steps=steps,
                warmup_steps=2, log_every=10, checkpoint_every=10, shuffle_buffer=64, max_predictions=5)
    return recipe.replace(**{**base, **changes})


def llama_cpp_permute(weight, heads):
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` (Hugging Face -> GGUF row order),
    written out here independently of zoo's inverse."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def same_graph_and_weights(path_a, path_b):
    """Two .tflite files compute the same thing: operator for operator the same op, options and
    tensors (shape, type, quantization, constant bytes). Tensor numbering may differ."""
    from tensorflow.lite.tools import flatbuffer_utils

    a, b = flatbuffer_utils.read_model(str(path_a)), flatbuffer_utils.read_model(str(path_b))

    def described(model, subgraph, index):
        tensor = subgraph.tensors[index]
        data, q = model.buffers[tensor.buffer].data, tensor.quantization
        scales = None if q is None or q.scale is None else (list(q.scale), list(q.zeroPoint), q.quantizedDimension)
        return list(tensor.shape), tensor.type, scales, None if data is None else bytes(data)

    def code(model, op):
        c = model.operatorCodes[op.opcodeIndex]
        return max(c.builtinCode, c.deprecatedBuiltinCode)

    def options(op):
        return None if op.builtinOptions is None else vars(op.builtinOptions)

    compared = 0
    assert len(a.subgraphs) == len(b.subgraphs)
    for sa, sb in zip(a.subgraphs, b.subgraphs):
        assert len(sa.operators) == len(sb.operators)
        for oa, ob in zip(sa.operators, sb.operators):
            assert code(a, oa) == code(b, ob) and options(oa) == options(ob)
            for ia, ib in zip(list(oa.inputs) + list(oa.outputs), list(ob.inputs) + list(ob.outputs)):
                assert (ia < 0) == (ib < 0)
                if ia >= 0:
                    assert described(a, sa, ia) == described(b, sb, ib), sa.tensors[ia].name
                    compared += 1
    return compared


def mlp_in_chunks(monkeypatch, positions, width):
    """Makes `full`'s replay run a `width`-wide MLP in chunks of `positions` (zoo.ops.position_chunks.CHUNK_BYTES,
    which real models pass at thousands of positions); returns the list that each chunked call appends its
    (chunk, sequence length) to, to show the chunks ran."""
    import zoo.layers.block as block_module
    from zoo.ops import position_chunks

    calls = []

    def counting(fn, x, chunk):
        if chunk < x.shape[1]:
            calls.append((chunk, x.shape[1]))
        return position_chunks.in_position_chunks(fn, x, chunk)

    monkeypatch.setattr(block_module, "in_position_chunks", counting)
    monkeypatch.setattr(position_chunks, "CHUNK_BYTES", positions * 4 * width)
    return calls
