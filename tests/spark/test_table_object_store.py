"""``--format delta`` and ``--format iceberg`` land each offset exactly once in an ``s3a://`` lake on a real S3 server.

Versity's S3 gateway on 127.0.0.1 (tests/object_store.py), a real Liftbridge node, real Spark with S3A, and each
format's own library reading the table back with the job's settings: delta-rs (``storage_options``), and
pyiceberg with its SQL catalog on a local SQLite file or Iceberg's reference REST catalog (tests/iceberg_rest.py).
Each test tries to break the guarantee, per format: ranges in any order, overlapping, around a held middle, and
run again; two runs committing at the same moment; a run dying right after its plan and right after its
commit; and a spark-submit driver SIGKILLed (its whole process group) in the middle of Spark's write and between
the write and the commit. Those drivers get the object store's keys only from an Airflow ``aws`` connection in
``LIFTBRIDGE_AWS_CONN_JSON``, and the secret key is looked for, and must not be found, in every command line of
the run's processes and in all of its output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog
from pyspark.sql import SparkSession

from liftbridge_provider import fault_points
from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.iceberg_plan import read_holdings
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.core.s3_sources import AWS_CONNECTION_ENV
from liftbridge_provider.delta_table import holdings
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.s3 import S3Server
from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator
from liftbridge_provider.spark import ingest
from tests.chaos.batch import StateStore
from tests.iceberg_rest import IcebergRest, start_iceberg_rest
from tests.object_store import s3a_submit_options
from tests.spark.stream_queries import run_available_now

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
FORMATS = ["delta", "iceberg-sql", "iceberg-rest"]
Row = tuple[int, int, bytes]


@pytest.fixture(scope="module")
def stream(client: LiftbridgeClient) -> str:
    """Two partitions, offsets 0-199 each; the value names its partition and offset."""
    name = f"s3lake-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=2)
    batch = [PublishMessage(f"p{p}-{n}".encode(), partition=p) for n in range(200) for p in range(2)]
    client.publish_batch(name, batch, ack_policy="all")
    return name


@pytest.fixture(scope="module")
def rest_catalog(
    s3_server: S3Server, s3_module_bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IcebergRest]:
    """Iceberg's reference REST catalog, its warehouse in the module's bucket (started by the first REST test)."""
    catalog = start_iceberg_rest(
        s3_server.settings, f"s3://{s3_module_bucket}/rest-warehouse", tmp_path_factory.mktemp("rest")
    )
    yield catalog
    catalog.stop()


@dataclass
class Lake:
    """One table of one format in the bucket: the job's arguments for it, and its own reader."""

    kind: str
    output: str
    table_args: list[str]
    settings: S3Settings
    catalog: dict[str, str]
    identifier: str

    def args(self, brokers: list[str], ranges: RangesDocument) -> list[str]:
        fmt = "delta" if self.kind == "delta" else "iceberg"
        base = ["--brokers", ",".join(brokers), "--ranges", ranges.dumps(), "--output", self.output]
        return [*base, "--format", fmt, *self.table_args]

    def run(self, spark: SparkSession, brokers: list[str], ranges: RangesDocument) -> Any:
        """The job's ``run`` in this process, on the shared S3A session (keys from its environment)."""
        return ingest.run(spark, ingest.parse_args(self.args(brokers, ranges)))

    def rows(self) -> list[Row]:
        """(partition, offset, value) of every row the format's reader sees, sorted."""
        if self.kind == "delta":
            data = self._delta().to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
        else:
            table = self._iceberg()
            data = table.scan(selected_fields=("partition", "offset", "value")).to_arrow().to_pylist()
        return sorted((r["partition"], r["offset"], r["value"]) for r in data)

    def held(self, stream: str, partition: int) -> list[tuple[int, int]]:
        if self.kind == "delta":
            return holdings(self._delta(), stream, [partition])[partition]
        return read_holdings(stream, partition, self._iceberg().properties)

    def data_files(self) -> list[str]:
        """Every Parquet file under the table's location, committed or not."""
        location = self.output if self.kind == "delta" else self._iceberg().location()
        bucket_key = location.split("://", 1)[1].rstrip("/")
        files = pafs.S3FileSystem(**self.settings.pyarrow_options())
        found = files.get_file_info(pafs.FileSelector(bucket_key, recursive=True, allow_not_found=True))
        return [f.path for f in found if f.path.endswith(".parquet")]

    def _delta(self) -> DeltaTable:
        return DeltaTable(self.output.replace("s3a://", "s3://"), storage_options=self.settings.delta_storage_options())

    def _iceberg(self) -> Any:
        catalog = load_catalog("liftbridge", **self.catalog, **self.settings.pyiceberg_properties())
        return catalog.load_table(self.identifier)


@pytest.fixture(params=FORMATS)
def lake(
    request: pytest.FixtureRequest,
    s3a_spark: SparkSession,
    s3_settings: S3Settings,
    s3_module_bucket: str,
    tmp_path: Path,
) -> Lake:
    """A new table of each format in the module's bucket."""
    output = f"s3a://{s3_module_bucket}/{request.param}-{uuid.uuid4().hex[:10]}"
    if request.param == "delta":
        return Lake("delta", output, [], s3_settings, {}, "")
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    if request.param == "iceberg-sql":
        catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"}
    else:
        catalog = {"type": "rest", "uri": request.getfixturevalue("rest_catalog").uri}
    table_args = [f"--iceberg-catalog-property={k}={v}" for k, v in catalog.items()]
    table_args += ["--iceberg-table", f"{namespace}.orders"]
    return Lake(request.param, output, table_args, s3_settings, catalog, f"{namespace}.orders")


def document(stream: str, *ranges: tuple[int, int, int]) -> RangesDocument:
    return RangesDocument(stream, tuple(OffsetRange(p, s, e) for p, s, e in ranges))


def expected(*ranges: tuple[int, int, int]) -> list[Row]:
    return sorted((p, n, f"p{p}-{n}".encode()) for p, s, e in ranges for n in range(s, e))


def pieces(outcome: Any) -> list[tuple[int, int, int, int]]:
    return [(e["partition"], e["start"], e["end"], e["rows"]) for e in outcome.entries]


def test_ranges_in_any_order_overlapping_around_a_held_middle_and_rerun_land_once(
    lake: Lake, s3a_spark: SparkSession, liftbridge_server: DevServer, stream: str
) -> None:
    brokers = liftbridge_server.brokers
    later = lake.run(s3a_spark, brokers, document(stream, (0, 100, 150), (1, 50, 100)))
    assert (later.problems, later.gaps) == ([], [])
    earlier = lake.run(s3a_spark, brokers, document(stream, (0, 0, 100)))
    assert pieces(earlier) == [(0, 0, 100, 100)]
    around = lake.run(s3a_spark, brokers, document(stream, (1, 0, 200)))
    assert pieces(around) == [(1, 0, 50, 50), (1, 100, 200, 100)], "both sides of the held middle, in one run"
    for start, end in ((0, 150), (20, 130)):
        again = lake.run(s3a_spark, brokers, document(stream, (0, start, end), (1, 0, 200)))
        assert (again.problems, again.entries) == ([], []), f"[{start}, {end}) is held: nothing written"
    assert lake.rows() == expected((0, 0, 150), (1, 0, 200))
    assert (lake.held(stream, 0), lake.held(stream, 1)) == ([(0, 150)], [(0, 200)])


def test_two_runs_committing_at_once_leave_each_offset_once(
    lake: Lake, s3a_spark: SparkSession, liftbridge_server: DevServer, stream: str
) -> None:
    """Two runs of overlapping ranges write their files, then commit at the same moment (the first time each
    reaches its commit): the store takes one commit (delta-rs: a conditional PUT of the log's next version;
    Iceberg: the catalog's compare-and-swap), the other run plans again and writes only what is missing."""
    both_written = threading.Barrier(2, timeout=120)
    met: list[int] = []

    def meet_once(_: str) -> None:
        if len(met) < 2:
            met.append(1)
            both_written.wait()

    outcomes: list[Any] = []
    errors: list[BaseException] = []

    def one_run(ranges: RangesDocument) -> None:
        try:
            outcomes.append(lake.run(s3a_spark, liftbridge_server.brokers, ranges))
        except BaseException as exc:  # shown by the assertion below
            errors.append(exc)

    runs = [
        threading.Thread(target=one_run, args=(document(stream, (0, 0, 60), (1, 0, 90)),)),
        threading.Thread(target=one_run, args=(document(stream, (0, 40, 120), (1, 90, 130)),)),
    ]
    with fault_points.armed("ingest.table_written", meet_once):
        for thread in runs:
            thread.start()
        for thread in runs:
            thread.join(300)
    assert errors == []
    assert [o.problems for o in outcomes] == [[], []]
    rows = lake.rows()
    assert rows == expected((0, 0, 120), (1, 0, 130))
    assert max(Counter((p, o) for p, o, _ in rows).values()) == 1


def test_a_run_dying_right_after_its_plan_or_right_after_its_commit_leaves_each_offset_once(
    lake: Lake, s3a_spark: SparkSession, liftbridge_server: DevServer, stream: str
) -> None:
    """The two steps whose crash leaves nothing between them and the next step: after the plan (nothing
    written yet) and after the commit (before the job read the table back). The retry of each range adds
    nothing twice. (The steps around Spark's write are killed for real, below.)"""
    brokers = liftbridge_server.brokers

    def die(_: str) -> None:
        raise RuntimeError("the driver dies here")

    with fault_points.armed("ingest.table_planned", die), pytest.raises(RuntimeError, match="dies here"):
        lake.run(s3a_spark, brokers, document(stream, (0, 0, 80)))
    with fault_points.armed("ingest.table_committed", die), pytest.raises(RuntimeError, match="dies here"):
        lake.run(s3a_spark, brokers, document(stream, (0, 0, 80)))
    assert lake.rows() == expected((0, 0, 80)), "the run that died after its commit had committed"
    retry = lake.run(s3a_spark, brokers, document(stream, (0, 0, 120)))
    assert pieces(retry) == [(0, 80, 120, 40)]
    assert lake.rows() == expected((0, 0, 120))


@dataclass
class Submitted:
    status: int
    output: str
    command_lines: list[str]


def submit_killed(lake: Lake, brokers: list[str], ranges: RangesDocument, point: str, tmp_path: Path) -> Submitted:
    """spark-submit of the job whose process group (spark-submit's JVM and the Python driver; Spark's Python
    workers die with them) is SIGKILLed at fault point ``point``. The object store's keys reach it only in an
    ``aws`` connection (``LIFTBRIDGE_AWS_CONN_JSON``): AWS_* variables are removed. While it runs, the command
    lines of its processes are collected from /proc."""
    settings = lake.settings
    connection = {
        "conn_type": "aws",
        "login": settings.access_key,
        "password": settings.secret_key,
        "extra": {"endpoint_url": settings.endpoint, "region_name": settings.region},
    }
    command = [
        SPARK_SUBMIT, "--verbose", "--master", "local[2]", *s3a_submit_options(settings),
        "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false",
        "--conf", "spark.logConf=true", "--conf", f"spark.local.dir={tmp_path}",
        str(INGEST), *lake.args(brokers, ranges),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, AWS_CONNECTION_ENV: json.dumps(connection)}
    )
    env[fault_points.ENV] = f"{point}=kill-session"  # from a Python worker too: its daemon has a group of its own
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(_command_lines(process.pid))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        done.set()
        watcher.join(5)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return Submitted(process.returncode, output, sorted(seen))


def _command_lines(session: int) -> Iterator[str]:
    """The command lines of the processes in session ``session`` (spark-submit's and its children's)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session:
                continue
            yield (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ProcessLookupError):
            continue


MID_WRITE = "source.read_slice"  # reached in a Spark Python worker while the write's tasks read
BEFORE_COMMIT = "ingest.table_written"
KILLS = [
    ("delta", MID_WRITE),
    ("delta", BEFORE_COMMIT),
    ("iceberg-sql", MID_WRITE),
    ("iceberg-sql", BEFORE_COMMIT),
    ("iceberg-rest", BEFORE_COMMIT),
]
"""Where a driver is killed, per format. Iceberg's write is the same whatever the catalog (Spark's files under
the table's data location), so its mid-write kill runs once; the catalogs differ from the commit on."""


@pytest.mark.parametrize(("lake", "point"), KILLS, indirect=["lake"])
def test_a_driver_sigkilled_around_the_write_leaves_nothing_and_the_retry_lands_each_offset_once(  # noqa: PLR0917 - fixtures
    lake: Lake, s3a_spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, point: str
) -> None:
    what = "in the middle of Spark's write" if point == MID_WRITE else "between the write and the commit"
    brokers = liftbridge_server.brokers
    ranges = document(stream, (0, 0, 120), (1, 0, 80))
    killed = submit_killed(lake, brokers, ranges, point, tmp_path)
    assert killed.status == -signal.SIGKILL, f"killed {what}: {killed.output[-3000:]}"
    assert "S3 settings from the aws connection" in killed.output, "the keys came from the connection"
    secret = lake.settings.secret_key
    assert any("ingest.py" in line for line in killed.command_lines), killed.command_lines
    assert not [line for line in killed.command_lines if secret in line], "a secret on a command line"
    assert secret not in killed.output, "a secret in the run's output (--verbose, spark.logConf=true)"
    assert lake.rows() == [], f"nothing of a run killed {what} is in the table"
    if point == BEFORE_COMMIT:
        assert lake.data_files(), "the killed run had written its files"
    retry = lake.run(s3a_spark, brokers, ranges)
    assert retry.problems == []
    rows = lake.rows()
    assert rows == expected((0, 0, 120), (1, 0, 80))
    assert max(Counter((p, o) for p, o, _ in rows).values()) == 1


def test_the_next_ranges_are_frozen_from_a_delta_table_on_s3_through_the_same_aws_connection(  # noqa: PLR0917 - fixtures
    s3a_spark: SparkSession,
    liftbridge_server: DevServer,
    stream: str,
    s3_settings: S3Settings,
    s3_module_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``LiftbridgeOffsetRangesOperator(start="delta")`` reads a table on S3 with the Amazon provider's ``aws``
    connection (delta-rs ``storage_options`` from it): the next ranges start where the table ends."""
    table = f"s3a://{s3_module_bucket}/freeze-{uuid.uuid4().hex[:8]}"
    lake = Lake("delta", table, [], s3_settings, {}, "")
    lake.run(s3a_spark, liftbridge_server.brokers, document(stream, (0, 0, 150), (1, 0, 120)))
    aws = {
        "conn_type": "aws",
        "login": s3_settings.access_key,
        "password": s3_settings.secret_key,
        "extra": {"endpoint_url": s3_settings.endpoint, "region_name": s3_settings.region},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_LAKE", json.dumps(aws))
    monkeypatch.setenv(
        "AIRFLOW_CONN_S3LAKE", json.dumps({"conn_type": "liftbridge", "host": liftbridge_server.brokers[0]})
    )
    freeze = LiftbridgeOffsetRangesOperator(
        task_id="freeze",
        stream=stream,
        start="delta",
        delta_table=table,
        aws_conn_id="aws_lake",
        liftbridge_conn_id="s3lake",
    )
    frozen = RangesDocument.parse(freeze.execute({"run_id": "r1", "task_state_store": StateStore()}))
    assert [(r.partition, r.start, r.end) for r in frozen.ranges] == [(0, 150, 200), (1, 120, 200)]


def test_a_stream_query_lands_each_micro_batch_once_in_a_delta_table_on_s3_even_when_spark_replays_one(  # noqa: PLR0917 - fixtures
    s3a_spark: SparkSession,
    liftbridge_server: DevServer,
    stream: str,
    s3_settings: S3Settings,
    s3_module_bucket: str,
    tmp_path: Path,
) -> None:
    """readStream + foreachBatch(DeltaBatchWriter) into ``s3a://``: the writer takes S3A's settings from the
    micro-batch's session (delta-rs's storage options, pyarrow's filesystem), writes each batch's files through
    S3A and commits them with the batch id. A batch Spark runs again after a crash between the Delta commit
    and its checkpoint's commit log (commits/N removed) is skipped: each offset once. (The writer refused any
    table on S3 before.)"""
    from liftbridge_provider.spark.delta_ingest import DeltaBatchWriter  # noqa: PLC0415

    table = f"s3a://{s3_module_bucket}/stream-query-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"
    writer = DeltaBatchWriter(table, "s3-stream-ingest")
    calls: list[tuple[int, int]] = []

    def write(frame: Any, batch_id: int) -> None:
        calls.append((batch_id, frame.count()))
        writer(frame, batch_id)

    def run_query() -> None:
        run_available_now(s3a_spark, liftbridge_server.brokers, stream, write, checkpoint, max_offsets=150)

    run_query()
    assert calls == [(0, 150), (1, 150), (2, 100)]
    assert writer.committed_batch() == 2
    lake = Lake("delta", table, [], s3_settings, {}, "")
    assert lake.rows() == expected((0, 0, 200), (1, 0, 200))
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    calls.clear()
    run_query()
    assert calls == [(2, 100)], "Spark ran batch 2 again"
    assert writer.committed_batch() == 2
    assert lake.rows() == expected((0, 0, 200), (1, 0, 200)), "the replayed batch was not added twice"
