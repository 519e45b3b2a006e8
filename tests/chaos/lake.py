"""The Parquet lake of a seed: written by the functions of ``spark_jobs/ingest.py``, read back with pyarrow.

``Lake.ingest`` does what ``ingest.main`` does, on the harness's one shared
SparkSession instead of a new one: each non-empty range into its own folder
(``ingest_range``), the manifest, then the job's own checks (``problems``);
a problem fails the ingest, as the job's exit status would.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from liftbridge_provider.ranges import RangesDocument
from tests.chaos.oracle import LakeRow

JOBS = Path(__file__).resolve().parents[2] / "spark_jobs"
if str(JOBS) not in sys.path:
    sys.path.insert(0, str(JOBS))  # spark_jobs is a folder of scripts, not a package
import ingest  # noqa: E402

FOLDER = re.compile(r"stream=(?P<stream>[^/]+)/partition=(?P<partition>\d+)/range=(?P<start>\d+)-(?P<end>\d+)$")


class IngestFailed(Exception):
    """The ingest job would have exited non-zero: its own checks found problems."""


def _known_flags() -> set[str]:
    """The command-line flags this version of ingest.py accepts (read from its --help)."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        ingest.parse_args(["--help"])
    return set(re.findall(r"--[a-z][a-z-]+", text.getvalue()))


class Lake:
    """One lake folder per seed; ``spark`` is shared by every seed of the session."""

    def __init__(self, root: Path, spark: SparkSession) -> None:
        self.root = root
        self.spark = spark
        self.flags = _known_flags()

    def ingest(
        self, brokers: list[str], document: RangesDocument, *, allow_gaps: bool, request_timeout: float
    ) -> list[dict[str, Any]]:
        """Ingest every non-empty range of ``document``; returns the manifest entries or raises IngestFailed."""
        args = ingest.parse_args(self._argv(brokers, document, allow_gaps=allow_gaps, timeout=request_timeout))
        entries = [ingest.ingest_range(self.spark, args, document, r) for r in document.ranges if r.count > 0]
        ingest.write_manifest(str(self.root), document, entries)
        found = ingest.problems(entries, args.allow_gaps)
        if found:
            raise IngestFailed("; ".join(found))
        return entries

    def _argv(self, brokers: list[str], document: RangesDocument, *, allow_gaps: bool, timeout: float) -> list[str]:
        argv = ["--brokers", ",".join(brokers), "--ranges", document.dumps(), "--output", str(self.root)]
        argv += ["--request-timeout", str(timeout)]
        if allow_gaps:
            argv.append("--allow-gaps")
        if "--read-timeout" in self.flags:  # bounds a read that makes no progress (issue 11, defect 11)
            argv += ["--read-timeout", str(4 * timeout)]
        return argv

    def cancel(self) -> None:
        """Cancel every Spark job still running (after an ingest outlived its deadline)."""
        self.spark.sparkContext.cancelAllJobs()

    def rows(self) -> list[LakeRow]:
        """Every row of every Parquet file in the lake, with the range folder it lies in."""
        found = []
        for path in sorted(self.root.rglob("*.parquet")):
            match = FOLDER.search(str(path.parent))
            if match is None:  # the layout changed: the oracle must learn it rather than see an empty lake
                raise ValueError(f"lake file {path} is not under stream=/partition=/range=<start>-<end>/")
            folder = f"partition={match['partition']}/range={match['start']}-{match['end']}"
            table = pq.read_table(path, columns=["key", "value", "stream", "partition", "offset"])
            for record in table.to_pylist():
                found.append(
                    LakeRow(
                        stream=record["stream"],
                        partition=record["partition"],
                        offset=record["offset"],
                        key=record["key"] or None,
                        value=record["value"],
                        folder=folder,
                        start=int(match["start"]),
                        end=int(match["end"]),
                    )
                )
        return found
