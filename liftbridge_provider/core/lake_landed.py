"""Whether a range is in the Parquet lake already, whole and published: decided before Spark starts (pure).

A rerun whose every range the lake holds has nothing to read, and the ingest job then ends before it creates a
SparkSession (``spark/landed.py``; docs/spark.md, "A rerun with nothing to do"). Skipping a range that is not
whole would lose offsets, so a range counts as landed only when:

- the ledger's plan for it is settled: no part of it unclaimed, no claim over it uncommitted (a run holding
  one, running or crashed, is left to the usual run: it writes or waits as it always did);
- every committed piece over it is published: its object is at its final key with the commit's size. A piece
  folded into a checkpoint was published before it was folded (rule 2 of ``lake_ledger.py``); a committed piece
  above the checkpoint may not be yet (a run that crashed between its commit and its publish), so its object
  is looked at, and only its size decides.

The Delta and Iceberg tables need no rule of their own here: they record the offsets they hold in the same
commit as the files (``table_plan.plan_table(...).done``).
"""

from __future__ import annotations

from collections.abc import Mapping

from liftbridge_provider.core.lake import Claim, WritePlan


def pieces_to_look_at(plan: WritePlan, upto: int) -> tuple[Claim, ...]:
    """The committed pieces over the range whose object may not be published yet: those above the checkpoint
    (``upto``: the first claim number it does not fold) that have an object (an empty piece has none)."""
    return tuple(c for c in plan.held if c.seq >= upto and c.published_path is not None)


def is_published(claim: Claim, size: int | None) -> bool:
    """Whether an object of ``size`` bytes at the claim's final key (None: nothing there; -1: a folder) is the
    committed piece (a legacy commit, a renamed folder, names no size)."""
    assert claim.commit is not None, "only committed pieces are published"
    if size is None:
        return False
    return size == -1 if claim.commit.legacy else size == claim.commit.size


def range_landed(plan: WritePlan, upto: int, sizes: Mapping[int, int | None]) -> bool:
    """Whether the lake holds the plan's range whole: the plan settled, and each piece of
    :func:`pieces_to_look_at` published (``sizes``: its object's size by claim number; a missing number
    counts as not looked at, so not published)."""
    if not plan.settled:
        return False
    return all(is_published(c, sizes.get(c.seq)) for c in pieces_to_look_at(plan, upto))
