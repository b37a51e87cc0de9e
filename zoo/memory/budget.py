"""How much memory there is: the device's, or a size the user writes."""

import os
import subprocess

from zoo import checks

MiB = 1024**2


def default_budget() -> int:
    """The device's memory: the first GPU's total memory if TensorFlow sees one, else physical RAM."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:  # the memory TF's allocator may use on the GPU (its BFC pool limit)
            return int(tf.config.experimental.get_memory_info("GPU:0").get("limit") or 0) or _gpu_total()
        except (ValueError, RuntimeError):
            return _gpu_total()
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_bytes() -> int:
    """The memory the kernel says is available now (MemAvailable), else the machine's total."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"]
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gpu_total() -> int:
    """The first GPU's total memory as the driver reports it (nvidia-smi), 0 if unknown."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return int(out[0]) * MiB
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return 0


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_bytes(text) -> int:
    """Bytes from "24GiB", "24G", "16000MiB", "1.5 GiB" or a plain number of bytes; a bare
    "G"/"M"/"K" is the binary unit ("24G" = 24 GiB), "GB"/"MB"/"KB" the decimal one.

    Example:
    >>> parse_bytes("24GiB") == parse_bytes("24G") == 24 * 2**30
    True
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return checks.positive("A memory budget", text)
    raw = str(text).strip()
    number = raw.rstrip("aAbBgGiIkKmMtT ")
    unit = raw[len(number):].strip().lower()
    unit = {"g": "gib", "m": "mib", "k": "kib", "t": "tib"}.get(unit, unit)
    try:
        value = float(number)
    except ValueError:
        value = -1
    if unit not in _UNITS or value < 0:
        raise ValueError(f"Cannot read {text!r} as a size: use e.g. 24GiB, 24G, 16000MiB, 512MB or bytes.")
    return checks.positive("A memory budget", int(value * _UNITS[unit]))
