"""The Liftbridge page's Runs view and lag chart, their pure parts: the ingest call, run rows, the history
ring, the chart's points; and the Runs service's bounds with stand-ins for Airflow and the lake."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.core.lake import Claim, Commit
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.ui import bounds, lake_records
from liftbridge_provider.ui.history import LagHistory, chart, polyline
from liftbridge_provider.ui.runs import (
    IngestCall,
    RunRecord,
    dag_run_link,
    held_range,
    ingest_call,
    lake_display,
    parquet_range,
    run_row,
)
from liftbridge_provider.ui.runs_service import RunsService

DOC = {"stream": "orders", "ranges": [{"partition": 0, "start": 0, "end": 10}, {"partition": 1, "start": 5, "end": 9}]}


def test_the_ingest_call_is_read_from_a_tasks_rendered_arguments() -> None:
    args = ["--brokers", "b:9292", "--ranges", json.dumps(DOC), "--output", "/lake", "--format", "delta"]
    call = ingest_call({"application": "ingest.py", "application_args": args, "conf": {"a": "b"}})
    assert call is not None
    assert (call.output, call.lake_format) == ("/lake", "delta")
    assert call.ranges == RangesDocument.parse(DOC)
    # the format defaults to Parquet; --flag=value works; @path ranges are left to the freeze's XCom
    call = ingest_call({"arguments": ["--ranges=@/tmp/r.json", "--output=s3a://b/lake"]})
    assert call == IngestCall("s3a://b/lake", "parquet", None)
    # not the ingest job: no --output, or no --ranges, or no list of texts (a truncated field is one text)
    assert ingest_call({"application_args": ["--output", "/x"]}) is None
    assert ingest_call({"application_args": ["--ranges", "{}"]}) is None
    assert ingest_call({"application_args": "Truncated. ['--ranges', '{...', '--output'"}) is None
    assert ingest_call({}) is None


def test_the_lake_and_the_link_are_shown_without_credentials() -> None:
    assert lake_display("s3a://KEY:SECRET@bucket/lake?x=1") == "s3a://bucket/lake"
    assert lake_display("/data/lake") == "/data/lake"
    assert dag_run_link("my dag", "manual__2025-01-01T00:00:00+00:00") == (
        "/dags/my%20dag/runs/manual__2025-01-01T00%3A00%3A00%2B00%3A00"
    )


def _claim(seq: int, start: int, end: int, rows: int | None) -> Claim:
    commit = None if rows is None else Commit(f"s/{seq}", rows, start, end - 1, "run", 10)
    return Claim(seq, 0, start, end, "run", commit)


def test_a_parquet_ranges_rows_are_its_committed_pieces() -> None:
    claims = [_claim(0, 0, 50, 50), _claim(1, 50, 100, 48), _claim(2, 100, 150, None), _claim(3, 150, 200, 50)]
    row = parquet_range(0, 50, 150, claims)
    assert (row["rows"], row["pieces"], row["whole"], row["beyond"], row["offsets_held"]) == (48, 1, False, False, 50)
    row = parquet_range(0, 0, 100, claims)
    assert (row["rows"], row["pieces"], row["whole"], row["beyond"]) == (98, 2, True, False)
    row = parquet_range(0, 25, 75, claims)  # pieces of an earlier, bigger range: counted whole
    assert (row["rows"], row["pieces"], row["whole"], row["beyond"]) == (98, 2, True, True)
    assert parquet_range(0, 300, 400, claims)["rows"] == 0


def test_a_tables_range_is_the_offsets_its_record_holds_and_the_rows_counted_from_its_files() -> None:
    assert held_range(0, 10, 20, [(0, 15), (18, 30)], rows=6, pieces=2) | {} == {
        "partition": 0,
        "start": 10,
        "end": 20,
        "rows": 6,
        "pieces": 2,
        "whole": False,
        "beyond": False,
        "offsets_held": 7,
        "rows_unknown": None,
    }
    assert held_range(0, 10, 20, [(0, 100)])["whole"] is True
    unknown = held_range(0, 10, 20, [(0, 100)], rows_unknown="no stats")
    assert (unknown["rows"], unknown["rows_unknown"]) == (None, "no stats")


def _record(**changes: Any) -> RunRecord:
    call = IngestCall("s3a://k:s@lake/x", "parquet", RangesDocument.parse(DOC))
    fields: dict[str, Any] = {
        "dag_id": "d",
        "run_id": "r1",
        "task_id": "ingest",
        "state": "success",
        "run_state": "success",
        "started": "2025-01-01T00:00:00+00:00",
        "ended": None,
        "call": call,
    }
    return RunRecord(**{**fields, **changes})


def test_a_run_row_sums_the_rows_and_links_the_dag_run() -> None:
    ranges = [parquet_range(0, 0, 10, [_claim(0, 0, 10, 10)]), parquet_range(1, 5, 9, [])]
    row = run_row(_record(), {"ranges": ranges})
    assert (row["link"], row["lake"], row["stream"], row["total_rows"], row["error"]) == (
        "/dags/d/runs/r1",
        "s3a://lake/x",
        "orders",
        10,
        None,
    )
    assert run_row(_record(), {"ranges": None, "error": "gone"})["total_rows"] is None
    # a range whose rows are unknown: no total (a sum of the others would pass for the run's rows)
    unknown = held_range(1, 5, 9, [(5, 9)], rows_unknown="a data file has no stats")
    assert run_row(_record(), {"ranges": [ranges[0], unknown]})["total_rows"] is None


def test_the_history_keeps_the_newest_samples_of_the_newest_series() -> None:
    history = LagHistory(samples=3, series=2)
    row = {"cursor_id": "c", "stream": "s", "partitions": [{"partition": 0, "lag": 5}, {"partition": 1, "lag": None}]}
    for i in range(5):
        history.record("conn", float(i), [row])
    assert history.of("conn", "c", "s") == {0: [(2.0, 5), (3.0, 5), (4.0, 5)]}  # no lag known: no sample
    history.record("other", 9.0, [row])
    history.record("third", 9.0, [row])  # a third series: the one sampled longest ago goes
    assert history.of("conn", "c", "s") == {}
    assert len(history) == 2


def test_the_charts_points_span_the_time_and_the_lag() -> None:
    assert polyline([(10.0, 0), (15.0, 2), (20.0, 4)], (10.0, 20.0), 4, width=100, height=40) == (
        "0.0,40.0 50.0,20.0 100.0,0.0"
    )
    assert polyline([(10.0, 3)], (10.0, 10.0), 3, width=100, height=40) == "100.0,0.0"
    drawn = chart({0: [(0.0, 4), (5.0, 2)], 1: [(0.0, 0), (5.0, 9)], 2: []}, lines=1)
    assert drawn is not None
    assert (drawn["top"], drawn["from"], drawn["to"], drawn["hidden"]) == (9, 0.0, 5.0, 1)
    assert [(line["partition"], line["lag"]) for line in drawn["lines"]] == [(1, 9)]
    assert chart({0: [(0.0, 4)]}) is None


def test_the_parquet_record_is_read_from_a_real_claim_ledger(tmp_path: Path) -> None:
    """A ledger written by the project's Ledger on a local folder, read back by the page's read-only store."""
    from liftbridge_provider.core.ranges import OffsetRange  # noqa: PLC0415

    store = _LocalStore()
    folder = f"{tmp_path}/stream=orders"
    ledger = Ledger(store, folder, 0, "run-a")
    plan, _ = ledger.claim(OffsetRange(0, 0, 10))
    (claim,) = plan.write
    ledger.commit(claim, Commit("", 7, 0, 9, "run-a", 0))
    call = IngestCall(
        str(tmp_path), "parquet", RangesDocument.parse({"stream": "orders", "ranges": [DOC["ranges"][0]]})
    )
    (row,) = lake_records.read_record(call, None)["ranges"]
    assert (row["rows"], row["pieces"], row["whole"]) == (7, 1, True)
    with pytest.raises(PermissionError):
        lake_records.parquet_store(str(tmp_path), None).create_exclusive(f"{tmp_path}/x", b"")


class _LocalStore:
    """The ledger's store on a local folder, for writing the test's ledger (create-if-absent with O_EXCL)."""

    def list_names(self, folder: str) -> list[str]:
        path = Path(folder)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def read(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def create_exclusive(self, path: str, data: bytes) -> bool:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "xb") as out:
                out.write(data)
        except FileExistsError:
            return False
        return True

    def delete_files(self, folder: str, names: Any) -> None:
        for name in names:
            Path(folder, name).unlink(missing_ok=True)

    def object_size(self, path: str) -> int | None:
        found = Path(path)
        return None if not found.exists() else -1 if found.is_dir() else found.stat().st_size

    def rename(self, source: str, target: str) -> bool:
        Path(source).rename(target)
        return True


def test_the_runs_answer_is_bounded_and_shows_each_lakes_error_in_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "READ_TIMEOUT", 0.5)
    release = threading.Event()
    slow_call = IngestCall("/slow", "parquet", RangesDocument.parse(DOC))
    records: list[tuple[RunRecord, str | None]] = [(_record(run_id="fast"), None)]
    records.append((_record(run_id="slow", call=slow_call), None))
    records.append((_record(run_id="s3", call=IngestCall("s3a://b/l", "delta", None)), "aws_x"))

    def read(call: IngestCall, settings: Any) -> dict[str, Any]:
        if call.output == "/slow":
            release.wait(5)
        if settings is not None:
            raise OSError(f"denied for {settings.access_key} ({settings.secret_key}, {settings.session_token})")
        return {"ranges": []}

    settings = S3Settings(None, "AKIAEXAMPLE", "s3cr3t-key", session_token="FwoGZXIvYXdzE-token")
    service = RunsService(runs=lambda limit: records[:limit], read=read, settings=lambda _: settings)
    began = time.monotonic()
    body, error, _ = service.answer()
    release.set()
    assert error is None
    assert body is not None
    assert time.monotonic() - began < 3
    by_run = {r["run_id"]: r for r in body["runs"]}
    assert by_run["fast"]["error"] is None
    assert "not read within" in by_run["slow"]["error"]
    for secret in ("AKIAEXAMPLE", "s3cr3t-key", "FwoGZXIvYXdzE-token"):  # the keys and the session token
        assert secret not in by_run["s3"]["error"]
    assert "***" in by_run["s3"]["error"]
