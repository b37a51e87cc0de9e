"""A peer that hangs without dying, caught within a bound.

A multi-worker step waits in the strategy's collectives for every peer. A peer that died is
noticed within seconds (its connection resets), and so is one stopped as a whole (SIGSTOP:
its coordination-service heartbeats stop, ~10 s). One whose main thread hangs while its other
threads run (a driver call, a storage read) fails nothing, and TensorFlow gives up only at the
collective's own timeout (recipes.distribute.COLLECTIVE_TIMEOUT_S, 10 minutes), which also has
to cover the first step's tracing. `StepWatchdog` bounds every later step instead: a training
or validation step that runs longer than `timeout` seconds ends the process with the exit
code and message of a lost worker. Time between steps (a checkpoint being written) is not
counted. Measurements: docs/design-notes.md (Distribution).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import keras

DEFAULT_TIMEOUT_S = 120.0  # `zoo train --collective-timeout`; a training step of dec-1b on a GPU takes seconds


def check_timeout(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"collective_timeout must be a positive number of seconds, got {seconds!r}: the longest "
                         f"a training step after the first may wait for the other workers (e.g. --collective-timeout "
                         f"{DEFAULT_TIMEOUT_S:g}).")
    return float(seconds)


class StepWatchdog(keras.callbacks.Callback):
    """Exits with `exit_code` after printing `message()` when a step after the first (of its
    kind: training, validation) runs past `timeout` seconds."""

    def __init__(self, timeout, message, exit_code):
        super().__init__()
        self.timeout, self.message, self.exit_code = check_timeout(timeout), message, exit_code
        self.deadline, self.traced, self.stop = None, set(), threading.Event()

    def on_train_begin(self, logs=None):
        self.stop.clear()
        threading.Thread(target=self._watch, name="zoo-step-watchdog", daemon=True).start()

    def on_train_end(self, logs=None):
        self.deadline = None
        self.stop.set()

    def on_train_batch_begin(self, batch, logs=None):
        self._arm("train")

    def on_test_batch_begin(self, batch, logs=None):
        self._arm("test")

    def on_train_batch_end(self, batch, logs=None):
        self.deadline = None

    def on_test_batch_end(self, batch, logs=None):
        self.deadline = None

    def _arm(self, kind):
        if kind in self.traced:  # the first step of each kind traces its function: not bounded here
            self.deadline = time.monotonic() + self.timeout
        self.traced.add(kind)

    def _watch(self):
        while not self.stop.wait(min(1.0, self.timeout / 4)):
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline:
                sys.stdout.flush()
                sys.stderr.write(f"zoo train: error: {self.message()}\n")
                sys.stderr.flush()
                os._exit(self.exit_code)  # the main thread is blocked inside a collective: nothing else ends it
