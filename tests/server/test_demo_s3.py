"""`make demo LAKE=s3`'s wiring, without Airflow or Spark: what tools/demo.py hands them, and its read-back.

The whole demo (three `airflow dags test` runs, each with a spark-submit) takes minutes per format, so it is run
by hand (README, "The two commands"); the system tier runs it on a local lake. Here, on the real gateway, in
seconds: the ``aws`` connection it puts in Airflow's environment maps to the gateway's own settings (the job's
mapping), Spark's configuration folder names S3A's jars and no key, Iceberg's catalog is a local SQLite file the
job finds by the catalog's name, a developer's ``AWS_*`` variables stay out, and the row count reads exactly
the range files of a Parquet lake, a Delta table and an Iceberg table in the bucket.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

from liftbridge_provider.core.s3_sources import settings_from_aws_connection_json
from liftbridge_provider.devserver.s3 import s3a_jars
from liftbridge_provider.spark.iceberg_ingest import catalog_properties

ROOT = Path(__file__).resolve().parents[2]
ROWS = pa.table({"partition": pa.array([0, 0, 1], pa.int32()), "offset": pa.array([0, 1, 0], pa.int64())})


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tools/demo.py as a module, its lake and Airflow home in ``tmp_path``."""
    spec = importlib.util.spec_from_file_location("liftbridge_demo", ROOT / "tools" / "demo.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUTPUT", tmp_path / "lake")
    monkeypatch.setattr(module, "AIRFLOW_HOME", tmp_path / "airflow")
    return module


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as started:
        yield started


def test_airflow_gets_the_gateway_as_an_aws_connection_and_spark_the_s3a_jars(
    demo: ModuleType, stack: ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = demo.s3_lake("parquet", stack)
    assert lake.output == "s3a://demo/lake"
    assert lake.s3_root == demo.OUTPUT.with_name("s3-lake")
    assert (lake.s3_root / "data" / "demo").is_dir(), "the bucket is a folder of the gateway's data folder"
    connection = lake.env["AIRFLOW_CONN_AWS_DEFAULT"]
    assert json.loads(connection)["conn_type"] == "aws"
    assert settings_from_aws_connection_json(connection) == lake.s3, "the job maps it to the gateway's settings"
    defaults = (Path(lake.env["SPARK_CONF_DIR"]) / "spark-defaults.conf").read_text()
    assert defaults == f"spark.jars {','.join(str(jar) for jar in s3a_jars())}\n"
    assert lake.s3.secret_key not in defaults
    assert lake.s3.access_key not in defaults
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a-developers-own")
    monkeypatch.setenv("AWS_PROFILE", "prod")
    env = demo.airflow_env(["127.0.0.1:1"], lake, mark="m")
    assert not [name for name in env if name.startswith("AWS_")], "a developer's AWS settings stay out"
    assert env["SPARK_CONF_DIR"] == lake.env["SPARK_CONF_DIR"]
    assert env[demo.MARK] == "m"
    assert "AWS_PROFILE" in demo.airflow_env(["127.0.0.1:1"], demo.local_lake("parquet"), mark="m")


def test_the_parquet_count_reads_the_range_files_of_the_stream_only(demo: ModuleType, stack: ExitStack) -> None:
    lake = demo.s3_lake("parquet", stack)
    assert demo.lake_offsets(lake) == [], "no stream folder yet"
    s3 = fs.S3FileSystem(**lake.s3.pyarrow_options())
    stream = f"demo/lake/stream={demo.STREAM}"
    pq.write_table(ROWS.slice(0, 2), f"{stream}/partition=0/range=0-2/part-00000.parquet", filesystem=s3)
    pq.write_table(ROWS.slice(2), f"{stream}/partition=1/range=0-1/part-00000.parquet", filesystem=s3)
    pq.write_table(ROWS, f"{stream}/_staging/run/p=0/claim=1/part-00000.parquet", filesystem=s3)  # not published
    with s3.open_output_stream(f"{stream}/partition=0/range=0-2/_SUCCESS") as marker:
        marker.write(b"")
    assert demo.lake_offsets(lake) == [(0, 0), (0, 1), (1, 0)]


def test_the_delta_count_reads_the_table_in_the_bucket(demo: ModuleType, stack: ExitStack) -> None:
    from deltalake import write_deltalake  # noqa: PLC0415 - the spark extra

    lake = demo.s3_lake("delta", stack)
    assert lake.output == "s3a://demo/lake-delta"
    assert demo.lake_offsets(lake) == [], "no table yet"
    write_deltalake("s3://demo/lake-delta", ROWS, storage_options=lake.s3.delta_storage_options())
    assert demo.lake_offsets(lake) == [(0, 0), (0, 1), (1, 0)]


def test_iceberg_gets_a_sql_catalog_on_a_local_file_that_the_job_finds_by_name(
    demo: ModuleType, stack: ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.catalog import load_catalog  # noqa: PLC0415 - the iceberg extra
    from pyiceberg.utils.config import Config  # noqa: PLC0415

    lake = demo.s3_lake("iceberg", stack)
    assert lake.output == "s3a://demo/lake-iceberg"
    for name, value in lake.env.items():
        if name.startswith("PYICEBERG_"):
            monkeypatch.setenv(name, value)
    configured = {k: str(v) for k, v in (Config().get_catalog_config(demo.ICEBERG_CATALOG) or {}).items()}
    assert configured == {"type": "sql", "uri": f"sqlite:///{lake.s3_root / 'iceberg-catalog.db'}"}
    properties = catalog_properties(lake.output, {}, lake.s3, configured)  # what the job loads the catalog with
    assert properties["warehouse"] == "s3://demo/lake-iceberg"
    assert demo.lake_offsets(lake) == [], "no table yet"
    # pyiceberg adds what its configuration says of the name; it read the environment when first imported
    catalog = load_catalog(demo.ICEBERG_CATALOG, **configured, **properties)
    catalog.create_namespace("liftbridge")
    catalog.create_table("liftbridge.demo_events", ROWS.schema).append(ROWS)
    assert demo.lake_offsets(lake) == [(0, 0), (0, 1), (1, 0)]
