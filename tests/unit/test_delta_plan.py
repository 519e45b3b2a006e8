"""The Delta ingestion planner (issue 15): what a run writes given the offsets the table's log holds."""

from __future__ import annotations

from pathlib import Path

from liftbridge_provider.delta_plan import app_id, plan_delta
from liftbridge_provider.ranges import OffsetRange, RangesDocument


def document(*ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument("orders", tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def test_a_new_table_writes_every_non_empty_range() -> None:
    plan = plan_delta(document((0, 0, 10), (1, 5, 5), (2, 3, 9)), {})
    assert plan.write == (OffsetRange(0, 0, 10), OffsetRange(2, 3, 9))
    assert (plan.held, plan.gaps) == ((), ())
    assert plan.versions() == {0: 10, 2: 9}


def test_a_rerun_after_its_commit_writes_nothing() -> None:
    plan = plan_delta(document((0, 0, 10), (1, 0, 4)), {0: 10, 1: 4})
    assert plan.done
    assert plan.held == (OffsetRange(0, 0, 10), OffsetRange(1, 0, 4))


def test_an_overlapping_range_is_trimmed_to_what_the_table_lacks() -> None:
    plan = plan_delta(document((0, 100, 300), (1, 0, 50)), {0: 150, 1: None})
    assert plan.write == (OffsetRange(0, 150, 300), OffsetRange(1, 0, 50))
    assert plan.held == (OffsetRange(0, 100, 150),)
    assert plan.versions() == {0: 300, 1: 50}


def test_offsets_between_the_table_and_a_later_range_are_reported_as_a_gap() -> None:
    plan = plan_delta(document((0, 20, 30)), {0: 12})
    assert plan.write == (OffsetRange(0, 20, 30),)
    assert plan.gaps == (OffsetRange(0, 12, 20),)


def test_app_ids_name_the_stream_and_partition() -> None:
    assert app_id("orders", 3) == "liftbridge:orders:3"
    assert app_id("orders", 3) != app_id("orders-3", 0)


def test_piece_entries_come_from_the_files_footers_and_from_the_file_when_a_footer_has_no_stats(
    tmp_path: Path,
) -> None:
    """The Delta job counts each piece's rows and offset bounds from the files it wrote (review of issue 15:
    it ran a second Spark job for this); a file without statistics is read instead."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from liftbridge_provider.delta_plan import DeltaPlan  # noqa: PLC0415
    from liftbridge_provider.spark.delta_ingest import _entries, add_actions  # noqa: PLC0415

    folder = tmp_path / "liftbridge-r-0"
    for partition, name, offsets, stats in [
        (0, "a", [10, 11, 12], True),
        (0, "b", [13, 19], False),
        (2, "c", [5], True),
        (2, "d", [], True),
    ]:
        (folder / f"partition={partition}").mkdir(parents=True, exist_ok=True)
        table = pa.table({"offset": pa.array(offsets, pa.int64())})
        pq.write_table(table, folder / f"partition={partition}" / f"{name}.parquet", write_statistics=stats)
    plan = DeltaPlan(write=(OffsetRange(0, 10, 20), OffsetRange(1, 0, 4), OffsetRange(2, 5, 6)), held=(), gaps=())
    entries = _entries(add_actions(str(tmp_path), folder), folder, plan, "r")
    assert [(e["partition"], e["rows"], e["min_offset"], e["max_offset"]) for e in entries] == [
        (0, 5, 10, 19),
        (1, 0, None, None),
        (2, 1, 5, 5),
    ]
