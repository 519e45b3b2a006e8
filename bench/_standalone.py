"""A Spark standalone cluster on loopback for ``bench_spark.py --standalone``: one master, N one-core workers.

pip's pyspark has no ``sbin/start-*.sh``; the master and the workers are started with ``spark-class``, as
docs/spark.md tells users to. Each runs in its own process group and is killed with it when the block ends.
The timeline helpers read Spark's event log (``spark.eventLog.enabled``): which executor ran each task, and
from when to when.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from liftbridge_provider.devserver.config import free_port


@dataclass(frozen=True)
class Standalone:
    master: str  # spark://127.0.0.1:<port>
    workers: int


@contextmanager
def standalone_cluster(workdir: Path, workers: int = 2, *, timeout: float = 120.0) -> Iterator[Standalone]:
    """Start a master and ``workers`` one-core workers (their Python: this interpreter); stop them after."""
    spark_class = str(Path(sys.executable).with_name("spark-class"))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *argv: str) -> None:
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process below
        processes.append(
            subprocess.Popen(
                [spark_class, *argv], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        log.close()

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))  # fmt: skip
        for number in range(workers):
            folder = workdir / f"worker-{number}"
            folder.mkdir()
            start(f"worker-{number}", "org.apache.spark.deploy.worker.Worker", master, "--cores", "1",
                  "--memory", "1g", "--work-dir", str(folder), "--webui-port", str(free_port()))  # fmt: skip
        _wait_for_workers(ui, workers, timeout)
        yield Standalone(master, workers)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _wait_for_workers(ui: int, workers: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as answer:
                seen = int(json.load(answer).get("aliveworkers", 0))
        except (OSError, ValueError):
            seen = -1
        if seen >= workers:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the standalone master saw {seen} of {workers} workers after {timeout:.0f} s")


@dataclass(frozen=True)
class TaskSpan:
    job: int
    executor: str
    start: float  # seconds, Spark's clock (milliseconds since the epoch / 1000)
    end: float


def task_spans(event_log_folder: Path) -> list[TaskSpan]:
    """Every finished task of the application whose event log is in the folder."""
    stage_jobs: dict[int, int] = {}
    spans = []
    for path in sorted(p for p in event_log_folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                for stage in event.get("Stage IDs", []):
                    stage_jobs[int(stage)] = int(event["Job ID"])
            elif kind == "SparkListenerTaskEnd":
                info = event["Task Info"]
                spans.append(
                    TaskSpan(
                        stage_jobs.get(int(event["Stage ID"]), -1),
                        str(info["Executor ID"]),
                        info["Launch Time"] / 1000,
                        info["Finish Time"] / 1000,
                    )
                )
    return spans


def overlap_seconds(spans: list[TaskSpan]) -> float:
    """Seconds during which tasks of two or more executors ran at the same time."""
    edges = sorted([(s.start, 1, s.executor) for s in spans] + [(s.end, -1, s.executor) for s in spans])
    running: dict[str, int] = {}
    together = 0.0
    last = None
    for moment, step, executor in edges:
        if last is not None and sum(1 for n in running.values() if n > 0) >= 2:
            together += moment - last
        running[executor] = running.get(executor, 0) + step
        last = moment
    return together


def timeline(spans: list[TaskSpan], width: int = 60) -> list[str]:
    """One text line per executor: when its tasks ran (``#``), on a common time axis."""
    if not spans:
        return []
    first, last = min(s.start for s in spans), max(s.end for s in spans)
    scale = max(last - first, 1e-6) / width
    lines = []
    for executor in sorted({s.executor for s in spans}):
        cells = [" "] * width
        for span in (s for s in spans if s.executor == executor):
            for cell in range(int((span.start - first) / scale), max(int((span.end - first) / scale), 1)):
                cells[min(cell, width - 1)] = "#"
        tasks = sum(1 for s in spans if s.executor == executor)
        lines.append(f"executor {executor:>3} |{''.join(cells)}| {tasks} tasks")
    lines.append(f"             0 s{' ' * (width - 8)}{last - first:6.1f} s")
    return lines
