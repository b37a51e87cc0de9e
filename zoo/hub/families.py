"""The family modules zoo.hub reads and writes, by zoo family name: the one list of them, which
zoo.hub and zoo.lora (Hugging Face module names for LoRA targets) share without importing
zoo.hub's package (which imports the models)."""

from zoo.hub import bert, gemma3, llama, modernbert, qwen

FAMILIES = {module.FAMILY: module for module in (bert, llama, qwen.QWEN2, qwen.QWEN3, gemma3, modernbert)}


def family_of(model):
    """The family module of a zoo backbone or task model."""
    return FAMILIES[getattr(model, "backbone", model).spec.family]
