"""The provider in this Airflow, for real: `airflow dags test`, the triggerer and `airflow standalone`.

On Airflow 3.1 and 3.2 (no task state store, no shared trigger streams) the
guarantees are the same as on 3.3: a retry of a DAG run freezes the same
ranges, and a watcher's cursor passes an event only once Airflow stored it, so
a killed triggerer loses nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from liftbridge_provider.client import LiftbridgeClient, partition_by_round_robin
from liftbridge_provider.core.watching import CursorNames
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.config import free_port
from liftbridge_provider.devserver.leftovers import end_session

pytestmark = pytest.mark.airflow_target
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
WAIT = 240.0  # seconds a wait below may take before the test fails


def airflow_env(home: Path, server: DevServer, dags: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "4",
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": ",".join(server.brokers)}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        **extra,
    }


def run_airflow(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    result = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"airflow {' '.join(args)} failed:\n{output[-6000:]}"
    return output


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory, liftbridge_server: DevServer) -> Path:
    home = tmp_path_factory.mktemp("airflow-template")
    run_airflow(airflow_env(home, liftbridge_server, home), "db", "migrate")
    return home / "airflow.db"


@pytest.fixture
def home(tmp_path: Path, migrated_db: Path) -> Path:
    (tmp_path / "dags").mkdir()
    shutil.copy(migrated_db, tmp_path / "airflow.db")
    return tmp_path


def lake_rows(folder: Path) -> list[tuple[int, int]]:
    """(partition, offset) of every Parquet row the ingest job wrote under ``folder``."""
    rows: list[tuple[int, int]] = []
    for file in sorted(folder.glob("partition=*/range=*/*.parquet")):
        table = pq.ParquetFile(file).read(columns=["partition", "offset"])
        rows += zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
    return rows


def test_the_main_dag_ingests_what_each_run_published_once(
    home: Path, liftbridge_server: DevServer, project: Path
) -> None:
    """dags/liftbridge_spark_ingest.py with `airflow dags test`, twice: create the stream, publish, freeze,
    wait (deferred), spark-submit the ingest job, commit. Each published message lands in Parquet once, and
    the cursor ends at each partition's last offset."""
    stream, lake = f"main-{uuid.uuid4().hex[:8]}", home / "lake"
    env = airflow_env(home, liftbridge_server, project / "dags")
    for batch in (300, 90):
        conf = json.dumps({"stream": stream, "batch_size": batch, "output_path": str(lake), "partitions": 3})
        run_airflow(env, "dags", "test", "liftbridge_spark_ingest", "--conf", conf)
    rows = lake_rows(lake / f"stream={stream}")
    assert len(rows) == 390
    assert len(set(rows)) == 390, "a message was ingested twice"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        for partition in range(3):
            high = client.fetch_partition_metadata(stream, partition).high_watermark
            assert client.fetch_cursor("spark-ingest", stream, partition) == high


FREEZE_DAG = """
    import json, os
    from datetime import timedelta
    from pathlib import Path
    from airflow.providers.common.compat.sdk import AirflowException
    from airflow.sdk import DAG
    from liftbridge_provider.client import LiftbridgeClient
    from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator

    class FreezeThenFailOnce(LiftbridgeOffsetRangesOperator):
        def execute(self, context):
            document = super().execute(context)
            with Path(os.environ["FREEZE_RECORD"]).open("a") as record:
                record.write(json.dumps({{"try": context["ti"].try_number, "document": document}}) + "\\n")
            if context["ti"].try_number == 1:  # more data lands, then the try fails after freezing
                with LiftbridgeClient(os.environ["LIFTBRIDGE_BROKERS"].split(",")) as client:
                    client.publish_batch("{stream}", [b"late"] * 30)
                raise AirflowException("the first try fails after freezing")
            return document

    with DAG("freeze_once", schedule=None):
        FreezeThenFailOnce(task_id="freeze", stream="{stream}", cursor_id="once", retries=1,
                           retry_delay=timedelta(seconds=0))
"""


def test_a_retry_of_a_run_returns_the_ranges_its_first_try_froze(home: Path, liftbridge_server: DevServer) -> None:
    """Without Airflow's task state store, a retry in the same DAG run still freezes nothing new: the second
    try returns the very document the first froze, although 30 more messages landed in between (kept in the
    stream's cursors)."""
    stream, record = f"once-{uuid.uuid4().hex[:8]}", home / "freezes.jsonl"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(stream, stream, partitions=2)
        client.publish_batch(stream, [b"early"] * 50, partitioner=partition_by_round_robin())
    (home / "dags" / "freeze_once.py").write_text(textwrap.dedent(FREEZE_DAG.format(stream=stream)))
    env = airflow_env(home, liftbridge_server, home / "dags", FREEZE_RECORD=str(record),
                      LIFTBRIDGE_BROKERS=",".join(liftbridge_server.brokers))  # fmt: skip
    run_airflow(env, "dags", "test", "freeze_once")
    tries = [json.loads(line) for line in record.read_text().splitlines()]
    assert [t["try"] for t in tries] == [1, 2]
    assert tries[1]["document"] == tries[0]["document"]
    assert sum(r["end"] - r["start"] for r in tries[0]["document"]["ranges"]) == 50


class Triggerer:
    """`airflow triggerer` in its own process group, logging to a file."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.home / f"triggerer-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [AIRFLOW, "triggerer"], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def signal(self, sig: signal.Signals, wait: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait)

    def log_text(self) -> str:
        return "".join(log.read_text(errors="replace") for log in self.logs)


@pytest.fixture
def triggerer(home: Path, liftbridge_server: DevServer) -> Iterator[Triggerer]:
    started = Triggerer(home, airflow_env(home, liftbridge_server, home / "dags"))
    yield started
    if started.process is not None:
        end_session(started.process, ("AIRFLOW_HOME", str(home)), timeout=30)


def asset_offsets(home: Path, asset: str) -> list[tuple[int, int]]:
    """(partition, offset) of each event Airflow stored for the asset, oldest first."""
    with sqlite3.connect(home / "airflow.db", timeout=30) as db:
        rows = db.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id",
            (asset,),
        ).fetchall()
    payloads = [json.loads(extra)["payload"] for (extra,) in rows]
    return [(p["partition"], p["offset"]) for p in payloads]


def wait_until(condition: Callable[[], bool], what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT:g}s waiting for {what}; log:\n{log()[-6000:]}")
        time.sleep(0.5)


WATCH_DAG = """
    from airflow.sdk import DAG, Asset, AssetWatcher, task
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    watched = Asset(name="watched", uri="liftbridge://{broker}/{stream}", watchers=[
        AssetWatcher(name="watched", trigger=MessageQueueTrigger(queue="liftbridge://{broker}/{stream}?cursor_id=w")),
    ])
    with DAG("on_watched", schedule=[watched]):
        task(lambda: None, task_id="noop")()
"""


def test_a_watcher_passes_each_message_after_airflow_stored_it_and_a_killed_triggerer_loses_nothing(
    home: Path, liftbridge_server: DevServer, triggerer: Triggerer
) -> None:
    """A message-mode watcher (the queue URI form of MessageQueueTrigger) in the real triggerer: an event
    per message; SIGKILL the triggerer part way and start another: every message has a stored event (the one
    handed over when it was killed may come twice), and the cursor ends on each partition's last offset."""
    stream = f"watch-{uuid.uuid4().hex[:8]}"
    env = triggerer.env
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(stream, stream, partitions=2)
        client.publish_batch(stream, [f"m{n}".encode() for n in range(16)], partitioner=partition_by_round_robin())
        body = WATCH_DAG.format(broker=liftbridge_server.brokers[0], stream=stream)
        (home / "dags" / "watch.py").write_text(textwrap.dedent(body))
        run_airflow(env, "dags", "reserialize")
        triggerer.start()
        wait_until(lambda: len(asset_offsets(home, "watched")) >= 5, "5 events", triggerer.log_text)
        triggerer.signal(signal.SIGKILL)
        triggerer.start()
        every = {(p, o) for p in range(2) for o in range(8)}
        wait_until(lambda: set(asset_offsets(home, "watched")) >= every, "an event per message", triggerer.log_text)
        position = CursorNames("w").position
        wait_until(
            lambda: all(client.fetch_cursor(position, stream, p) == 7 for p in range(2)),
            "the cursor on each partition's last offset",
            triggerer.log_text,
        )
    stored = asset_offsets(home, "watched")
    assert set(stored) == every
    assert len(stored) <= len(every) + 2, f"more repeats than events handed over at the kill: {stored}"


def test_the_event_dag_runs_once_from_a_published_batch(
    home: Path, liftbridge_server: DevServer, project: Path
) -> None:
    """dags/liftbridge_event_ingest.py under `airflow standalone`: 300 messages make one batch (after
    max_wait), one DAG run ingests it, and every message is in Parquet once. The provider's Liftbridge page
    answers in this Airflow's API server: the stream's partitions, and the run with its 300 rows."""
    stream, lake, port = f"events-{uuid.uuid4().hex[:8]}", home / "lake", free_port()
    env = airflow_env(
        home,
        liftbridge_server,
        project / "dags",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        # a task the scheduler starts before the API server listens retries it: minutes, not ~15 s (the
        # system tests' airflow_standalone.STANDALONE_ENV says why)
        AIRFLOW__WORKERS__EXECUTION_API_RETRIES="10",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",  # a token for the page's API without a login
        LIFTBRIDGE_EVENTS_STREAM=stream,
        LIFTBRIDGE_EVENTS_OUTPUT=str(lake),
    )
    log = home / "standalone.log"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(stream, stream, partitions=3)
        client.publish_batch(stream, [f"e{n}".encode() for n in range(300)], partitioner=partition_by_round_robin())
        standalone = subprocess.Popen(
            [AIRFLOW, "standalone"], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            folder = lake / f"stream={stream}"
            wait_until(lambda: len(lake_rows(folder)) >= 300, "300 rows in the lake", log.read_text)
            wait_until(lambda: _runs(home, "liftbridge_event_ingest", "success") == 1, "the run's success",
                       log.read_text)  # fmt: skip
            page = _page_api(f"http://127.0.0.1:{port}")
            streams = {row["stream"]: row for row in page("/liftbridge/api/connections/liftbridge_default/streams")}
            assert [p["partition"] for p in streams[stream]["partitions"]] == [0, 1, 2], streams.get(stream)
            ours = [r for r in page("/liftbridge/api/runs")["runs"] if r["dag_id"] == "liftbridge_event_ingest"]
            assert sum(r["total_rows"] or 0 for r in ours) == 300, ours
        finally:
            end_session(standalone, ("AIRFLOW_HOME", str(home)))
    rows = lake_rows(lake / f"stream={stream}")
    assert sorted(rows) == sorted((p, o) for p in range(3) for o in range(100))
    assert _runs(home, "liftbridge_event_ingest") == 1


def _page_api(base: str) -> Callable[[str], Any]:
    """A reader of the Liftbridge page's JSON API with a token of this API server (every user an admin)."""
    with urllib.request.urlopen(f"{base}/auth/token", timeout=30) as response:
        token = json.load(response)["access_token"]

    def get(path: str) -> Any:
        request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
        return body.get("streams", body) if path.endswith("/streams") else body

    return get


def _runs(home: Path, dag_id: str, state: str | None = None) -> int:
    query: tuple[Any, ...] = ("SELECT count(*) FROM dag_run WHERE dag_id = ?", (dag_id,))
    if state is not None:
        query = ("SELECT count(*) FROM dag_run WHERE dag_id = ? AND state = ?", (dag_id, state))
    with sqlite3.connect(home / "airflow.db", timeout=30) as db:
        count: int = db.execute(*query).fetchone()[0]
    return count
