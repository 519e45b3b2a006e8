"""The lake's claim ledger (liftbridge_provider/core/lake.py): decisions, parsing, and the claim protocol under races.

An overlapping range must not add rows the lake already
holds. The store here is an in-memory fake with an atomic create-if-absent;
the real filesystem and Spark are in tests/spark/test_lake_fencing.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from liftbridge_provider.core.lake import (
    Claim,
    Commit,
    LakeError,
    check_ledger,
    encode,
    holdings,
    parse_claims,
    plan_write,
    uncovered,
)
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange
from tests.unit.core.memory_store import MemoryStore

DONE = Commit("_staging/x", 1, 0, 0, "r")


def claim(seq: int, start: int, end: int, *, done: bool = False, run: str = "r") -> Claim:
    return Claim(seq, 0, start, end, run, DONE if done else None)


def r(start: int, end: int) -> OffsetRange:
    return OffsetRange(0, start, end)


@pytest.mark.parametrize(
    ("pieces", "start", "end", "expected"),
    [
        ([], 0, 10, [(0, 10)]),
        ([(0, 10)], 0, 10, []),
        ([(0, 10)], 0, 15, [(10, 15)]),
        ([(5, 8)], 0, 10, [(0, 5), (8, 10)]),
        ([(8, 20), (0, 3)], 0, 10, [(3, 8)]),
        ([(20, 30)], 0, 10, [(0, 10)]),
        ([(0, 4), (4, 9)], 2, 12, [(9, 12)]),
    ],
)
def test_uncovered(pieces: list[tuple[int, int]], start: int, end: int, expected: list[tuple[int, int]]) -> None:
    assert uncovered(pieces, start, end) == expected


def test_a_fresh_partition_claims_the_whole_range() -> None:
    plan = plan_write([], r(0, 100))
    assert (plan.claim, plan.write, plan.held, plan.gaps, plan.next_seq) == ((r(0, 100),), (), (), (), 0)


def test_an_overlapping_range_is_trimmed_to_what_no_claim_covers() -> None:
    """range=0-150 after range=0-100 adds only 100-149."""
    plan = plan_write([claim(0, 0, 100, done=True)], r(0, 150))
    assert plan.claim == (r(100, 150),)
    assert plan.held == (claim(0, 0, 100, done=True),)
    assert plan.write == ()
    assert plan.next_seq == 1


def test_a_smaller_or_equal_range_adds_nothing() -> None:
    claims = [claim(0, 0, 150, done=True)]
    for offsets in (r(0, 100), r(0, 150), r(40, 60)):
        plan = plan_write(claims, offsets)
        assert plan.claim == ()
        assert plan.settled
        assert plan.held == (claims[0],)


def test_open_claims_that_overlap_are_written_whoever_made_them() -> None:
    """A crash between claim and commit is repaired by any run whose range overlaps the open claim."""
    claims = [claim(0, 0, 100, run="crashed"), claim(1, 100, 150, done=True), claim(2, 300, 400, run="other")]
    plan = plan_write(claims, r(50, 200))
    assert plan.write == (claims[0],), "the whole open piece, also the part before the range"
    assert plan.held == (claims[1],)
    assert plan.claim == (r(150, 200),)
    assert plan.gaps == ((200, 300),)
    assert not plan.settled


def test_gaps_are_offsets_no_claim_and_not_the_range_cover() -> None:
    plan = plan_write([claim(0, 0, 100, done=True)], r(150, 200))
    assert plan.claim == (r(150, 200),)
    assert plan.gaps == ((100, 150),)
    assert plan_write([claim(0, 0, 100, done=True)], r(100, 100)).gaps == ()
    assert plan_write([], r(5, 5)) == plan_write([], r(7, 7))


def test_a_range_between_claims_fills_only_the_hole() -> None:
    plan = plan_write([claim(0, 0, 100, done=True), claim(1, 200, 300, done=True)], r(0, 300))
    assert plan.claim == (r(100, 200),)
    assert plan.gaps == ()
    assert [c.seq for c in plan.held] == [0, 1]


def test_a_broken_ledger_is_refused() -> None:
    with pytest.raises(LakeError, match=r"claims 0 \[0, 100\) and 1 \[50, 150\) overlap"):
        check_ledger([claim(0, 0, 100), claim(1, 50, 150)])
    with pytest.raises(LakeError, match=r"numbered 0..1 without holes, found \[0, 2\]"):
        plan_write([claim(0, 0, 10), claim(2, 10, 20)], r(0, 5))
    with pytest.raises(LakeError, match="partition 3 in the ledger of another one"):
        plan_write([Claim(0, 3, 0, 10, "r")], r(0, 5))


def test_holdings_list_committed_pieces_in_offset_order() -> None:
    claims = [claim(0, 100, 150, done=True), claim(1, 0, 100, done=True), claim(2, 150, 160)]
    assert [(c.start, c.end) for c in holdings(claims)] == [(0, 100), (100, 150)]
    assert claims[0].folder == "partition=0/range=100-150"
    assert claims[0].object == "partition=0/range=100-150/part-0000000000.parquet"


def test_ledger_files_round_trip() -> None:
    first = claim(0, 0, 100)
    commit = Commit("_staging/partition=0/claim-0000000000-r", 100, 0, 99, "r")
    files = {
        first.file: encode(first.to_json() | {"created": "ignored"}),
        first.commit_file: encode(commit.to_json()),
        claim(1, 100, 120).file: encode(claim(1, 100, 120).to_json()),
        ".claim-0000000002.json.abc.tmp": b"",
        "notes.txt": b"ignored",
    }
    assert parse_claims(0, files) == [Claim(0, 0, 0, 100, "r", commit), claim(1, 100, 120)]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"claim-0000000000.json": b'{"partition": 1, "start": 0, "end": 5, "run": "r"}'}, "for partition 1, not 0"),
        ({"claim-0000000000.json": b'{"partition": 0, "start": 0, "run": "r"}'}, "lacks start/end/run"),
        ({"claim-0000000000.json": b'{"partition": 0, "start": 9, "end": 5, "run": "r"}'}, "end 5 is before start 9"),
        ({"claim-0000000000.commit.json": encode(DONE.to_json())}, r"commits \[0\] have no claim file"),
        ({"claim-0000000000.json": b"[1]"}, "must hold a JSON object"),
    ],
)
def test_bad_ledger_files_are_named(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(LakeError, match=message):
        parse_claims(0, files)


def test_a_writer_that_loses_the_race_for_a_claim_number_decides_again() -> None:
    """Two writers of 0-100 and 0-150 read the empty ledger at once; 0-100 creates claim 0
    first. The 0-150 writer then writes the open claim 0 too and claims only 100-149."""
    store = MemoryStore()
    small = Ledger(store, "lake/stream=s", 0, "small")
    big = Ledger(store, "lake/stream=s", 0, "big")

    def other_writer_first(path: str) -> None:
        small.claim(r(0, 100))  # the other writer wins claim 0

    store.before_create = other_writer_first
    plan, _ = big.claim(r(0, 150))
    claims = big.claims()
    assert [(c.seq, c.start, c.end, c.run) for c in claims] == [(0, 0, 100, "small"), (1, 100, 150, "big")]
    assert [c.seq for c in plan.write] == [0, 1], "the big writer writes both open pieces"
    check_ledger(claims)


def test_many_interleaved_writers_never_claim_an_offset_twice() -> None:
    store = MemoryStore()
    writers = [(Ledger(store, "s", 0, f"w{i}"), r(i * 7 % 40, i * 7 % 40 + 25)) for i in range(12)]

    def race(index: int) -> Callable[[str], None]:
        def hook(path: str) -> None:
            ledger, offsets = writers[(index + 1) % len(writers)]
            ledger.claim(offsets)

        return hook

    for index, (ledger, offsets) in enumerate(writers):
        store.before_create = race(index)
        ledger.claim(offsets)
    claims = writers[0][0].claims()
    check_ledger(claims)
    covered = sorted(o for c in claims for o in range(c.start, c.end))
    assert covered == sorted(set(covered)), "no offset claimed twice"
    assert set(covered) == set().union(*(range(o.start, o.end) for _, o in writers))


def test_only_one_commit_wins_and_both_writers_learn_it() -> None:
    store = MemoryStore()
    ledger_a, ledger_b = Ledger(store, "s", 0, "a"), Ledger(store, "s", 0, "b")
    ledger_a.claim(r(0, 10))
    (piece,) = ledger_b.claims()
    mine_a = Commit("_staging/partition=0/claim-0000000000-a", 10, 0, 9, "a")
    mine_b = Commit("_staging/partition=0/claim-0000000000-b", 10, 0, 9, "b")
    assert ledger_b.commit(piece, mine_b) == mine_b
    assert ledger_a.commit(piece, mine_a) == mine_b, "the second committer gets the first one's commit"
    assert holdings(ledger_a.claims())[0].commit == mine_b


def test_an_unreadable_claim_is_waited_for_then_named() -> None:
    store = MemoryStore()
    store.files["s/_ledger/partition=0/claim-0000000000.json"] = b'{"partition": 0, "st'
    naps: list[float] = []
    ledger = Ledger(store, "s", 0, "a", settle_timeout=1.0, sleep=naps.append)
    with pytest.raises(LakeError, match=r"claim-0000000000.json is not complete JSON yet after 1s"):
        ledger.claims()
    assert len(naps) == 5
    completed = Ledger(store, "s", 0, "a", sleep=lambda _: store.files.update({
        "s/_ledger/partition=0/claim-0000000000.json": encode(claim(0, 0, 5).to_json())
    }))  # fmt: skip
    assert completed.claims() == [claim(0, 0, 5)]
