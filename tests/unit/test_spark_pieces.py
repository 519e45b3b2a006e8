"""How a run's pieces are grouped for one Spark read: a ranges document holds one range per partition, so
pieces of the same partition go to different rounds, and every piece is read exactly once."""

from __future__ import annotations

import random

from liftbridge_provider.core.ranges import OffsetRange
from liftbridge_provider.spark.pieces import rounds


def test_pieces_of_one_partition_go_to_different_rounds_and_each_piece_once() -> None:
    pieces = [OffsetRange(0, 0, 10), OffsetRange(1, 0, 5), OffsetRange(0, 20, 30), OffsetRange(0, 40, 45)]
    grouped = rounds(pieces)
    assert grouped == [
        [OffsetRange(0, 0, 10), OffsetRange(1, 0, 5)],
        [OffsetRange(0, 20, 30)],
        [OffsetRange(0, 40, 45)],
    ]


def test_any_pieces_make_rounds_without_a_repeated_partition_and_as_few_as_the_busiest_partition_needs() -> None:
    rng = random.Random(5)
    for _ in range(200):
        pieces = [OffsetRange(rng.randrange(4), start, start + 1) for start in range(rng.randrange(1, 20))]
        grouped = rounds(pieces)
        assert sorted(p for group in grouped for p in group) == sorted(pieces)
        for group in grouped:
            assert len({p.partition for p in group}) == len(group)
        busiest = max(sum(1 for p in pieces if p.partition == q) for q in range(4))
        assert len(grouped) == busiest


def _first_fit(pieces: list[OffsetRange]) -> list[list[OffsetRange]]:
    """The grouping spelled out: each piece in the first group that has no piece of its partition yet."""
    grouped: list[list[OffsetRange]] = []
    for piece in pieces:
        slot = next((g for g in grouped if all(p.partition != piece.partition for p in g)), None)
        if slot is None:
            slot = []
            grouped.append(slot)
        slot.append(piece)
    return grouped


def test_rounds_are_the_first_fit_grouping_in_order_for_any_pieces() -> None:
    """rounds() counts each partition's pieces instead of scanning every group: the groups, and the order of
    the pieces in each, are still exactly those of a first fit."""
    rng = random.Random(11)
    for _ in range(300):
        pieces = [OffsetRange(rng.randrange(rng.randrange(1, 40)), s, s + 1) for s in range(rng.randrange(0, 300))]
        assert rounds(pieces) == _first_fit(pieces)
