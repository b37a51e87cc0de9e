"""Training recipes for the zoo: one recipe per registered model, tf.data
pipelines and a resumable runner.

    import recipes
    recipes.run("enc-base", "corpus.txt", "runs/enc-base", steps=1000)

`zoo` never imports this package; this package builds its models through `zoo.get`.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import zoo  # noqa: F401  (before anything imports TensorFlow: its loading lines silenced, zoo.verbosity)
from recipes.evaluate import Evaluation, evaluate
from recipes.optim import WarmupDecay, optimizer, schedule
from recipes.recipe import Recipe, get, names, register
from recipes.runner import Result, build
from recipes.train import run

__all__ = [
    "Evaluation", "Recipe", "Result", "WarmupDecay", "build", "evaluate", "get", "names", "optimizer", "register",
    "run", "schedule",
]
