"""Peak memory as measured, on every CPU and in every import order.

TensorFlow's allocator keeps statistics (`get_memory_info`) only where it is a BFC allocator: always on a GPU, and
on the CPU when oneDNN is on (TensorFlow's default only on CPUs with AVX-512 VNNI / BF16 / AMX) or when
`TF_CPU_ALLOCATOR_USE_BFC=1`, which `import zoo` sets unless the user chose. TensorFlow reads both when it first
makes its devices, so a program that ran a TensorFlow op before importing zoo may have no statistics. There the
measure is the process's resident-memory high-water mark (VmHWM, reset through /proc/self/clear_refs where Linux
allows it): honest, coarser (it includes the Python heap and never goes down under a pooling allocator), and named
in every report, never a crash.

    with zoo.memory.PeakMemory() as peak:
        model.fit(...)
    print(f"{peak.used_bytes / 2**30:.2f} GiB ({peak.measure})")
"""

from __future__ import annotations

import resource

ALLOCATOR = "TensorFlow allocator peak"
RSS = "peak RSS (VmHWM; TensorFlow keeps no allocator statistics in this process)"
RSS_SINCE_START = "peak RSS since the process started (TensorFlow keeps no allocator statistics in this process)"


def default_device() -> str:
    """The device a step runs on: the first GPU, else the CPU."""
    import tensorflow as tf

    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def allocator_available(device: str = "CPU:0") -> bool:
    """Whether TensorFlow keeps allocator statistics for `device` in this process (resets its peak)."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(device)
        return True
    except ValueError:  # "Cannot reset memory stats for device 'CPU:0'": not a BFC allocator
        return False


def status_bytes(key: str, pid="self") -> int:
    """A memory line of /proc/PID/status in bytes ("VmRSS"; "VmHWM": the peak since start or since the last
    reset); 0 where there is no such file or line (another OS, a process that has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def max_rss_bytes() -> int:
    """The largest resident memory of this process since it started (Linux's ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_rss_peak() -> bool:
    """Set VmHWM back to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_bytes("VmHWM") > 0
    except OSError:
        return False


class PeakMemory:
    """The peak memory over a block, by the best measure this process has.

    Attributes (after the block):
        measure: which figure it is (`ALLOCATOR`, `RSS` or `RSS_SINCE_START`), for every report to name.
        start_bytes: the level when the block began (the allocator's `current`, or RSS).
        peak_bytes: the peak during the block (the allocator's `peak`, or VmHWM).
        used_bytes: `peak_bytes - start_bytes`, what the block itself added at its peak.
    """

    def __init__(self, device: str | None = None):
        self.device = device
        self.measure = None
        self.start_bytes = self.peak_bytes = self.used_bytes = None

    @property
    def is_allocator(self) -> bool:
        return self.measure == ALLOCATOR

    def reset(self) -> PeakMemory:
        """Start measuring from now (called by `__enter__`; call it again to measure a later part only)."""
        import tensorflow as tf

        self.device = self.device or default_device()
        if allocator_available(self.device):
            self.measure = ALLOCATOR
            self.start_bytes = tf.config.experimental.get_memory_info(self.device)["current"]
        else:
            self.measure = RSS if _reset_rss_peak() else RSS_SINCE_START
            self.start_bytes = status_bytes("VmRSS")
        return self

    def read(self) -> PeakMemory:
        """The peak so far (called by `__exit__`)."""
        import tensorflow as tf

        if self.is_allocator:
            self.peak_bytes = tf.config.experimental.get_memory_info(self.device)["peak"]
        else:
            self.peak_bytes = status_bytes("VmHWM") or max_rss_bytes()
        self.used_bytes = self.peak_bytes - self.start_bytes
        return self

    def __enter__(self) -> PeakMemory:
        return self.reset()

    def __exit__(self, *exc) -> bool:
        self.read()
        return False

    def describe(self, bytes_: int | None = None) -> str:
        """`1.23 GiB (TensorFlow allocator peak)`: a figure with its measure."""
        value = self.used_bytes if bytes_ is None else bytes_
        return f"{value / 2**30:.2f} GiB ({self.measure})"
