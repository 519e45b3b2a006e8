"""Find and run ``golbbench``, the go-liftbridge reference program (tools/golbbench, built by ``make golbbench``).

Each run is a subprocess against the benchmark's server; it prints one JSON line with at least
``messages``, ``bytes``, ``seconds``, ``client_cpu`` and ``server_cpu`` (CPU seconds of the Go
process and of the server pid it is given), plus ``p50_us``/``p99_us``/``max_us`` for
``publish-sync``, and exits 1 on a wrong result (a failed ack, a missing message).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liftbridge_provider.devserver.binaries import find_binary
from liftbridge_provider.devserver.errors import DevServerError

ENV_VAR = "GOLBBENCH_BIN"


def find_golbbench() -> Path | None:
    """The golbbench binary ($GOLBBENCH_BIN, .tools/bin, PATH); None after printing how to build it."""
    try:
        return find_binary("golbbench", ENV_VAR)
    except DevServerError:
        print(
            "golbbench (the go-liftbridge reference program) is not built: run `make golbbench` "
            f"(tools/install-golbbench.sh, needs Go) or set {ENV_VAR}. Skipping the go tests."
        )
        return None


@dataclass
class GoOutcome:
    """What one golbbench run printed: its JSON result (None if none), and why it failed (None if it did not)."""

    data: dict[str, Any] | None
    problem: str | None


def _argv(binary: Path, command: str, options: dict[str, object]) -> list[str]:
    argv = [str(binary), command]
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    return argv


def _outcome(command: str, returncode: int, stdout: str, stderr: str) -> GoOutcome:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    data: dict[str, Any] | None = json.loads(lines[-1]) if lines else None
    if returncode == 0 and data is not None:
        return GoOutcome(data, None)
    problem = f"golbbench {command} failed (exit {returncode}): {stderr.strip()[-2000:]}"
    if data is None:
        print(f"!! {problem}", file=sys.stderr)
    return GoOutcome(data, problem)


def run_golbbench(binary: Path, command: str, options: dict[str, object], timeout: float = 900) -> GoOutcome:
    try:
        argv = _argv(binary, command, options)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return GoOutcome(None, f"golbbench {command} timed out after {timeout:.0f} s")
    return _outcome(command, done.returncode, done.stdout, done.stderr)


def run_golbbench_together(
    binary: Path, command: str, runs: list[dict[str, object]], timeout: float = 900
) -> list[GoOutcome]:
    """One golbbench process per options dict, all started at once; each one's outcome, in order."""
    processes = [
        subprocess.Popen(_argv(binary, command, options), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for options in runs
    ]
    outcomes = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            outcomes.append(GoOutcome(None, f"golbbench {command} timed out after {timeout:.0f} s"))
            continue
        outcomes.append(_outcome(command, process.returncode, stdout, stderr))
    return outcomes


def go_liftbridge_version() -> str:
    """The go-liftbridge version tools/golbbench/go.mod pins."""
    gomod = Path(__file__).resolve().parent.parent / "tools" / "golbbench" / "go.mod"
    try:
        for line in gomod.read_text().splitlines():
            words = line.split()
            if "github.com/liftbridge-io/go-liftbridge/v2" in words:
                return words[-1]
    except OSError:
        pass
    return "?"
