"""The main flow: publish events to Liftbridge, then ingest exactly the new ones into Parquet with Spark.

create stream -> publish a batch -> freeze offset ranges (cursor .. high watermark)
-> wait until every range is committed (deferrable) -> spark-submit spark_jobs/ingest.py
on exactly those ranges (into Parquet, Delta or Iceberg: ``lake_format``) -> commit the
cursor to the ranges' ends.

Connections: ``liftbridge_default`` (the brokers) and ``spark_default`` (a Spark
master, e.g. ``local[*]``), and for a lake on S3 an ``aws`` connection (the
Amazon provider's kind: keys as login and password, ``endpoint_url``,
``region_name``). Parameters: stream, partitions, batch_size (0 publishes
nothing), output_path (a folder, or ``s3a://bucket/prefix``), lake_format
(parquet, delta or iceberg), aws_conn_id (empty: no object store).

Exactly once: one run at a time (``max_active_runs=1``); a retry or clear of
a run reuses the ranges it froze (task state store; before Airflow 3.3 the
stream's cursors) and rewrites the same folders; the commit moves the cursor
only from where the freeze found it.
The next run ingests only what arrived since. The Spark job gets the whole
``liftbridge_default`` connection (brokers, port, TLS, timeouts) as JSON in
the environment variable ``LIFTBRIDGE_CONN_JSON``, and the ``aws`` connection
in ``LIFTBRIDGE_AWS_CONN_JSON``: the job gives S3A, delta-rs and pyiceberg the
same endpoint and keys from it (docs/spark.md, "Object storage"). Both travel
in the environment, masked, never on the command line.

Lineage: publishing reports the stream as an output, freezing as an input,
and the Spark step the stream in and the Parquet lake out (Airflow's hook
lineage; the OpenLineage provider, when installed, emits it). The freeze, the
Spark step and the commit carry the run's offset ranges on the stream's input
(the ``liftbridge_offsets`` dataset facet).
"""

from __future__ import annotations

import random
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

from liftbridge_provider.hooks.liftbridge import LiftbridgeHook, liftbridge_connection_json
from liftbridge_provider.hooks.object_store import aws_connection_json
from liftbridge_provider.operators.commit import LiftbridgeCommitCursorOperator
from liftbridge_provider.operators.publish import LiftbridgePublishOperator
from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator
from liftbridge_provider.operators.streams import LiftbridgeCreateStreamOperator
from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor
from liftbridge_provider.telemetry import report_ingest

PROJECT = Path(__file__).resolve().parents[1]
EVENT_TYPES = ("page_view", "add_to_cart", "purchase", "search")


class IngestSubmitOperator(SparkSubmitOperator):
    """spark-submit of the ingest job that reports its lineage: the stream in, with the frozen ranges the
    job ingests (``ranges``, templated: the freeze task's XCom), and the lake out."""

    template_fields = (*SparkSubmitOperator.template_fields, "ranges")

    def __init__(self, *, ranges: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ranges = ranges

    def execute(self, context: Any) -> Any:
        params = context["params"]
        report_ingest(LiftbridgeHook(), params["stream"], params["output_path"], ranges=self.ranges)
        return super().execute(context)


def generate_events(count: str | int, run_id: str) -> list[dict[str, Any]]:
    """``count`` demo events: keyed by user, with the event type as a header."""
    rng = random.Random(run_id)
    now = datetime.now(UTC).isoformat()
    return [
        {
            "user": f"user-{rng.randrange(100)}",
            "event_type": rng.choice(EVENT_TYPES),
            "amount": round(rng.uniform(1, 200), 2),
            "run_id": run_id,
            "seq": i,
            "at": now,
        }
        for i in range(int(count))
    ]


with DAG(
    "liftbridge_spark_ingest",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # two runs at once would freeze overlapping ranges from the same cursor
    user_defined_macros={
        "liftbridge_connection_json": liftbridge_connection_json,
        "aws_connection_json": aws_connection_json,
    },
    tags=["liftbridge", "example"],
    params={
        "stream": Param("demo-events", type="string"),
        "partitions": Param(3, type="integer", minimum=1),
        "batch_size": Param(1000, type="integer", minimum=0),
        "output_path": Param(str(PROJECT / "out" / "lake"), type="string"),
        # parquet: range folders and a claim ledger; delta: a Delta table at output_path; iceberg: an Iceberg
        # table in an embedded SQLite catalog at output_path (docs/spark.md, "Lake formats")
        "lake_format": Param("parquet", type="string", enum=["parquet", "delta", "iceberg"]),
        # the aws connection of a lake on S3 (output_path s3a://...); empty: no object store
        "aws_conn_id": Param("", type="string"),
    },
    doc_md=__doc__,
):
    create = LiftbridgeCreateStreamOperator(
        task_id="create_stream", stream="{{ params.stream }}", partitions="{{ params.partitions }}"
    )
    publish = LiftbridgePublishOperator(
        task_id="publish_events",
        stream="{{ params.stream }}",
        messages_callable=generate_events,
        messages_callable_kwargs={"count": "{{ params.batch_size }}", "run_id": "{{ run_id }}"},
        key_field="user",
        header_fields=["event_type"],
        ack_policy="all",
    )
    freeze = LiftbridgeOffsetRangesOperator(
        task_id="freeze_ranges", stream="{{ params.stream }}", cursor_id="spark-ingest"
    )
    wait = LiftbridgePartitionOffsetSensor(
        task_id="wait_for_ranges", ranges=freeze.output, deferrable=True, poke_interval=2, timeout=600
    )
    ingest = IngestSubmitOperator(
        task_id="spark_ingest",
        ranges=freeze.output,
        application=str(PROJECT / "spark_jobs" / "ingest.py"),
        conf={"spark.pyspark.python": sys.executable, "spark.ui.enabled": "false"},
        env_vars={
            "LIFTBRIDGE_CONN_JSON": "{{ liftbridge_connection_json('liftbridge_default') }}",
            "LIFTBRIDGE_AWS_CONN_JSON": "{{ aws_connection_json(params.aws_conn_id) }}",
        },
        application_args=[
            "--ranges",
            "{{ ti.xcom_pull(task_ids='freeze_ranges') | tojson }}",
            "--output",
            "{{ params.output_path }}",
            "--format",
            "{{ params.lake_format }}",
        ],
    )
    commit = LiftbridgeCommitCursorOperator(task_id="commit_cursor", ranges=freeze.output)

    create >> publish >> freeze >> wait >> ingest >> commit
