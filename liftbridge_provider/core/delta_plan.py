"""How a Delta table records the offsets it holds, in its own transaction log (pure: no Spark, no I/O).

The table's own transaction log is the ledger. Per stream and partition it
keeps the set of offset intervals the table holds, as Delta application
transactions (``txn`` actions, whose newest version per app id wins)::

    liftbridge:<stream>:<partition>:pieces       n, how many intervals follow
    liftbridge:<stream>:<partition>:<i>:start    interval i's first offset   (0 <= i < n)
    liftbridge:<stream>:<partition>:<i>:end      interval i's end, exclusive

(``<stream>`` percent-encoded, so no stream name can collide with another's
ids.) The intervals are disjoint and merged, so ``n`` stays small: one for a
partition ingested without holes, whatever the order its ranges came in.

A run commits its files together with the partition's new intervals in one
Delta transaction. Every such commit writes the partition's ``pieces`` id,
and Delta refuses a commit when a concurrent one wrote an app id it writes
too: two runs adding to the same partition at once cannot both commit, and
the loser plans again from the table. So the table holds an offset exactly
when its intervals say so: any order, any overlap and any retry land each
offset once. Application transactions survive checkpoints, log cleanup,
``VACUUM`` and ``OPTIMIZE``; only ``delta.setTransactionRetentionDuration``
expires them, and the job refuses a table that sets it.

Tables written before this layout kept one id per partition,
``liftbridge:<stream>:<partition>`` = the next offset to write, counted from
the table's first offset of that partition: read as that one interval.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import quote

from liftbridge_provider.core.table_plan import Interval, LedgerError, TablePlan, merge

APP_ID_PREFIX = "liftbridge:"
# The table property that makes Delta drop application transactions older than it at checkpoints.
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"


def _base(stream: str, partition: int) -> str:
    return f"{APP_ID_PREFIX}{quote(stream, safe='')}:{partition}"


def pieces_id(stream: str, partition: int) -> str:
    """The app id holding how many intervals of ``partition`` the table holds (every commit to it writes it)."""
    return f"{_base(stream, partition)}:pieces"


def interval_ids(stream: str, partition: int, index: int) -> tuple[str, str]:
    """The app ids of interval ``index``'s start and end."""
    base = _base(stream, partition)
    return f"{base}:{index}:start", f"{base}:{index}:end"


def legacy_id(stream: str, partition: int) -> str:
    """The one app id of the earlier layout: the partition's next offset to write."""
    return f"{APP_ID_PREFIX}{stream}:{partition}"


def read_holdings(
    stream: str,
    partition: int,
    version_of: Callable[[str], int | None],
    lowest_offset: Callable[[], int | None],
) -> list[Interval]:
    """The intervals the table holds of ``partition``, from its app transaction versions (``version_of``).

    ``lowest_offset`` gives the smallest offset in the partition's files; it is
    asked only for a table of the earlier layout. Raises LedgerError when the
    ids do not form intervals.
    """
    count = version_of(pieces_id(stream, partition))
    if count is None:
        legacy = version_of(legacy_id(stream, partition))
        if legacy is None:
            return []
        lowest = lowest_offset()
        return merge([(legacy if lowest is None else min(lowest, legacy), legacy)])
    if count < 0:
        raise LedgerError(f"{pieces_id(stream, partition)} is {count}, not a number of intervals")
    held = []
    for index in range(count):
        start_id, end_id = interval_ids(stream, partition, index)
        start, end = version_of(start_id), version_of(end_id)
        if start is None or end is None or not 0 <= start < end:
            raise LedgerError(f"interval {index} of {pieces_id(stream, partition)}: [{start}, {end}) is not valid")
        held.append((start, end))
    if merge(held) != sorted(held):
        raise LedgerError(f"the intervals of {pieces_id(stream, partition)} overlap or touch: {sorted(held)}")
    return sorted(held)


def ledger_versions(stream: str, partition: int, held: Sequence[Interval]) -> dict[str, int]:
    """The app id versions that record ``held`` (merged first) as the partition's intervals."""
    intervals = merge(held)
    versions = {pieces_id(stream, partition): len(intervals)}
    for index, (start, end) in enumerate(intervals):
        start_id, end_id = interval_ids(stream, partition, index)
        versions[start_id], versions[end_id] = start, end
    return versions


def plan_versions(stream: str, plan: TablePlan) -> dict[str, int]:
    """The app id versions to commit with ``plan``'s pieces (every written partition's intervals)."""
    versions: dict[str, int] = {}
    for partition, intervals in sorted(plan.after.items()):
        versions.update(ledger_versions(stream, partition, intervals))
    return versions
