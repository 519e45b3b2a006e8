"""The ingest job's arguments and the Spark source's options, without Spark running (pure).

The job gets the whole ``liftbridge`` connection (JSON, as Airflow writes it),
not only ``--brokers``; reads are bounded by ``--read-timeout``, ``--batch-size``
and ``--batch-bytes``; ``--compacted`` marks a compacted stream.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import InvalidArgumentError
from liftbridge_provider.connection import config_from_connection_json
from liftbridge_provider.core import lake
from liftbridge_provider.hooks import liftbridge as hook_module
from liftbridge_provider.spark import ingest
from liftbridge_provider.spark.ingest import missing_driver_python
from liftbridge_provider.spark.options import parse_options

PEM = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----"


def connection(**fields: Any) -> str:
    return json.dumps({"conn_type": "liftbridge", **fields})


def test_the_hook_re_exports_the_airflow_free_mapping() -> None:
    from liftbridge_provider import connection as pure  # noqa: PLC0415

    assert hook_module.config_from_connection is pure.config_from_connection
    assert hook_module.brokers_from is pure.brokers_from


@pytest.mark.parametrize(
    ("text", "brokers"),
    [
        (connection(host="a,b:7", port=9300), ("a:9300", "b:7")),
        (connection(host="a", port="9300"), ("a:9300",)),
        (json.dumps({"host": "a"}), ("a:9292",)),
        (connection(host="[::1]", port=None, extra="", login=None, schema="", description="x"), ("[::1]:9292",)),
    ],
)
def test_connection_json_gives_brokers_with_the_port_field(text: str, brokers: tuple[str, ...]) -> None:
    assert config_from_connection_json(text).brokers == brokers


def test_connection_json_extra_as_object_or_string() -> None:
    extra = {"tls_ca_cert": PEM, "tls_server_name": "lb.internal", "request_timeout": "4", "read_isr_replica": True}
    for given in (extra, json.dumps(extra)):
        config = config_from_connection_json(connection(host="h", extra=given))
        assert config.tls is not None
        assert (config.tls.ca, config.tls.server_name) == (PEM, "lb.internal")
        assert (config.request_timeout, config.read_isr_replica) == (4.0, True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "the Liftbridge connection JSON is not valid JSON"),
        ("[1]", "must be a JSON object, got list"),
        (connection(host="h", colour="red"), "unknown keys ['colour']"),
        (json.dumps({"conn_type": "kafka", "host": "h"}), "conn_type must be 'liftbridge', got 'kafka'"),
        (connection(host="h", port="x"), "port must be a number 1-65535, got 'x'"),
        (connection(host="h", port=70000), "port must be a number 1-65535, got 70000"),
        (connection(host="h", extra="{bad"), "the connection's extra is not valid JSON"),
        (connection(host="h", extra=[1]), "the connection's extra must be a JSON object, got list"),
        (connection(host="h", extra={"tls_client_cert": "c.pem"}), "both a client certificate and a client key"),
        (connection(port=1), "the Liftbridge connection has no host"),
    ],
)
def test_bad_connection_json_is_named(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        config_from_connection_json(text)
    assert message in str(raised.value)


def args(*extra: str) -> Any:
    return ingest.parse_args(["--ranges", "{}", "--output", "lake", *extra])


def test_the_job_reads_the_connection_from_the_environment_or_the_argument() -> None:
    env = {"LIFTBRIDGE_CONN_JSON": connection(host="a,b", port=9400, extra={"tls_ca_cert": PEM})}
    config = ingest.client_config(args(), env)
    assert config.brokers == ("a:9400", "b:9400")
    assert config.tls is not None
    assert config.tls.ca == PEM
    given = ingest.client_config(args("--liftbridge-conn-json", connection(host="c")), env)
    assert given.brokers == ("c:9292",), "the argument wins over the environment"
    flags = ingest.client_config(args("--brokers", "d:1", "--tls-server-name", "n", "--request-timeout", "3"), env)
    assert flags.tls is not None
    assert (flags.brokers, flags.tls.server_name, flags.request_timeout) == (("d:1",), "n", 3.0)
    assert ingest.client_config(args("--brokers", "e"), {}).brokers == ("e:9292",)
    with pytest.raises(InvalidArgumentError, match="give the connection"):
        ingest.client_config(args(), {})


def test_the_job_passes_the_connection_and_budgets_to_the_source() -> None:
    extra = {"tls_ca_cert": PEM, "read_isr_replica": "true"}
    env = {"LIFTBRIDGE_CONN_JSON": connection(host="a", port=9400, extra=extra)}
    namespace = args("--read-timeout", "30", "--batch-size", "500", "--batch-bytes", "1048576", "--compacted")
    options = ingest.source_options(ingest.client_config(namespace, env), namespace)
    assert options["brokers"] == "a:9400"
    assert options["tlsCaCert"] == PEM
    assert (options["readFromReplica"], options["compacted"], options["failOnDataLoss"]) == ("true", "true", "true")
    read = parse_options({**options, "ranges": "{}"})
    assert (read.read_timeout, read.batch_size, read.batch_bytes, read.compacted) == (30.0, 500, 1048576, True)
    assert read.config.tls is not None
    assert read.config.read_isr_replica is False, "the source's own flag carries it: readFromReplica"
    assert read.read_from_replica is True
    skip = args("--brokers", "a", "--on-data-loss", "skip", "--allow-gaps")
    assert ingest.source_options(ingest.client_config(skip, {}), skip)["failOnDataLoss"] == "false"
    assert skip.compacted, "--allow-gaps is the old name of --compacted"


def test_source_budget_options_defaults_and_limits() -> None:
    read = parse_options({"brokers": "a", "ranges": "{}"})
    assert (read.read_timeout, read.batch_size, read.batch_bytes, read.compacted) == (120.0, 10_000, 64 << 20, False)
    with pytest.raises(InvalidArgumentError, match="option batchBytes must be at most 1073741824"):
        parse_options({"brokers": "a", "ranges": "{}", "batchBytes": str(3 << 30)})
    with pytest.raises(InvalidArgumentError, match="option compacted must be true or false, got 'yes'"):
        parse_options({"brokers": "a", "ranges": "{}", "compacted": "yes"})


@pytest.mark.parametrize("option", ["readTimeout", "requestTimeout", "minPartitions", "maxRecordsPerPartition"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_source_numbers_must_be_finite_and_positive(option: str, value: str) -> None:
    """readTimeout=nan was kept: a read's "no message for read_timeout seconds" test compares with nan, is
    never true, and a silent read never ended. Each number option now refuses what is not finite and > 0."""
    if option in ("minPartitions", "maxRecordsPerPartition") and value in ("nan", "inf", "-inf"):
        expected = f"option {option} must be a int"  # int("nan") is not a number at all
    else:
        expected = f"option {option} must be a finite number > 0, got {value!r}"
    with pytest.raises(InvalidArgumentError, match=re.escape(expected)):
        parse_options({"brokers": "a", "ranges": "{}", option: value})


def test_problems_accept_gaps_only_where_allowed() -> None:
    piece = {"partition": 0, "start": 10, "end": 20, "rows": 6, "min_offset": 14, "max_offset": 19}
    assert lake.problems([piece], False) == ["partition 0: 6 rows for 10 offsets [10, 20)"]
    assert lake.problems([piece], True) == []
    assert lake.problems([piece], False, head_loss_ok=True) == [], "only the head is missing"
    holed = {**piece, "min_offset": 10}
    assert lake.problems([holed], False, head_loss_ok=True) == ["partition 0: 6 rows for 10 offsets [10, 20)"]
    outside = {**piece, "rows": 10, "min_offset": 10, "max_offset": 25}
    assert lake.problems([outside], True) == ["partition 0: offsets 10-25 outside [10, 20)"]


HOLD_A_LOG_LOCK = """
import atexit, logging, runpy, sys, threading
logging.basicConfig(level=logging.INFO)
take, held = threading.Event(), threading.Event()
def hold() -> None:  # as py4j's daemon thread, stopped by Python's shutdown in the middle of a log call
    take.wait()
    logging.getLogger().handlers[0].acquire()
    held.set()
    threading.Event().wait()
def at_shutdown() -> None:  # runs before logging's own exit hook, which then waits for the lock
    take.set()
    held.wait()
threading.Thread(target=hold, daemon=True).start()
atexit.register(at_shutdown)
sys.argv = [sys.argv[1], "--ranges", "not json", "--output", "/tmp/nowhere"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("entry", ["spark_jobs/ingest.py", "liftbridge_provider/spark/ingest.py"])
def test_the_job_ends_even_when_a_daemon_thread_holds_a_logging_lock_at_exit(entry: str) -> None:
    """CI on 178eccc left an ingest driver behind for good: its work done, Python's shutdown stopped a py4j
    daemon thread holding the log handler's lock, and the gateway's cleanup waited for that lock (py-spy:
    ``ClientServerConnection.__del__`` -> ``Handler.acquire``), so spark-submit and the Airflow task would
    never end. The job now ends without Python's shutdown. Hung (timeout) before."""
    root = Path(__file__).resolve().parents[2]
    finished = subprocess.run(
        [sys.executable, "-c", HOLD_A_LOG_LOCK, str(root / entry)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=root,
    )
    assert finished.returncode == 2, finished.stderr[-2000:]
    assert "ranges document is not valid JSON" in finished.stderr, "the bad input is still reported"


def test_a_driver_python_that_cannot_run_where_spark_submit_runs_is_refused_before_anything_is_claimed() -> None:
    """An archive shipped with --archives ...#env is unpacked on the executors only: in client mode the driver's
    planning worker needs ./env/bin/python where spark-submit runs (before, a raw Py4JJavaError after claiming)."""

    problem = missing_driver_python("./env/bin/python", "client", lambda path: False)
    assert problem is not None
    assert "spark.pyspark.python='./env/bin/python' cannot be run where spark-submit runs" in problem
    assert "tar -xzf dist/liftbridge-spark-env.tar.gz -C env" in problem
    assert missing_driver_python("./env/bin/python", "cluster", lambda path: False) is None
    assert missing_driver_python("./env/bin/python", "client", lambda path: True) is None
    assert missing_driver_python(None, "client", lambda path: False) is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "--batch-size (option batchSize) must be"),
        (["--read-timeout", "nan"], "--read-timeout (option readTimeout) must be a finite number > 0"),
        (["--read-timeout", "-1"], "--read-timeout (option readTimeout) must be a finite number > 0"),
        (["--min-partitions", "0"], "--min-partitions (option minPartitions) must be"),
        (["--batch-bytes", str(2 << 30)], "--batch-bytes (option batchBytes) must be at most"),
        (["--request-timeout", "1e12"], "request_timeout must be at most 1e+09 seconds"),
    ],
)
def test_the_job_refuses_bad_source_arguments_before_spark_and_any_claim(
    tmp_path: Path, flags: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    """--batch-size 0 or --read-timeout nan passed the job's own checks: Spark started, the run claimed its
    pieces in the lake's ledger, and only the first read refused the option (by its Spark name). Now the
    job exits 2 naming the flag, before Spark starts, and the lake is untouched."""
    lake = tmp_path / "lake"
    ranges = '{"stream": "s", "ranges": [{"partition": 0, "start": 0, "end": 5}]}'
    started: list[str] = []

    class NoSpark:
        @property
        def builder(self) -> Any:
            started.append("builder")
            raise AssertionError("Spark was started")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("liftbridge_provider.spark.ingest.SparkSession", NoSpark())
        code = ingest.main(["--brokers", "a", "--ranges", ranges, "--output", str(lake), *flags])
    assert code == 2
    assert message in caplog.text
    assert not started, "Spark was not started"
    assert not lake.exists(), "nothing was claimed or written"
