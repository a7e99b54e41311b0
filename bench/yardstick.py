"""The yardstick every speed figure is read against: a plain local fork+exec of /bin/true, calls 20 ms apart.

This VM's speed changes from day to day and with the other work on it (the same code's tool call measured 1.2 ms one
day and 2.0 ms another), so a benchmark prints this figure beside its own, and runs are compared by their ratio.
"""
from __future__ import annotations

import statistics
import subprocess
import time


def fork_exec_ms(n: int = 100, pause_s: float = 0.02) -> float:
    """Median wall time of `subprocess.run(["/bin/true"])`, in ms."""
    subprocess.run(["/bin/true"])
    samples = []
    for _ in range(n):
        time.sleep(pause_s)
        start = time.perf_counter()
        subprocess.run(["/bin/true"])
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)
