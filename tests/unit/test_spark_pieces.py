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
