"""The Liftbridge page's Runs view: the last ingest runs from Airflow's records, each with its lake's record.

:class:`RunsService` answers ``GET /api/runs``: the newest ``bounds.RUNS_LIMIT`` ingest task instances
(``run_sources.ingest_runs``), then, concurrently on the page's thread pool, each one's lake record
(``lake_records.read_record``), all of them within ``bounds.READ_TIMEOUT``: a lake not read by then, or whose
read failed, shows its error in its row and the others are shown. The answer is cached ``bounds.CACHE_TTL``
seconds. The S3 keys of an ``aws`` connection never leave the server: they are removed from every error text.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.s3_sources import s3_location
from liftbridge_provider.ui import bounds, cluster, lake_records, run_sources
from liftbridge_provider.ui.runs import RunRecord, run_row
from liftbridge_provider.ui.views import redact


def _aws_settings(conn_id: str) -> S3Settings:
    from liftbridge_provider.hooks.object_store import aws_s3_settings  # noqa: PLC0415 - Airflow's connections

    return aws_s3_settings(conn_id)


class RunsService:
    """The Runs view's answer, cached.

    :param runs: the newest ingest runs and the ``aws`` connection of each (``run_sources.ingest_runs``).
    :param read: a run's lake record (``lake_records.read_record``).
    :param settings: the S3 settings of an ``aws`` connection id.
    """

    def __init__(
        self,
        *,
        runs: Callable[[int], list[tuple[RunRecord, str | None]]] = run_sources.ingest_runs,
        read: Callable[[Any, S3Settings | None], dict[str, Any]] = lake_records.read_record,
        settings: Callable[[str], S3Settings] = _aws_settings,
        cache: bounds.TtlCache[dict[str, Any]] | None = None,
    ) -> None:
        self._runs = runs
        self._read = read
        self._settings = settings
        self._cache = cache if cache is not None else bounds.TtlCache[dict[str, Any]]()

    def answer(self) -> tuple[dict[str, Any] | None, str | None, float]:
        entry = self._cache.get("runs", self._look)
        return entry.value, entry.error, max(0.0, time.monotonic() - entry.at)

    def _lake(self, record: RunRecord, aws_conn_id: str | None) -> dict[str, Any]:
        settings = None
        if s3_location(record.call.output) is not None and aws_conn_id:
            settings = self._settings(aws_conn_id)
        try:
            return self._read(record.call, settings)
        except Exception as exc:
            secrets = [settings.access_key, *settings.secrets()] if settings is not None else []
            raise RuntimeError(redact(f"{type(exc).__name__}: {exc}", [s for s in secrets if s])) from None

    def _look(self) -> dict[str, Any]:
        began = time.monotonic()
        found = self._runs(bounds.RUNS_LIMIT)
        jobs = [cluster._POOL.submit(self._lake, record, aws) for record, aws in found]
        deadline = time.monotonic() + bounds.READ_TIMEOUT
        rows = []
        for (record, _), job in zip(found, jobs, strict=True):
            try:
                lake = job.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                job.cancel()
                lake = {"ranges": None, "error": f"the lake's record was not read within {bounds.READ_TIMEOUT:.0f} s"}
            except Exception as exc:  # shown in the run's row, the others still shown
                lake = {"ranges": None, "error": str(exc) or type(exc).__name__}
            rows.append(run_row(record, lake))
        return {
            "runs": rows,
            "elapsed_ms": round((time.monotonic() - began) * 1000),
            "bounds": {
                "runs_limit": bounds.RUNS_LIMIT,
                "scanned_tasks": run_sources.SCANNED_TASKS,
                "read_timeout_s": bounds.READ_TIMEOUT,
                "cache_ttl_s": bounds.CACHE_TTL,
            },
        }
