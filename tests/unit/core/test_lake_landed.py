"""When a range counts as in the Parquet lake already (liftbridge_provider/core/lake_landed.py): only whole and
published; a claim not committed, or a committed piece whose object is missing or of another size, is not."""

from __future__ import annotations

from liftbridge_provider.core.lake import Claim, Commit, plan_write
from liftbridge_provider.core.lake_landed import is_published, pieces_to_look_at, range_landed
from liftbridge_provider.core.ranges import OffsetRange

WANTED = OffsetRange(0, 0, 100)


def committed(seq: int, start: int, end: int, *, rows: int | None = None, size: int | None = 40) -> Claim:
    rows = end - start if rows is None else rows
    return Claim(seq, 0, start, end, "r", Commit(f"_staging/r/{seq}.parquet", rows, start, end - 1, "r", size))


def test_a_range_whose_pieces_are_committed_and_published_is_landed() -> None:
    claims = [committed(0, 0, 50), committed(1, 50, 100)]
    plan = plan_write(claims, WANTED)
    assert [c.seq for c in pieces_to_look_at(plan, 0)] == [0, 1]
    assert range_landed(plan, 0, {0: 40, 1: 40})


def test_a_committed_piece_not_published_or_of_another_size_is_not_landed() -> None:
    plan = plan_write([committed(0, 0, 50), committed(1, 50, 100)], WANTED)
    assert not range_landed(plan, 0, {0: 40, 1: None})  # a run crashed between its commit and its publish
    assert not range_landed(plan, 0, {0: 40, 1: 39})
    assert not range_landed(plan, 0, {0: 40})  # not looked at


def test_an_open_claim_or_an_unclaimed_part_is_not_landed() -> None:
    assert not range_landed(plan_write([committed(0, 0, 50), Claim(1, 0, 50, 100, "other")], WANTED), 0, {0: 40})
    assert not range_landed(plan_write([committed(0, 0, 50)], WANTED), 0, {0: 40})


def test_folded_pieces_and_empty_pieces_need_no_look() -> None:
    folded = [committed(0, 0, 50)]
    plan = plan_write([committed(1, 50, 80, rows=0, size=0), committed(2, 80, 100)], WANTED, first=1,
                      covered=[(0, 50)], folded=folded)  # fmt: skip
    assert [c.seq for c in pieces_to_look_at(plan, 1)] == [2]  # 0 was published before its fold; 1 has no object
    assert range_landed(plan, 1, {2: 40})


def test_a_legacy_piece_is_published_as_a_folder() -> None:
    legacy = committed(0, 0, 100, size=None)
    assert is_published(legacy, -1)
    assert not is_published(legacy, None)
