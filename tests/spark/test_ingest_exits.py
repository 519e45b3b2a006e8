"""The ingest job's driver ends, with a failing status, on every way a run can fail.

spark-submit's Python driver must never end through Python's interpreter
shutdown once Spark started: py4j's daemon threads are stopped wherever they
are, and one stopped inside a log call keeps the handler's lock, so shutdown
waits forever (seen in CI: spark-submit, and the Airflow task, never ended).
That hang depends on timing; these tests make it certain instead, with an
``atexit`` handler that never returns (installed through ``sitecustomize`` in
the driver only). A driver that ends with ``os._exit`` skips it, as it skips
the real hang; one that returns through shutdown hangs, and the bound fails it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from liftbridge_provider import fault_points
from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "spark_jobs" / "ingest.py"
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
BOUND = 150  # seconds: a failing run ends well within this; a hung one never does

HANG_AT_SHUTDOWN = """
import atexit, os, sys, time
if sys.argv and sys.argv[0].endswith("ingest.py"):
    atexit.register(lambda: time.sleep(3600))
"""


@pytest.fixture(scope="module")
def stream(liftbridge_server: DevServer) -> str:
    name = f"exits-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(name, name)
        client.publish_batch(name, [b"x"] * 20, ack_policy="all")
    return name


def submit(tmp_path: Path, brokers: str, ranges: RangesDocument, table: Path, env: dict[str, str]) -> tuple[int, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HANG_AT_SHUTDOWN)
    command = [
        SPARK_SUBMIT, "--master", "local[1]", "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.task.maxFailures=1", str(INGEST),
        "--brokers", brokers, "--ranges", ranges.dumps(), "--output", str(table), "--format", "delta",
        "--request-timeout", "2",
    ]  # fmt: skip
    full_env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **env}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen(
        command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # spark-submit and the hung Python driver it started
        output, _ = process.communicate()
        pytest.fail(f"the driver did not end within {BOUND} s after failing:\n{output[-3000:]}")
    return process.returncode, output


@pytest.mark.parametrize(
    "cause",
    [
        "a Liftbridge error on the driver (no broker answers)",
        "a Spark task failure (the executor's Python dies reading)",
        "an unexpected error on the driver after Spark wrote the files",
        "a Delta error (the table's log is corrupt)",
    ],
)
def test_a_failing_run_ends_with_status_1_without_interpreter_shutdown(
    liftbridge_server: DevServer, stream: str, tmp_path: Path, cause: str
) -> None:
    brokers = ",".join(liftbridge_server.brokers)
    table = tmp_path / "table"
    env: dict[str, str] = {}
    if cause.startswith("a Liftbridge error"):
        brokers = "127.0.0.1:1"
    elif cause.startswith("a Spark task failure"):
        env[fault_points.ENV] = "source.read_slice=exit"
    elif cause.startswith("an unexpected error"):
        env[fault_points.ENV] = "ingest.table_written=raise"
    else:
        log = table / "_delta_log"
        log.mkdir(parents=True)
        (log / "00000000000000000000.json").write_text("{not json\n")
    status, output = submit(tmp_path, brokers, RangesDocument(stream, (OffsetRange(0, 0, 20),)), table, env)
    assert status == 1, output[-3000:]
    assert "ERROR liftbridge.ingest" in output, "the reason is logged: " + output[-3000:]
