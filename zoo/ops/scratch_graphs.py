"""Letting go of the scratch graphs Keras traces to infer a functional model's output shapes.

A functional model infers each layer's output by calling it once in a scratch FuncGraph
(keras/src/backend/tensorflow/core.py `compute_output_spec`), which captures every variable the
call reads. A `tf.custom_gradient` in that call (tf.nn.silu, zoo's GELU, the chunked attention
core) registers its gradient in TensorFlow's global registry for good, and the registered
function holds the scratch graph, its captures and so every variable of the model: a deleted zoo
model was never freed, and a kernel `Model.quantize` replaced stayed alive (measured: docs/lora.md).
A scratch graph is never differentiated, so its registered gradients can go.
"""

import tensorflow as tf
from tensorflow.python.framework import ops


def release_scratch_graphs() -> int:
    """Drop the gradient registrations that hold a scratch graph; returns how many there were."""
    registry = ops._gradient_registry._registry
    held = [name for name, entry in registry.items()
            if name.startswith("CustomGradient-") and _scratch(_graph_of(entry["type"]))]
    for name in held:
        del registry[name]
    return len(held)


def _scratch(graph) -> bool:
    return graph is not None and graph.name.startswith("scratch_graph")


def _graph_of(function, depth=3):
    """The graph of the first tensor a (registered gradient) function's closures hold."""
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value) and not hasattr(value, "graph"):
            graph = _graph_of(value, depth - 1) if depth else None
        else:
            graph = next((t.graph for t in _flatten(value) if hasattr(t, "graph")), None)
        if graph is not None:
            return graph
    return None


def _flatten(value):
    try:
        return tf.nest.flatten(value)
    except (TypeError, ValueError):
        return []
