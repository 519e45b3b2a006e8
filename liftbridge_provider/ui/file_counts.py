"""The rows a table holds of an offset range, from its data files' statistics (pure: no I/O, no table library).

Delta's application transactions and Iceberg's table properties record which offsets a table holds, not how
many rows (a compacted stream has fewer rows than offsets). The rows are in the table's own metadata: each
live data file's row count and the smallest and largest ``offset`` in it (Delta's add actions with their
stats, Iceberg's manifests), and its partition. So for a range ``[start, end)`` of a partition:

* a file of another partition, or whose offsets all lie outside the range, counts nothing;
* a file whose offsets all lie inside counts its row count, read from the metadata alone;
* a file that holds offsets on both sides of a boundary (the job writes one file per piece, so only after an
  OPTIMIZE or a compaction that merged pieces of several ranges) *straddles*: its rows in the range are
  counted exactly by reading its ``offset`` column (``table_files.rows_in_file``), never estimated;
* a file without the statistics that decide this (no row count, no offset bounds), or whose row count is not
  what a reader sees (row-level deletes: Iceberg delete files, Delta deletion vectors), makes the range's
  rows unknown, with the reason: the page never guesses.

Only live files are given (a removed or compacted-away file is not in the table's current state), and each
file is looked at once per range, so no row is counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DataFile:
    """One live data file of a table, as the table's metadata describes it.

    :param path: the file, as the table names it (shown in reasons, used to read a straddling file).
    :param partition: the Liftbridge partition of its rows; None when the metadata does not say (the file may
        then hold rows of several partitions, and is read when its offsets overlap a range).
    :param rows: its row count (Delta's ``numRecords``, Iceberg's ``record_count``); None: not recorded.
    :param low: the smallest ``offset`` in it; None: not recorded.
    :param high: the largest ``offset`` in it (inclusive); None: not recorded.
    :param problem: why its row count is not the rows a reader sees (row-level deletes), or None.
    """

    path: str
    partition: int | None
    rows: int | None
    low: int | None
    high: int | None
    problem: str | None = None


@dataclass(frozen=True)
class RangeFiles:
    """What the metadata alone says of one range: the rows and number of the files wholly inside it, the
    files to count exactly (straddling a boundary, or of an unrecorded partition), and why the rows cannot
    be known (None: they can)."""

    rows: int
    pieces: int
    straddling: tuple[DataFile, ...]
    unknown: str | None


def files_over(files: Iterable[DataFile], partition: int, start: int, end: int) -> RangeFiles:
    """Sort the live ``files`` for the range ``[start, end)`` of ``partition`` (see the module docstring)."""
    rows = pieces = 0
    straddling: list[DataFile] = []
    for file in files:
        if file.partition is not None and file.partition != partition:
            continue
        if file.rows == 0:
            continue  # an empty file holds no offsets, whatever its bounds say
        if file.rows is None or file.low is None or file.high is None:
            return RangeFiles(0, 0, (), f"data file {file.path} has no row count or offset bounds in the metadata")
        if file.high < start or file.low >= end:
            continue
        if file.problem is not None:
            return RangeFiles(0, 0, (), f"data file {file.path}: {file.problem}")
        if file.partition is not None and start <= file.low and file.high < end:
            rows += file.rows
            pieces += 1
        else:
            straddling.append(file)
    return RangeFiles(rows, pieces, tuple(straddling), None)


def settle(counted: RangeFiles, exact: Mapping[str, int]) -> tuple[int, int]:
    """``(rows, pieces)`` of a range: the files wholly inside plus each straddling file's ``exact`` rows in it
    (by path; a straddling file with none there is not a piece of it). KeyError when one was not counted."""
    inside = [exact[file.path] for file in counted.straddling]
    return counted.rows + sum(inside), counted.pieces + sum(1 for n in inside if n)
