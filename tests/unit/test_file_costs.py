"""The order make test hands files to its workers (tests/file_costs.py): costliest file first, a file's tests
together and in their own order, unknown files before the quick ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from tests.file_costs import UNKNOWN_COST, longest_first


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def order(nodeids: list[str], costs: dict[str, float]) -> list[str]:
    items = cast("list[pytest.Item]", [Item(n) for n in nodeids])
    return [cast("Any", item).nodeid for item in longest_first(items, costs, Path("."))]


def test_the_costliest_file_goes_first_and_each_files_tests_stay_together_in_order() -> None:
    collected = ["a.py::one", "b.py::one", "a.py::two", "c.py::one", "b.py::two"]
    costs = {"a.py": 5.0, "b.py": 300.0, "c.py": 40.0}
    assert order(collected, costs) == ["b.py::one", "b.py::two", "c.py::one", "a.py::one", "a.py::two"]


def test_an_unmeasured_file_goes_before_quick_ones_and_ties_keep_collection_order() -> None:
    collected = ["quick.py::t", "new.py::t", "slow.py::t", "same.py::t"]
    costs = {"quick.py": 1.0, "slow.py": UNKNOWN_COST + 1, "same.py": UNKNOWN_COST}
    assert order(collected, costs) == ["slow.py::t", "new.py::t", "same.py::t", "quick.py::t"]
