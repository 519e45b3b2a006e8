"""The machine a benchmark ran on: CPU model, CPU count and load average, for headers and chart titles."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo, or ``?``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def load_average() -> tuple[float, float, float]:
    """``os.getloadavg()``: runnable processes averaged over 1, 5 and 15 minutes."""
    return os.getloadavg()


def machine_line() -> str:
    """One header line: CPU count and model, and the load average right now."""
    one, five, fifteen = load_average()
    return (
        f"machine: {os.cpu_count()} CPUs ({cpu_model()}), load average {one:.2f} {five:.2f} {fifteen:.2f} "
        "(1/5/15 min) at start"
    )
