"""The Liftbridge page's Runs view, shaped from what Airflow and the lake recorded (pure: no I/O, no Airflow).

A run of the ingest job (``spark_jobs/ingest.py``) is recognised by its command line, as Airflow keeps it
among a task's rendered template fields (``application_args`` of a ``SparkSubmitOperator``, or any list field
holding ``--ranges`` and ``--output``): :func:`ingest_call` reads the lake (``--output``), its format
(``--format``, Parquet when absent) and the ranges (``--ranges``, when given as JSON text). The rows each range
landed come from the lake's own record (``lake_records.py``): the claim ledger's committed pieces (Parquet);
for Delta and Iceberg the table's held offsets (its application transactions, its table properties) and the
rows of its live data files over each range (their statistics, ``file_counts.py``). :func:`run_row` makes the
row the page shows, with the DAG run's page in Airflow's UI.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from liftbridge_provider.core.lake import Claim
from liftbridge_provider.core.ranges import RangesDocument

FORMATS = ("parquet", "delta", "iceberg")


@dataclass(frozen=True)
class IngestCall:
    """What an ingest task's command line says: the lake, its format, and the ranges (None: not given as JSON
    text, e.g. ``@path``, or cut short by Airflow's ``max_templated_field_length``)."""

    output: str
    lake_format: str
    ranges: RangesDocument | None
    iceberg_catalog: str = "liftbridge"  # --iceberg-catalog: the name an embedded SQL catalog keys its tables by
    iceberg_table: str | None = None  # --iceberg-table; None: liftbridge.<stream>
    iceberg_catalog_given: bool = False  # --iceberg-catalog-property given: the catalog is not the embedded one


def _flag(args: Sequence[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None


def parse_ranges(text: str | None) -> RangesDocument | None:
    """The ranges document of ``--ranges`` JSON text, or None (``@path``, missing, not a ranges document)."""
    if not text or text.startswith("@"):
        return None
    try:
        return RangesDocument.parse(json.loads(text))
    except Exception:  # any text that is not a whole ranges document: the XCom of the freeze may still say
        return None


def ingest_call(rendered: Mapping[str, Any]) -> IngestCall | None:
    """The ingest job's call among a task's rendered fields, or None when no list field holds ``--output``
    and ``--ranges`` (another task, or arguments Airflow cut short)."""
    for value in rendered.values():
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            continue
        output = _flag(value, "--output")
        if output is None or ("--ranges" not in value and not any(a.startswith("--ranges=") for a in value)):
            continue
        lake_format = (_flag(value, "--format") or "parquet").lower()
        return IngestCall(
            output,
            lake_format,
            parse_ranges(_flag(value, "--ranges")),
            _flag(value, "--iceberg-catalog") or "liftbridge",
            _flag(value, "--iceberg-table"),
            _flag(value, "--iceberg-catalog-property") is not None,
        )
    return None


def lake_display(output: str) -> str:
    """The lake's URI as the page may show it: any user and password in it (``s3a://key:secret@bucket``) and
    its query are left out."""
    parts = urlsplit(output)
    if parts.netloc and "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    return urlunsplit(parts._replace(query="", fragment=""))


def dag_run_link(dag_id: str, run_id: str) -> str:
    """The DAG run's page in Airflow's UI, relative to the UI's root."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def parquet_range(partition: int, start: int, end: int, claims: Iterable[Claim]) -> dict[str, Any]:
    """One range as the claim ledger records it: the rows of the committed pieces over it, how many pieces,
    whether every offset of it is committed (``whole``), and whether a piece reaches outside it (its rows are
    then counted whole: a piece is the ledger's unit)."""
    over = [c for c in claims if c.overlaps(start, end)]
    held = [c for c in over if c.commit is not None]
    covered = sum(min(end, c.end) - max(start, c.start) for c in held)
    return {
        "partition": partition,
        "start": start,
        "end": end,
        "rows": sum(c.commit.rows for c in held if c.commit is not None),
        "pieces": len(held),
        "whole": covered == end - start,
        "beyond": any(c.start < start or c.end > end for c in held),
        "offsets_held": covered,
        "rows_unknown": None,
    }


def held_range(
    partition: int,
    start: int,
    end: int,
    held: Iterable[tuple[int, int]],
    *,
    rows: int | None = None,
    pieces: int | None = None,
    rows_unknown: str | None = None,
) -> dict[str, Any]:
    """One range as a table holds it (Delta, Iceberg): the offsets of it its record holds (``held``: the
    transactions' or properties' offset intervals) and whether that is all of them, and the rows of it in
    ``pieces`` data files, counted from the table's metadata (``file_counts.py``); ``rows`` None with
    ``rows_unknown`` saying why when they could not be counted."""
    covered = sum(max(0, min(end, e) - max(start, s)) for s, e in held)
    return {
        "partition": partition,
        "start": start,
        "end": end,
        "rows": rows,
        "pieces": pieces,
        "whole": covered == end - start,
        "beyond": False,
        "offsets_held": covered,
        "rows_unknown": rows_unknown,
    }


@dataclass(frozen=True)
class RunRecord:
    """An ingest task of a DAG run, as Airflow's metadata DB records it."""

    dag_id: str
    run_id: str
    task_id: str
    state: str | None
    run_state: str | None
    started: str | None  # ISO 8601
    ended: str | None
    call: IngestCall


def run_row(record: RunRecord, lake: Mapping[str, Any]) -> dict[str, Any]:
    """The row of the Runs view: the DAG run (and its link), the task's state, the lake and each range's rows.

    ``lake``: what ``lake_records.read_record`` found, ``{"ranges": [...]}`` or ``{"error": "..."}``.
    """
    call = record.call
    ranges = lake.get("ranges")
    rows = [r.get("rows") for r in ranges or ()]  # a total only when every range's rows are known
    return {
        "dag_id": record.dag_id,
        "run_id": record.run_id,
        "task_id": record.task_id,
        "link": dag_run_link(record.dag_id, record.run_id),
        "state": record.state,
        "run_state": record.run_state,
        "started": record.started,
        "ended": record.ended,
        "format": call.lake_format,
        "lake": lake_display(call.output),
        "stream": call.ranges.stream if call.ranges else None,
        "ranges": ranges,
        "total_rows": sum(n for n in rows if n is not None) if rows and None not in rows else None,
        "error": lake.get("error"),
    }
