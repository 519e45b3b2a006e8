"""How an Iceberg table records the offsets it holds: table properties updated in the same commit (pure).

Per stream and partition, one property holds the partition's merged offset
intervals::

    liftbridge.held.<stream>.<partition> = "0-100,250-300"      [start, end) pairs, ascending

(``<stream>`` percent-encoded; the partition is the part after the last dot.)
Table properties live in the table's metadata, not in a snapshot: expiring
snapshots, compacting or rewriting data files keep them, unlike a marker in
a snapshot summary (what Iceberg's Flink and Kafka Connect sinks lose to
snapshot expiry). A run commits its data files and the new property values
in one Iceberg commit whose base is the snapshot it planned from, so two
runs that planned from the same table cannot both commit.

Iceberg writers retry a commit that lost a race by re-applying it to the
new table, which would re-apply property values computed from the old one:
the table must keep ``commit.retry.num-retries`` at 0 (the ingest job
creates its tables so and refuses a table that retries), and the job plans
again itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.table_plan import Interval, LedgerError, TablePlan, merge

DEFAULT_NAMESPACE = "liftbridge"  # the namespace of the job's default table

PROPERTY_PREFIX = "liftbridge.held."
RETRY_PROPERTY = "commit.retry.num-retries"  # Iceberg's: how often a writer re-applies a commit that lost a race
REQUIRED_RETRIES = "0"


def held_property(stream: str, partition: int) -> str:
    """The table property that holds ``partition``'s intervals."""
    return f"{PROPERTY_PREFIX}{quote(stream, safe='')}.{partition}"


def encode(intervals: list[Interval]) -> str:
    """``"start-end,start-end"`` of the merged intervals."""
    return ",".join(f"{start}-{end}" for start, end in merge(intervals))


def decode(value: str, key: str) -> list[Interval]:
    """The intervals a property value holds; LedgerError naming the property when it is not such a list."""
    intervals = []
    for item in filter(None, value.split(",")):
        start, sep, end = item.partition("-")
        if not sep or not start.isdigit() or not end.isdigit() or int(start) >= int(end):
            raise LedgerError(f"table property {key}={value!r}: {item!r} is not a start-end offset interval")
        intervals.append((int(start), int(end)))
    if merge(intervals) != intervals:
        raise LedgerError(f"table property {key}={value!r}: the intervals are not ascending and apart")
    return intervals


def read_holdings(stream: str, partition: int, properties: Mapping[str, str]) -> list[Interval]:
    """The intervals the table holds of ``partition`` (none when the property is missing)."""
    key = held_property(stream, partition)
    return decode(properties.get(key, ""), key)


def plan_properties(stream: str, plan: TablePlan) -> dict[str, str]:
    """The property values to commit with ``plan``'s pieces (every written partition's intervals)."""
    return {held_property(stream, p): encode(list(intervals)) for p, intervals in sorted(plan.after.items())}


def retry_problem(properties: Mapping[str, str], table: str) -> str | None:
    """Why a table's commit settings break the job's guarantee (it re-applies a lost commit), or None."""
    value = properties.get(RETRY_PROPERTY)
    if value == REQUIRED_RETRIES:
        return None
    return (
        f"the Iceberg table {table} has {RETRY_PROPERTY}={value!r} (Iceberg's default is 4): a writer that loses "
        "a commit race re-applies its commit to the new table, with held offsets planned from the old one, which "
        f"could write offsets twice; set it to {REQUIRED_RETRIES} (ALTER TABLE ... SET TBLPROPERTIES "
        f"('{RETRY_PROPERTY}'='{REQUIRED_RETRIES}')) or use a table this job created"
    )


def table_identifier(stream: str, given: str | None) -> str:
    """``namespace.table``: ``given``, else ``liftbridge.<stream>`` (dots and dashes of the name as ``_``): the
    ingest job's table, and the one the Liftbridge page opens for its runs."""
    if given:
        if "." not in given.strip("."):
            raise InvalidArgumentError(f"--iceberg-table must be namespace.table, got {given!r}")
        return given
    return f"{DEFAULT_NAMESPACE}.{stream.replace('.', '_').replace('-', '_')}"
