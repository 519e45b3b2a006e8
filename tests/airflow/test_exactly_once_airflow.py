"""Exactly-once on the Airflow side, for real: retries, clears and overlapping runs.

DAGs run with `airflow dags test` (SQLite metadata DB) against a real Liftbridge
node. A clear is Airflow's own `airflow tasks clear`, and the cleared tasks of
the same run are run again with `airflow tasks test <dag> <task> <run_id>`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.devserver import DevServer
from tests.airflow.airflow_runs import connection_env, rerun_tasks, run_dag, stream_name

RETRY = "retries=2, retry_delay=timedelta(0)"


def cursors(client: LiftbridgeClient, cursor_id: str, stream: str, partitions: int) -> list[int]:
    return [client.fetch_cursor(cursor_id, stream, p) for p in range(partitions)]


def test_a_retried_freeze_returns_the_ranges_of_its_first_try(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """A retry after new data arrived must not freeze a bigger range."""
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [b"before"] * 10, partitioner=None)
    body = f"""
        from datetime import timedelta
        from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

        class FreezeThenLoseTheWorker(LiftbridgeOffsetRangesOperator):
            def execute(self, context):
                document = super().execute(context)
                if context["ti"].try_number == 1:
                    LiftbridgeHook().get_conn().publish_batch({stream!r}, [b"late"] * 7, partitioner=None)
                    raise RuntimeError("the worker was lost after the ranges were frozen")
                return document

        FreezeThenLoseTheWorker(task_id="freeze", stream={stream!r}, cursor_id="ingest", {RETRY})
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-4000:]
    assert run.tries["freeze"] == 2, "the first try failed, the second one succeeded"
    assert client.fetch_partition_metadata(stream, 0).high_watermark == 16, "the late messages are there"
    assert run.xcom["freeze"]["ranges"] == [{"partition": 0, "start": 0, "end": 10}]
    assert "reusing the ranges frozen earlier in this run" in run.output


def test_a_cleared_run_after_a_failed_commit_ingests_the_same_ranges_once(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """Clearing a run whose commit failed re-ingests the same frozen ranges, not bigger ones.

    The ingest task writes one folder per range, overwritten on a rerun (as spark_jobs/ingest.py does);
    a re-frozen bigger range would add a second folder holding the same offsets again.
    """
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(stream, [PublishMessage(b"first", partition=i % 2) for i in range(20)])
    lake = tmp_path / "lake"
    body = f"""
        import json, pathlib
        from airflow.sdk.exceptions import AirflowException
        from liftbridge_provider.client import partition_by_round_robin
        from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

        @task
        def ingest(document):
            client = LiftbridgeHook().get_conn()
            for r in document["ranges"]:
                p, start, end = r["partition"], r["start"], r["end"]
                folder = pathlib.Path({str(lake)!r}) / f"partition={{p}}" / f"range={{start}}-{{end}}"
                folder.mkdir(parents=True, exist_ok=True)
                offsets = [m.offset for m in client.read_range(document["stream"], p, start, end)]
                (folder / "offsets.json").write_text(json.dumps(offsets))

        @task
        def fail_once_before_the_commit():
            marker = pathlib.Path({str(tmp_path / "commit-failed-once")!r})
            if not marker.exists():
                marker.touch()
                LiftbridgeHook().get_conn().publish_batch(
                    {stream!r}, [b"arrived after the freeze"] * 10, partitioner=partition_by_round_robin()
                )
                raise AirflowException("a failure between the ingest and the commit (first try only)")

        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="lake")
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output)
        ingest(freeze.output) >> fail_once_before_the_commit() >> commit
    """
    env = connection_env(liftbridge_server)
    run = run_dag(airflow_home, body, env)
    assert run.states["fail_once_before_the_commit"] == "failed", run.output[-4000:]
    assert run.states["commit"] == "upstream_failed"
    assert cursors(client, "lake", stream, 2) == [-1, -1]

    run = rerun_tasks(run, ["freeze", "ingest", "fail_once_before_the_commit", "commit"], env)
    assert run.ok(), (run.states, run.output[-6000:])
    assert run.xcom["freeze"]["ranges"] == [
        {"partition": 0, "start": 0, "end": 10},
        {"partition": 1, "start": 0, "end": 10},
    ], "the cleared freeze handed out the ranges it froze the first time"
    folders = sorted(str(p.relative_to(lake)) for p in lake.glob("partition=*/range=*"))
    assert folders == ["partition=0/range=0-10", "partition=1/range=0-10"]
    written = Counter(
        (file.parent.parent.name, offset)
        for file in lake.glob("partition=*/range=*/offsets.json")
        for offset in json.loads(file.read_text())
    )
    assert max(written.values()) == 1, "an offset was written twice"
    assert cursors(client, "lake", stream, 2) == [9, 9]
    # The next run takes the messages that arrived meanwhile.
    freeze_only = f"LiftbridgeOffsetRangesOperator(task_id='freeze', stream={stream!r}, cursor_id='lake')"
    nxt = run_dag(airflow_home, freeze_only, env)
    assert nxt.xcom["freeze"]["ranges"] == [
        {"partition": 0, "start": 10, "end": 15},
        {"partition": 1, "start": 10, "end": 15},
    ]


def test_a_commit_after_someone_else_moved_the_cursor_fails_loudly(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """The commit is a compare-and-set; another writer's cursor move fails it, without retries."""
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [b"m"] * 12, partitioner=None)
    body = f"""
        from datetime import timedelta
        from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

        @task
        def someone_else_commits():
            LiftbridgeHook().get_conn().set_cursor("ingest", {stream!r}, 0, 4)

        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="ingest")
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output, {RETRY})
        freeze >> someone_else_commits() >> commit
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states["commit"] == "failed", run.output[-4000:]
    assert run.tries["commit"] == 1, "a moved cursor is not retried"
    assert client.fetch_cursor("ingest", stream, 0) == 4, "the other writer's cursor is left alone"
    assert (
        f"cursor 'ingest' of stream '{stream}' partition 0 is at 4, expected -1 (before the range [0, 12)) "
        "or 11 (already committed)"
    ) in run.output


def test_a_repeated_commit_is_a_no_op(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Committing the same ranges again succeeds and changes nothing."""
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(stream, [PublishMessage(b"m", partition=0)] * 5)
    body = f"""
        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="ingest")
        first = LiftbridgeCommitCursorOperator(task_id="first", ranges=freeze.output)
        again = LiftbridgeCommitCursorOperator(task_id="again", ranges=freeze.output)
        freeze >> first >> again
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-4000:]
    assert run.xcom["first"] == run.xcom["again"] == {"0": 4, "1": -1}
    assert cursors(client, "ingest", stream, 2) == [4, -1]
    assert "partition 0: cursor 'ingest' is already at 4 (committed before)" in run.output


def test_overlapping_runs_cannot_move_the_cursor_backwards_or_past_unwritten_data(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Two runs froze overlapping ranges from the same cursor; only the first commit wins.

    Each freeze/commit pair stands for one run's tasks, interleaved as two concurrent runs (or a
    re-run after a failed commit) would be: run A froze [0, 10), then run B froze [0, 15).
    """
    env = connection_env(liftbridge_server)
    orders = (("b_then_a", "commit_b", "commit_a", 14), ("a_then_b", "commit_a", "commit_b", 9))
    for order, winner, loser, kept in orders:
        stream = stream_name()
        client.create_stream(stream, stream)
        client.publish_batch(stream, [b"first"] * 10, partitioner=None)
        body = f"""
            from datetime import timedelta
            from liftbridge_provider.hooks.liftbridge import LiftbridgeHook

            @task
            def more_data():
                LiftbridgeHook().get_conn().publish_batch({stream!r}, [b"more"] * 5, partitioner=None)

            freeze_a = LiftbridgeOffsetRangesOperator(task_id="freeze_a", stream={stream!r}, cursor_id="ingest")
            freeze_b = LiftbridgeOffsetRangesOperator(task_id="freeze_b", stream={stream!r}, cursor_id="ingest")
            commit_a = LiftbridgeCommitCursorOperator(task_id="commit_a", ranges=freeze_a.output, {RETRY})
            commit_b = LiftbridgeCommitCursorOperator(task_id="commit_b", ranges=freeze_b.output, {RETRY})
            freeze_a >> more_data() >> freeze_b >> {winner} >> {loser}
        """
        run = run_dag(airflow_home, body, env, dag_id=f"overlap_{order}_{stream.replace('-', '_')}")
        assert run.xcom["freeze_a"]["ranges"] == [{"partition": 0, "start": 0, "end": 10}]
        assert run.xcom["freeze_b"]["ranges"] == [{"partition": 0, "start": 0, "end": 15}]
        assert run.states[winner] == "success", (order, run.output[-4000:])
        assert run.states[loser] == "failed", (order, run.states)
        assert run.tries[loser] == 1, order
        assert client.fetch_cursor("ingest", stream, 0) == kept, order
        assert "someone else moved it" in run.output


def test_example_dag_runs_one_at_a_time_and_hands_spark_the_whole_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One run at a time (max_active_runs=1), and the Spark job gets the port and TLS settings too.

    `{{ conn.liftbridge_default.host }}` dropped the connection's port field and its extras. The DAG file
    is parsed by Airflow's DagBag and the spark task's env_vars rendered with the DAG's template
    environment; the connection comes from AIRFLOW_CONN_LIFTBRIDGE_DEFAULT through the SDK.
    """
    from airflow.dag_processing.dagbag import DagBag  # noqa: PLC0415 - after AIRFLOW_HOME is set
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator  # noqa: PLC0415
    from airflow.sdk._shared.secrets_masker import redact  # noqa: PLC0415

    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
    connection = {
        "conn_type": "liftbridge",
        "host": "broker1,broker2:9393",
        "port": 9494,
        "extra": {"tls_ca_cert": "/etc/liftbridge/ca.pem", "tls_private_key": key, "request_timeout": 7},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LIFTBRIDGE_DEFAULT", json.dumps(connection))
    dag_file = Path(__file__).resolve().parents[2] / "dags" / "liftbridge_spark_ingest.py"
    bag = DagBag(dag_folder=str(dag_file))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["liftbridge_spark_ingest"]
    assert dag.max_active_runs == 1
    task = dag.get_task("spark_ingest")
    assert isinstance(task, SparkSubmitOperator)
    aws = {"conn_type": "aws", "login": "AKIDLAKE", "password": "lake-secret-0c1d", "extra": {"region_name": "eu-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_LAKE", json.dumps(aws))
    context: Any = {"params": {"aws_conn_id": "aws_lake"}}
    rendered = task.render_template(task.env_vars, context, jinja_env=dag.get_template_env())
    assert json.loads(rendered["LIFTBRIDGE_CONN_JSON"]) == connection
    assert json.loads(rendered["LIFTBRIDGE_AWS_CONN_JSON"]) == aws, "the object store's connection, for S3A and all"
    assert redact(rendered) == {"LIFTBRIDGE_CONN_JSON": "***", "LIFTBRIDGE_AWS_CONN_JSON": "***"}, (
        "neither the private key nor the object store's secret may reach stored rendered fields"
    )
    assert redact("the secret lake-secret-0c1d in a log line") == "the secret *** in a log line"
    assert "lake-secret-0c1d" not in " ".join(map(str, task.application_args or [])), "nor the command line"
    context["params"]["aws_conn_id"] = ""
    no_store = task.render_template(task.env_vars, context, jinja_env=dag.get_template_env())
    assert no_store["LIFTBRIDGE_AWS_CONN_JSON"] == "", "no aws_conn_id: no object store"
