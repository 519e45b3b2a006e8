"""What an ingestion into a Delta table must still write, from the offsets the table's own log holds.

Each partition's progress lives in the table's transaction log as a Delta
application transaction (the ``txn`` action): app id ``liftbridge:<stream>:<partition>``,
version = the next offset to write (the end of the last committed range).
The rows and the new versions are committed in one Delta transaction, so the
table holds an offset exactly when its version says so (as kafka-delta-ingest
keeps Kafka offsets). A Delta writer refuses a commit whose app ids another
writer moved since it read the table (a concurrent transaction), so two runs
at once cannot both add the same offsets; the loser plans again.

Pure logic: no Spark, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from liftbridge_provider.ranges import OffsetRange, RangesDocument

APP_ID_PREFIX = "liftbridge:"


def app_id(stream: str, partition: int) -> str:
    """The Delta application transaction id that holds ``partition``'s next offset to write."""
    return f"{APP_ID_PREFIX}{stream}:{partition}"


@dataclass(frozen=True)
class DeltaPlan:
    """The pieces to read and write now, the ranges the table holds already, and offsets it will miss."""

    write: tuple[OffsetRange, ...]
    held: tuple[OffsetRange, ...]
    gaps: tuple[OffsetRange, ...]

    @property
    def done(self) -> bool:
        """Nothing left to write: the table holds every range."""
        return not self.write

    def versions(self) -> dict[int, int]:
        """The version each written partition's app id gets on commit: its piece's end."""
        return {piece.partition: piece.end for piece in self.write}


def plan_delta(document: RangesDocument, committed: Mapping[int, int | None]) -> DeltaPlan:
    """Trim each non-empty range to the offsets after ``committed[partition]`` (next offset; None: none yet).

    A range wholly below the committed version is held already. A committed
    version before a range's start leaves ``[version, start)`` out of the table:
    reported as a gap (no run wrote them; the ranges skipped them).
    """
    write, held, gaps = [], [], []
    for wanted in document.ranges:
        if wanted.count == 0:
            continue
        version = committed.get(wanted.partition)
        if version is not None and version >= wanted.end:
            held.append(wanted)
            continue
        start = wanted.start if version is None else max(wanted.start, version)
        if version is not None and version < wanted.start:
            gaps.append(OffsetRange(wanted.partition, version, wanted.start))
        if start > wanted.start:
            held.append(OffsetRange(wanted.partition, wanted.start, start))
        write.append(OffsetRange(wanted.partition, start, wanted.end))
    return DeltaPlan(tuple(write), tuple(held), tuple(gaps))
