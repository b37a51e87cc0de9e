"""TensorFlow-only tensor functions: no Keras layers and no zoo imports beyond zoo.ops, so that
layers, training steps and the planner can all build on them.

  attention_core   softmax(QKᵀ/√d)·V in two cores: chunked (O(s) memory) and plain (the reference)
  lm_loss          the chunked causal-LM loss
  recompute        activation recomputation (tf.recompute_grad) and the policies
  position_chunks  a position-wise function (a block's MLP) over chunks of positions, each recomputed in
                   the backward: what "full"'s replay runs at a long sequence
  dropout          dropout from an explicit seed, equal on one device and across replicas; masks
                   held as bits for a block that runs again (full's replay)
  activations      a GELU that keeps less for the backward pass
  ordering         making TF's executor wait (`after`) and zeros Grappler cannot fold
  rounding         stochastic rounding of float32 into bfloat16 (bfloat16 weights)
  scratch_graphs   freeing what Keras' output-shape tracing holds (every build calls it)
"""

from zoo.ops.attention_core import attention, chunked_attention, plain_attention
from zoo.ops.lm_loss import chunked_lm_loss

__all__ = ["attention", "chunked_attention", "chunked_lm_loss", "plain_attention"]
