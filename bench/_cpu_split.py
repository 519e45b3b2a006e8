"""Where a benchmark block's CPU went: the whole machine, the Liftbridge server, Spark's JVM and its Python workers.

A rate on a saturated machine only says how the CPUs were shared; CPU seconds
per row by process says what each part costs, so a ratio between two tests can
be read as "this part is the difference". Read from /proc (Linux): the
machine's busy time from /proc/stat, each process's own user + system time
from /proc/<pid>/stat; Spark's Python workers are the JVM's live descendants
(its Python daemon forks them and reuses them from job to job).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")  # /proc time units per second


def cpu_times() -> tuple[int, int]:
    """(busy, total) ticks of all CPUs since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def process_ticks(pid: int) -> tuple[int, int]:
    """(own, reaped children's) user + system ticks of ``pid``; (0, 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0, 0
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (from every thread's /proc children list)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return found


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    return [pid] + [p for child in children(pid) for p in tree_pids(child)]


def find_java(pid: int) -> int | None:
    """``pid`` itself if it runs java, else its first java descendant (pyspark's launcher execs into the JVM)."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
            return pid
    except OSError:
        return None
    for child in children(pid):
        found = find_java(child)
        if found is not None:
            return found
    return None


@dataclass
class Watched:
    """The processes whose CPU is split out: the Liftbridge server and Spark's JVM (None: not split out)."""

    server: int | None = None
    jvm: int | None = None

    def ticks(self) -> dict[str, dict[int, int]]:
        """Own user + system ticks of each watched process, by part and pid (Spark's Python workers: every
        live descendant of the JVM)."""
        parts: dict[str, dict[int, int]] = {}
        if self.server is not None:
            parts["server"] = {self.server: process_ticks(self.server)[0]}
        if self.jvm is not None:
            parts["jvm"] = {self.jvm: process_ticks(self.jvm)[0]}
            parts["python workers"] = {p: process_ticks(p)[0] for p in tree_pids(self.jvm)[1:]}
        return parts


def spent(before: dict[int, int], after: dict[int, int]) -> int:
    """Ticks the processes of ``after`` used since ``before`` (a new one: all of its own). A process that
    exited in between is left out, as its last ticks are not known (Spark's daemon does not collect its
    workers' times): its CPU shows in the machine's total and the rest, not in its part."""
    return sum(ticks - before.get(pid, 0) for pid, ticks in after.items())


WATCHED = Watched()
PARTS = ("server", "jvm", "python workers")


@dataclass
class Meter:
    """Wall-clock seconds of a ``with`` block, the machine's busy CPU share, and CPU seconds by part."""

    seconds: float = 0.0
    machine: float = 0.0
    busy_seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def measure(self) -> Iterator[None]:
        busy0, total0 = cpu_times()
        parts0 = WATCHED.ticks()
        wall0 = time.perf_counter()
        yield
        self.seconds = time.perf_counter() - wall0
        busy1, total1 = cpu_times()
        parts1 = WATCHED.ticks()
        self.machine = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
        self.busy_seconds = (busy1 - busy0) / TICKS
        self.cpu = {name: spent(parts0.get(name, {}), parts1[name]) / TICKS for name in parts1}


def cpu_row(meter: Meter, rows: int) -> list[str]:
    """CPU us per row of one run: the machine, each watched part, and the rest (this process, go readers)."""
    if rows <= 0:
        return ["", *("" for _ in PARTS), ""]
    per_row = 1e6 / rows
    known = sum(meter.cpu.get(name, 0.0) for name in PARTS)
    cells = [f"{meter.busy_seconds * per_row:.2f}"]
    cells += [f"{meter.cpu[name] * per_row:.2f}" if name in meter.cpu else "" for name in PARTS]
    cells.append(f"{max(meter.busy_seconds - known, 0.0) * per_row:.2f}")
    return cells
