"""The table planner shared by the Delta and Iceberg ingest: what a run writes, given the offset intervals the
table holds, for ranges that come in any order, overlap, or repeat."""

from __future__ import annotations

from pathlib import Path

from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.table_plan import TablePlan, merge, plan_table
from liftbridge_provider.spark.table_ingest import Written, entries_of, footer_stats


def document(*ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument("orders", tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def test_a_new_table_writes_every_non_empty_range() -> None:
    plan = plan_table(document((0, 0, 10), (1, 5, 5), (2, 3, 9)), {})
    assert plan.write == (OffsetRange(0, 0, 10), OffsetRange(2, 3, 9))
    assert (plan.held, plan.gaps) == ((), ())
    assert plan.after == {0: ((0, 10),), 2: ((3, 9),)}


def test_a_rerun_after_its_commit_writes_nothing() -> None:
    plan = plan_table(document((0, 0, 10), (1, 0, 4)), {0: [(0, 10)], 1: [(0, 4)]})
    assert plan.done
    assert plan.held == (OffsetRange(0, 0, 10), OffsetRange(1, 0, 4))
    assert plan.after == {}, "nothing written, nothing recorded"


def test_an_overlapping_range_is_trimmed_to_what_the_table_lacks() -> None:
    plan = plan_table(document((0, 100, 300), (1, 0, 50)), {0: [(0, 150)]})
    assert plan.write == (OffsetRange(0, 150, 300), OffsetRange(1, 0, 50))
    assert plan.held == (OffsetRange(0, 100, 150),)
    assert plan.after == {0: ((0, 300),), 1: ((0, 50),)}


def test_an_earlier_range_after_a_later_one_is_written_and_joins_it() -> None:
    """The defect this layout fixes: a table that kept one next offset took [0, 100) for held after [100, 200)."""
    plan = plan_table(document((0, 0, 100)), {0: [(100, 200)]})
    assert plan.write == (OffsetRange(0, 0, 100),)
    assert plan.after == {0: ((0, 200),)}
    assert plan.gaps == ()


def test_a_range_around_a_held_middle_writes_both_sides() -> None:
    plan = plan_table(document((0, 0, 300)), {0: [(100, 200)]})
    assert plan.write == (OffsetRange(0, 0, 100), OffsetRange(0, 200, 300))
    assert plan.held == (OffsetRange(0, 100, 200),)
    assert plan.after == {0: ((0, 300),)}


def test_offsets_between_the_table_and_a_range_are_reported_as_gaps_on_either_side() -> None:
    plan = plan_table(document((0, 20, 30)), {0: [(0, 12)]})
    assert plan.write == (OffsetRange(0, 20, 30),)
    assert plan.gaps == (OffsetRange(0, 12, 20),)
    assert plan.after == {0: ((0, 12), (20, 30))}
    assert plan_table(document((0, 0, 5)), {0: [(10, 20)]}).gaps == (OffsetRange(0, 5, 10),)


def test_merge_joins_touching_and_overlapping_intervals_and_drops_empty_ones() -> None:
    assert merge([(5, 10), (0, 3), (3, 4), (9, 12), (20, 20)]) == [(0, 4), (5, 12)]


def test_piece_entries_come_from_the_files_footers_and_from_the_file_when_a_footer_has_no_stats(
    tmp_path: Path,
) -> None:
    """A table ingest counts each piece's rows and offset bounds from the files it wrote (no second Spark job);
    a file without statistics is read instead; two pieces of one partition are counted apart."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

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
    plan = TablePlan(write=write, held=(), gaps=(), after={})
    files = [
        footer_stats(str(f), str(f), partition=int(f.parent.name.split("=")[1]))  # the folder names it, as Delta's
        for f in sorted(folder.glob("partition=*/*.parquet"))
    ]
    entries = entries_of(Written(str(folder), files), plan, "r")
    assert [(e["partition"], e["start"], e["rows"], e["min_offset"], e["max_offset"]) for e in entries] == [
        (0, 10, 5, 10, 19),
        (0, 40, 2, 40, 41),
        (1, 0, 0, None, None),
        (2, 5, 1, 5, 5),
    ]
