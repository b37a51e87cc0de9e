"""Every layer of one shape recomputed by one traced block, not by its own copy of the block's ops.

A training step traces every block's ops into its graph, and TensorFlow keeps each copy, instantiated, in the C
library's heap: ~0.1 GiB a block at 3B-8B, most of what a QLoRA process holds above the allocator's peak
(docs/memory.md, "Peak RSS is far above"). Where the model asks for it (`ZooModel.set_shared_blocks`), under `full`
recomputation and without dropout, a block runs as one `tf.function` per kind of block that TensorFlow does not
inline when it instantiates the step (`_noinline`): made once per step, called by every layer of that kind with the
layer's own variables as inputs, read through a Keras `StatelessScope` on the first such layer (the template). The
variables that train are positional inputs of the recomputed function: tf.recompute_grad differentiates its inputs
and the variables it reads, and passes nothing to a captured value.
"""

import weakref

import keras
import tensorflow as tf

from zoo.ops.dropout import Masks
from zoo.ops.recompute import recompute


class SharedReplays:
    """The traced blocks of one model's step, one per kind of block: what its trace depends on (its config, its
    variables' shapes and dtypes, its dtype policy, the attention settings read at call time). They live with the
    step's graph, so a step traced again (new settings, `set_attention`, a module constant a test changed) traces
    them again too, and never runs one traced for another step. Called while a step is traced (not eagerly)."""

    def __init__(self):
        self._by_graph = weakref.WeakKeyDictionary()  # a step's graph -> its traced blocks, freed with it

    def __call__(self, block, x, padding_mask):
        functions = self._by_graph.setdefault(x.graph, {})
        key = signature(block) + (padding_mask is None,)
        if key not in functions:
            functions[key] = tf.function(_block_function(block), autograph=False,
                                         experimental_attributes={"_noinline": True})
        with tf.control_dependencies([x]):  # read as the block runs, as a block traced in reads them (recompute)
            trainable, frozen = read(block.trainable_variables), read(block.non_trainable_variables)
        return functions[key](x, padding_mask, trainable, frozen)


def signature(block) -> tuple:
    attention = block.attention
    variables = tuple((tuple(v.shape), v.dtype, v.trainable) for v in block.variables)
    return (repr(sorted(block.config_args.items())), block.dtype_policy.name, variables, attention.core,
            attention.chunk_size, attention.packed)


def read(variables) -> list:
    """The variables' stored values, read where the outer step's tape sees them; not autocast (the block's call
    runs in Keras' autocast scope), since the template's layers autocast the mapped values as they read them."""
    return [tf.convert_to_tensor(v._value) for v in variables]  # Keras 3's TensorFlow Variable: `_value`


def _block_function(template):
    def replay(x, padding_mask, trainable, frozen):
        def block(h, *trained):
            mapping = list(zip(template.trainable_variables, trained))
            mapping += list(zip(template.non_trainable_variables, frozen))
            with keras.StatelessScope(state_mapping=mapping):
                return template.replay(h, padding_mask, Masks(None))

        return recompute(block, x, *trainable)

    return replay
