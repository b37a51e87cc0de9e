"""The family modules zoo.hub reads and writes, by zoo family name: the one list of them, which
zoo.hub and zoo.lora (Hugging Face module names for LoRA targets) share without importing
zoo.hub's package (which imports the models)."""

from zoo.hub import bert, llama

FAMILIES = {module.FAMILY: module for module in (bert, llama)}


def family_of(model):
    """The family module of a zoo backbone or task model."""
    return FAMILIES[getattr(model, "backbone", model).spec.family]
