"""What an ingestion into a table must still write, from the offset intervals the table holds (pure).

Shared by the table formats whose own metadata records which offsets they
hold (Delta: application transactions, ``delta_plan.py``; Iceberg: table
properties, ``iceberg_plan.py``). Each partition's holdings are disjoint,
merged ``[start, end)`` intervals; a run splits each of its ranges into what
the table holds and what it lacks, writes the missing pieces and commits them
together with the partition's new intervals, so any order, overlap and retry
lands each offset once. No Spark, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from liftbridge_provider.core.lake import uncovered
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Disjoint, sorted intervals covering exactly the offsets of ``intervals`` (touching ones joined)."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class LedgerError(ValueError):
    """A table's record of the offsets it holds is not valid (edited by hand, or an unknown writer)."""


@dataclass(frozen=True)
class TablePlan:
    """What one run does: the pieces to read and write, what the table holds already, offsets it misses.

    ``write``: the parts of the ranges the table lacks (several per partition
    when the table holds a middle part). ``held``: the parts it holds.
    ``gaps``: offsets between the table's lowest held offset and the highest
    one a range reaches that neither the table nor the ranges cover (no run
    landed them). ``after``: each written partition's intervals once the
    pieces are committed.
    """

    write: tuple[OffsetRange, ...]
    held: tuple[OffsetRange, ...]
    gaps: tuple[OffsetRange, ...]
    after: Mapping[int, tuple[Interval, ...]]

    @property
    def done(self) -> bool:
        """Nothing left to write: the table holds every range."""
        return not self.write


def plan_table(document: RangesDocument, holdings: Mapping[int, Sequence[Interval]]) -> TablePlan:
    """Split each non-empty range of ``document`` into what the table holds (``holdings[partition]``) and lacks."""
    write, held, gaps = [], [], []
    after: dict[int, tuple[Interval, ...]] = {}
    for wanted in document.ranges:
        if wanted.count == 0:
            continue
        table = merge(holdings.get(wanted.partition, ()))
        missing = uncovered(table, wanted.start, wanted.end)
        write += [OffsetRange(wanted.partition, start, end) for start, end in missing]
        held += [OffsetRange(wanted.partition, s, e) for s, e in uncovered(missing, wanted.start, wanted.end)]
        covered = merge([*table, (wanted.start, wanted.end)])
        gaps += [OffsetRange(wanted.partition, s, e) for s, e in uncovered(covered, covered[0][0], covered[-1][1])]
        if missing:
            after[wanted.partition] = tuple(covered)
    return TablePlan(tuple(write), tuple(held), tuple(gaps), after)
