"""Model classes by family and task."""

from zoo.models.decoder import DecoderBackbone, DecoderCausalLM
from zoo.models.encoder import EncoderBackbone, EncoderClassifier, EncoderMaskedLM

TASKS = {
    "bert": {"backbone": EncoderBackbone, "masked_lm": EncoderMaskedLM, "classifier": EncoderClassifier},
    "llama": {"backbone": DecoderBackbone, "causal_lm": DecoderCausalLM},
}

__all__ = ["TASKS", "DecoderBackbone", "DecoderCausalLM", "EncoderBackbone", "EncoderClassifier", "EncoderMaskedLM"]
