"""The Delta ledger and planner: which offsets a table holds (kept as application transactions in its log) and
what a run writes, for ranges that come in any order, overlap, or repeat."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from liftbridge_provider.delta_plan import (
    DeltaPlan,
    LedgerError,
    interval_ids,
    ledger_versions,
    legacy_id,
    merge,
    pieces_id,
    plan_delta,
    read_holdings,
)
from liftbridge_provider.ranges import OffsetRange, RangesDocument


def document(*ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument("orders", tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def test_a_new_table_writes_every_non_empty_range() -> None:
    plan = plan_delta(document((0, 0, 10), (1, 5, 5), (2, 3, 9)), {})
    assert plan.write == (OffsetRange(0, 0, 10), OffsetRange(2, 3, 9))
    assert (plan.held, plan.gaps) == ((), ())
    assert plan.after == {0: ((0, 10),), 2: ((3, 9),)}


def test_a_rerun_after_its_commit_writes_nothing() -> None:
    plan = plan_delta(document((0, 0, 10), (1, 0, 4)), {0: [(0, 10)], 1: [(0, 4)]})
    assert plan.done
    assert plan.held == (OffsetRange(0, 0, 10), OffsetRange(1, 0, 4))
    assert plan.versions("orders") == {}, "nothing written, nothing recorded"


def test_an_overlapping_range_is_trimmed_to_what_the_table_lacks() -> None:
    plan = plan_delta(document((0, 100, 300), (1, 0, 50)), {0: [(0, 150)]})
    assert plan.write == (OffsetRange(0, 150, 300), OffsetRange(1, 0, 50))
    assert plan.held == (OffsetRange(0, 100, 150),)
    assert plan.after == {0: ((0, 300),), 1: ((0, 50),)}


def test_an_earlier_range_after_a_later_one_is_written_and_joins_it() -> None:
    """The defect this layout fixes: a table that kept one next offset took [0, 100) for held after [100, 200)."""
    plan = plan_delta(document((0, 0, 100)), {0: [(100, 200)]})
    assert plan.write == (OffsetRange(0, 0, 100),)
    assert plan.after == {0: ((0, 200),)}
    assert plan.gaps == ()


def test_a_range_around_a_held_middle_writes_both_sides() -> None:
    plan = plan_delta(document((0, 0, 300)), {0: [(100, 200)]})
    assert plan.write == (OffsetRange(0, 0, 100), OffsetRange(0, 200, 300))
    assert plan.held == (OffsetRange(0, 100, 200),)
    assert plan.after == {0: ((0, 300),)}


def test_offsets_between_the_table_and_a_range_are_reported_as_gaps_on_either_side() -> None:
    plan = plan_delta(document((0, 20, 30)), {0: [(0, 12)]})
    assert plan.write == (OffsetRange(0, 20, 30),)
    assert plan.gaps == (OffsetRange(0, 12, 20),)
    assert plan.after == {0: ((0, 12), (20, 30))}
    assert plan_delta(document((0, 0, 5)), {0: [(10, 20)]}).gaps == (OffsetRange(0, 5, 10),)


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
            plan = plan_delta(document((0, start, start + length)), held)
            written += [o for piece in plan.write for o in range(piece.start, piece.end)]
            ledger.update(plan.versions("orders"))
        union = {o for s, n in ranges for o in range(s, s + n)}
        assert sorted(written) == sorted(union)
        assert read_holdings("orders", 0, ledger.get, lambda: None) == merge((s, s + n) for s, n in ranges)


def test_piece_entries_come_from_the_files_footers_and_from_the_file_when_a_footer_has_no_stats(
    tmp_path: Path,
) -> None:
    """The Delta job counts each piece's rows and offset bounds from the files it wrote (no second Spark job);
    a file without statistics is read instead; two pieces of one partition are counted apart."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from liftbridge_provider.spark.delta_ingest import _entries, add_actions  # noqa: PLC0415

    folder = tmp_path / "liftbridge-r-0"
    for partition, name, offsets, stats in [
        (0, "a", [10, 11, 12], True),
        (0, "b", [13, 19], False),
        (0, "e", [40, 41], True),
        (2, "c", [5], True),
        (2, "d", [], True),
    ]:
        (folder / f"partition={partition}").mkdir(parents=True, exist_ok=True)
        table = pa.table({"offset": pa.array(offsets, pa.int64())})
        pq.write_table(table, folder / f"partition={partition}" / f"{name}.parquet", write_statistics=stats)
    write = (OffsetRange(0, 10, 20), OffsetRange(0, 40, 45), OffsetRange(1, 0, 4), OffsetRange(2, 5, 6))
    plan = DeltaPlan(write=write, held=(), gaps=(), after={})
    entries = _entries(add_actions(str(tmp_path), folder), folder, plan, "r")
    assert [(e["partition"], e["start"], e["rows"], e["min_offset"], e["max_offset"]) for e in entries] == [
        (0, 10, 5, 10, 19),
        (0, 40, 2, 40, 41),
        (1, 0, 0, None, None),
        (2, 5, 1, 5, 5),
    ]
