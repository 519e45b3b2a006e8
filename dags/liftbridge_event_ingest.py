"""Event-driven ingestion: batches landing in a Liftbridge stream start DAG runs; Spark ingests each batch.

A watcher in the triggerer follows the stream and fires an asset event per
batch (at least ``max_messages`` offsets, or ``max_wait`` seconds after the
first one arrived). The event carries the batch's frozen offset ranges, and
the watcher's cursor moves past them only after Airflow stored the event.
Each DAG run submits ``spark_jobs/ingest.py`` once per batch it was given
(Airflow may hand a run several events), side by side. The lake's claim
ledger lands every offset once whatever order the batches finish in, so a
batch delivered twice (possible only for the batch in flight when a triggerer
crashes) writes nothing the second time. A batch that finishes while an
earlier one has not claimed its offsets yet sees them as a gap and fails;
its retry passes once the earlier batch landed.

Settings (environment): ``LIFTBRIDGE_EVENTS_STREAM`` (default ``demo-events``),
``LIFTBRIDGE_EVENTS_OUTPUT`` (default ``out/events-lake`` in the project),
``LIFTBRIDGE_ASSET_BROKER`` (only names the asset; default ``127.0.0.1:9292``).
Connections: ``liftbridge_default`` and ``spark_default``.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.hooks.liftbridge import liftbridge_connection_json

PROJECT = Path(__file__).resolve().parents[1]
STREAM = os.environ.get("LIFTBRIDGE_EVENTS_STREAM", "demo-events")
OUTPUT = os.environ.get("LIFTBRIDGE_EVENTS_OUTPUT", str(PROJECT / "out" / "events-lake"))
BROKER = os.environ.get("LIFTBRIDGE_ASSET_BROKER", "127.0.0.1:9292")

event_batches = Asset(
    name="liftbridge_event_batches",
    uri=f"liftbridge://{BROKER}/{STREAM}",
    watchers=[
        AssetWatcher(
            name="liftbridge_event_batches",
            trigger=MessageQueueTrigger(
                scheme="liftbridge", stream=STREAM, mode="batch", max_messages=500, max_wait=10, poll_interval=1
            ),
        )
    ],
)


with DAG(
    "liftbridge_event_ingest",
    schedule=[event_batches],
    catchup=False,
    max_active_runs=1,
    user_defined_macros={"liftbridge_connection_json": liftbridge_connection_json},
    tags=["liftbridge", "example", "event-driven"],
    doc_md=__doc__,
):

    @task
    def spark_arguments(triggering_asset_events: Any = None) -> list[list[str]]:
        """One ``spark_jobs/ingest.py`` argument list per batch event of this run."""
        documents = [RangesDocument.parse(event.extra["payload"]) for event in triggering_asset_events[event_batches]]
        print(f"{len(documents)} batch(es): {[d.metadata.get('batch') for d in documents]}")
        return [["--ranges", document.dumps(), "--output", OUTPUT] for document in documents]

    SparkSubmitOperator.partial(
        task_id="spark_ingest",
        retries=2,  # a gap left by an earlier batch still being written closes by the retry
        retry_delay=timedelta(seconds=20),
        application=str(PROJECT / "spark_jobs" / "ingest.py"),
        conf={"spark.pyspark.python": sys.executable, "spark.ui.enabled": "false"},
        # the whole liftbridge_default connection (brokers, port, TLS), not only its host
        env_vars={"LIFTBRIDGE_CONN_JSON": "{{ liftbridge_connection_json('liftbridge_default') }}"},
    ).expand(application_args=spark_arguments())
