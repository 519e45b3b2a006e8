"""The Delta ledger: which offsets a Delta table holds, kept as application transactions in its log; with the
shared planner, any order, overlap or repeat of ranges lands each offset once."""

from __future__ import annotations

import itertools
import random

import pytest

from liftbridge_provider.core.delta_plan import (
    interval_ids,
    ledger_versions,
    legacy_id,
    pieces_id,
    plan_versions,
    read_holdings,
)
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.table_plan import LedgerError, merge, plan_table


def document(*ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument("orders", tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def test_the_ledger_round_trips_through_app_transaction_versions() -> None:
    held = [(0, 10), (20, 30), (30, 35)]
    versions = ledger_versions("orders", 4, held)
    assert versions[pieces_id("orders", 4)] == 2, "touching intervals are joined"
    assert read_holdings("orders", 4, versions.get, lambda: None) == [(0, 10), (20, 35)]
    assert read_holdings("orders", 5, versions.get, lambda: None) == [], "another partition holds nothing"


def test_stale_interval_ids_beyond_the_count_are_ignored() -> None:
    """Delta keeps the newest version of each app id; a commit that joins intervals leaves older ids behind."""
    versions = ledger_versions("orders", 0, [(0, 10), (20, 30)])
    versions.update(ledger_versions("orders", 0, [(0, 30)]))
    assert read_holdings("orders", 0, versions.get, lambda: None) == [(0, 30)]


@pytest.mark.parametrize(
    ("app_id", "version"),
    [
        (pieces_id("orders", 0), 3),  # an interval missing
        (pieces_id("orders", 0), -1),
        (interval_ids("orders", 0, 0)[1], 0),  # an empty interval
        (interval_ids("orders", 0, 1)[0], 5),  # overlapping intervals
    ],
)
def test_ids_that_are_not_a_ledger_are_refused(app_id: str, version: int) -> None:
    versions = ledger_versions("orders", 0, [(0, 10), (20, 30)])
    versions[app_id] = version
    with pytest.raises(LedgerError):
        read_holdings("orders", 0, versions.get, lambda: None)


def test_app_ids_of_different_streams_and_partitions_never_collide() -> None:
    """Stream names may hold the separator; they are encoded, so "a:1" partition 0 is not "a" partition 1."""
    keys = list(itertools.product(["orders", "orders:1", "orders:1:0", "a:b", "a", "b:0", "a%3A1"], range(3)))
    ids = [pieces_id(s, p) for s, p in keys]
    ids += [i for s, p in keys for slot in range(3) for i in interval_ids(s, p, slot)]
    assert len(ids) == len(set(ids))


def test_a_table_of_the_earlier_layout_holds_from_its_first_offset_to_its_next_offset() -> None:
    versions = {legacy_id("orders", 0): 200}
    assert read_holdings("orders", 0, versions.get, lambda: 100) == [(100, 200)]
    assert read_holdings("orders", 0, versions.get, lambda: None) == [], "no files: nothing to write twice"


def test_any_order_of_ranges_leaves_the_ledger_holding_each_offset_once() -> None:
    """Commits simulated by the planner alone, in random orders, overlaps and repeats: every range's offsets
    are written exactly once over all runs, and the ledger ends as their union."""
    rng = random.Random(7)
    for _ in range(300):
        ranges = [(rng.randrange(0, 100), rng.randrange(0, 40)) for _ in range(rng.randrange(1, 8))]
        ledger: dict[str, int] = {}
        written: list[int] = []
        for start, length in ranges + ranges[: rng.randrange(0, len(ranges) + 1)]:
            held = {0: read_holdings("orders", 0, ledger.get, lambda: None)}
            plan = plan_table(document((0, start, start + length)), held)
            written += [o for piece in plan.write for o in range(piece.start, piece.end)]
            ledger.update(plan_versions("orders", plan))
        union = {o for s, n in ranges for o in range(s, s + n)}
        assert sorted(written) == sorted(union)
        assert read_holdings("orders", 0, ledger.get, lambda: None) == merge((s, s + n) for s, n in ranges)
