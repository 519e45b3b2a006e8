"""Longest test files first, so that parallel workers finish together (a pytest plugin of tests/conftest.py).

``make test`` hands whole test files to its pytest-xdist workers (``--dist
loadfile``), in collection order (``--no-loadscope-reorder``: xdist would
otherwise put the files with the most tests first, and a file of a few
multi-minute tests would start last and run alone at the end). This plugin
orders the collection by each file's cost, the seconds its tests took in a
measured run, kept in ``tests/file_costs.json``; the longest goes first, the
short ones fill the gaps at the end (the greedy longest-first schedule). A
file not in the record counts as :data:`UNKNOWN_COST` seconds. Tests keep
their order within a file, so module fixtures are set up once.

``pytest --record-file-costs PATH`` writes the costs this run measured (setup,
call and teardown of every test, by file) to PATH; copy it over
``tests/file_costs.json`` after a change that moves the costs a lot. Order
only: no test depends on another file's running first.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parent / "file_costs.json"
UNKNOWN_COST = 20.0  # seconds: a new file goes before the quick ones until it is measured
_measured: dict[str, float] = defaultdict(float)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-costs",
        metavar="PATH",
        default=None,
        help="write the seconds each test file took in this run (JSON, by file path) to PATH",
    )


def file_costs() -> dict[str, float]:
    """The recorded seconds per test file (path relative to the project), empty without a record."""
    if not RECORD.is_file():
        return {}
    recorded = json.loads(RECORD.read_text())
    return {str(path): float(seconds) for path, seconds in recorded.items()}


def longest_first(items: list[pytest.Item], costs: dict[str, float], root: Path) -> list[pytest.Item]:
    """``items`` grouped by file, the costliest file first; ties and a file's own tests keep collection order."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_file(item, root), index)

    def key(numbered: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        index, item = numbered
        name = _file(item, root)
        return (-costs.get(name, UNKNOWN_COST), first_seen[name], index)

    return [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = longest_first(items, file_costs(), config.rootpath)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each file's seconds (on the xdist controller too: workers' reports come through here)."""
    _measured[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--record-file-costs")
    if path and not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist) writes
        ordered = dict(sorted(((name, round(s, 1)) for name, s in _measured.items()), key=lambda kv: -kv[1]))
        Path(path).write_text(json.dumps(ordered, indent=1) + "\n")


def _file(item: pytest.Item, root: Path) -> str:
    return item.nodeid.split("::", 1)[0] if item.nodeid else str(item.path.relative_to(root))
