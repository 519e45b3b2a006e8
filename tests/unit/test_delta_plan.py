"""The Delta ingestion planner (issue 15): what a run writes given the offsets the table's log holds."""

from __future__ import annotations

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
