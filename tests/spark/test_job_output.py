"""What a run of the ingest job prints: no warning about something the user did not do.

A trial of docs/spark.md's cluster steps (issue 50) found two warnings on every
run: "WARN DataSourceManager: The data source liftbridge replaced a statically
registered data source" (the job registered the source PySpark had already
found by itself) and PySpark 4.3's "FutureWarning: PySpark does not yet fully
support pandas >= 3.0.0" (its py4j argument converter imports PySpark's test
helpers, which check pandas; this venv has pandas 3 through the Spark
provider's pyspark-client; the job uses no pandas). A real spark-submit of the
installed job on ``local[2]`` against a real server; docs/spark.md, "What a run
prints", explains the warnings that remain Spark's own.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import uuid
from pathlib import Path

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer

SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
GONE = ("replaced a statically registered data source", "PySpark does not yet fully support pandas")


def test_a_run_prints_neither_a_replaced_data_source_nor_pandas_warning(
    liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    stream = f"out-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    client.publish_batch(stream, [b"m"] * 50, partitioner=None, ack_policy="all")
    pandas = importlib.metadata.version("pandas")  # PySpark warns only when pandas 3 is installed
    assert int(pandas.split(".")[0]) >= 3, f"pandas {pandas}: this test needs pandas >= 3 to be able to fail"
    job = subprocess.run(
        [sys.executable, "-m", "liftbridge_provider.spark.ingest", "--path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    document = RangesDocument(stream, (OffsetRange(0, 0, 50),))
    command = [SPARK_SUBMIT, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", "spark.ui.enabled=false", job, "--brokers", ",".join(liftbridge_server.brokers),
               "--ranges", document.dumps(), "--output", str(tmp_path / "lake")]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "the lake holds 50 rows" in output
    for text in GONE:
        assert text not in output, next(line for line in output.splitlines() if text in line)
