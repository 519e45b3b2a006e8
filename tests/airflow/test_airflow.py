"""The Airflow faces for real: DAGs run by `airflow dags test` against a real Liftbridge node.

Airflow's home (from tests/conftest.py) holds a SQLite metadata DB, migrated once
per session by the ``airflow_home`` fixture (conftest.py); each test writes its
DAG file into the home's dags folder, runs the real CLI, then reads the XComs
from the metadata DB and the stream's real state (``run_dag`` and the other
helpers the Airflow tests share are in tests/airflow/airflow_runs.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, PublishMessage, partition_by_key
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from tests.airflow.airflow_runs import AIRFLOW, connection_env, run_dag, stream_name, write_marked_sensors
from tests.tls_certs import write_ca, write_server_cert


def test_ingest_flow_create_publish_freeze_wait_commit(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    body = f"""
        create = LiftbridgeCreateStreamOperator(task_id="create", stream={stream!r}, partitions=3)
        publish = LiftbridgePublishOperator(
            task_id="publish", stream={stream!r},
            messages=[{{"user": f"u{{i % 7}}", "n": i, "trace": f"t{{i}}"}} for i in range(40)],
            key_field="user", header_fields=["trace"], ack_policy="all",
        )
        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="ingest")
        wait = LiftbridgePartitionOffsetSensor(
            task_id="wait", ranges=freeze.output, deferrable=True, poke_interval=1, timeout=60
        )
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output)
        create >> publish >> freeze >> wait >> commit
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server), dag_id=f"ingest_{stream.replace('-', '_')}")
    assert run.ok(), run.output[-4000:]
    assert sorted(run.xcom["create"]["partitions"]) == ["0", "1", "2"]
    published = run.xcom["publish"]
    assert published["count"] == 40
    high_watermarks = {p: client.fetch_partition_metadata(stream, p).high_watermark for p in range(3)}
    for partition, summary in published["partitions"].items():
        assert summary["first_offset"] == 0
        assert summary["last_offset"] == high_watermarks[int(partition)]
        assert summary["count"] == high_watermarks[int(partition)] + 1
    ranges = run.xcom["freeze"]
    assert ranges["stream"] == stream
    assert ranges["cursor_id"] == "ingest"
    assert ranges["ranges"] == [{"partition": p, "start": 0, "end": high_watermarks[p] + 1} for p in range(3)]
    assert run.xcom["commit"] == {str(p): hw for p, hw in high_watermarks.items()}
    assert {p: client.fetch_cursor("ingest", stream, p) for p in range(3)} == high_watermarks
    read = {p: list(client.read_range(stream, p, 0, high_watermarks[p] + 1)) for p in range(3)}
    assert sum(len(messages) for messages in read.values()) == 40
    for partition, messages in read.items():
        assert all(partition_by_key(stream, m.key, b"", 3) == partition for m in messages), "partitioned by key"
        assert all(m.headers["trace"].startswith(b"t") for m in messages)

    # A second run with nothing new: empty ranges, cursors unchanged.
    run2 = run_dag(airflow_home, body, connection_env(liftbridge_server), dag_id=run.dag_id)
    assert run2.ok(), run2.output[-4000:]
    # (the second run published 40 more, so its ranges start where the first one's ended)
    starts = [r["start"] for r in run2.xcom["freeze"]["ranges"]]
    assert starts == [high_watermarks[p] + 1 for p in range(3)]
    assert sum(r["end"] - r["start"] for r in run2.xcom["freeze"]["ranges"]) == 40


def test_deferred_sensor_waits_for_messages_published_later(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    marker = tmp_path / "sensor-deferred"
    write_marked_sensors(airflow_home)

    def publish_after_the_sensor_deferred() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        client.publish_batch(stream, [PublishMessage(b"x", partition=p) for p in (0, 1) * 6])

    publisher = threading.Thread(target=publish_after_the_sensor_deferred)
    publisher.start()
    body = f"""
        from marked_sensors import MarkedOffsetSensor

        wait = MarkedOffsetSensor(
            task_id="wait", stream={stream!r}, target_offset=5, deferrable=True, poke_interval=1, timeout=120,
            marker={str(marker)!r},
        )
        poke = LiftbridgePartitionOffsetSensor(
            task_id="poke", stream={stream!r}, target_offsets={{"1": 5}}, deferrable=False, poke_interval=1,
            timeout=60, mode="poke",
        )
        wait >> poke
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    publisher.join()
    assert run.ok(), run.output[-4000:]
    # Only the trigger's event reaches execute_complete, which returns it: the sensor deferred.
    assert run.xcom["wait"] == {"status": "success", "high_watermarks": {"0": 5, "1": 5}}
    assert run.xcom.get("poke") is None


def test_sensor_timeout_fails_the_task(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream)
    body = f"""
        LiftbridgePartitionOffsetSensor(
            task_id="wait", stream={stream!r}, target_offset=3, deferrable=True, poke_interval=1, timeout=3
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states["wait"] == "failed", run.output[-3000:]


def test_admin_operators(airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient) -> None:
    stream = stream_name()
    body = f"""
        create = LiftbridgeCreateStreamOperator(
            task_id="create", stream={stream!r}, subject="admin.{stream}", partitions=2,
            retention_max_age=3600, optimistic_concurrency_control=True,
        )
        again = LiftbridgeCreateStreamOperator(task_id="again", stream={stream!r}, partitions=2)
        pause = LiftbridgePauseStreamOperator(task_id="pause", stream={stream!r}, partitions=[0])
        readonly = LiftbridgeSetStreamReadonlyOperator(task_id="readonly", stream={stream!r}, partitions=[1])
        create >> again >> pause >> readonly
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-4000:]
    assert run.xcom["create"]["subject"] == f"admin.{stream}"
    assert run.xcom["again"] == run.xcom["create"], "if_exists='ignore' returns the existing stream"
    partitions = client.fetch_metadata([stream]).stream(stream).partitions
    assert partitions[0].paused
    assert partitions[1].readonly

    body = f"""
        exists = LiftbridgeCreateStreamOperator(task_id="exists", stream={stream!r}, if_exists="fail")
        delete = LiftbridgeDeleteStreamOperator(task_id="delete", stream={stream!r}, trigger_rule="all_done")
        missing = LiftbridgeDeleteStreamOperator(task_id="missing", stream={stream!r}, if_missing="fail")
        exists >> delete >> missing
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"exists": "failed", "delete": "success", "missing": "failed"}
    assert f"stream '{stream}' already exists (if_exists='fail')" in run.output
    assert f"there is no stream '{stream}' (if_missing='fail')" in run.output
    assert run.xcom["delete"] is True
    assert stream not in client.fetch_metadata().streams


@pytest.mark.parametrize("transport", ["grpc", "nats"])
def test_publish_sources_and_failures(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path, transport: str
) -> None:
    """The publish operator over gRPC, and over NATS when the connection names NATS servers: the same results."""
    nats = {"nats_servers": ",".join(liftbridge_server.nats_servers)} if transport == "nats" else {}
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    jsonl = tmp_path / "records.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "body": f"line {i}"}) + "\n" for i in range(5)))
    (airflow_home / "dags" / "lbtest_records.py").write_text(
        "def make(count):\n    return [f'generated {i}'.encode() for i in range(count)]\n"
    )
    readonly = stream_name()
    client.create_stream(readonly, readonly)
    client.set_stream_readonly(readonly)
    body = f"""
        @task
        def upstream():
            return ["from xcom 1", "from xcom 2"]

        LiftbridgePublishOperator(task_id="iterable", stream={stream!r}, messages=[b"a", "b"], partitioner=None)
        LiftbridgePublishOperator(task_id="xcom", stream={stream!r}, messages=upstream(), partitioner="round_robin")
        LiftbridgePublishOperator(
            task_id="callable", stream={stream!r}, messages_callable="lbtest_records.make",
            messages_callable_kwargs={{"count": 3}}, partitioner=None,
        )
        LiftbridgePublishOperator(
            task_id="jsonl", stream={stream!r}, jsonl_path={str(jsonl)!r}, key_field="id", value_field="body"
        )
        LiftbridgePublishOperator(task_id="rejected", stream={readonly!r}, messages=[b"1", b"2", b"3"])
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server, **nats))
    assert {k: v for k, v in run.states.items() if k != "rejected"} == dict.fromkeys(
        ["upstream", "iterable", "xcom", "callable", "jsonl"], "success"
    ), run.output[-4000:]
    assert run.xcom["iterable"]["partitions"]["0"]["count"] == 2
    assert list(run.xcom["iterable"]["partitions"]) == ["0"], "no partitioner: partition 0"
    assert sum(p["count"] for p in run.xcom["xcom"]["partitions"].values()) == 2
    assert sorted(run.xcom["xcom"]["partitions"]) == ["0", "1"]
    assert run.xcom["callable"]["count"] == 3
    assert run.xcom["jsonl"]["count"] == 5
    values = {
        m.value
        for p in (0, 1)
        for m in client.read_range(stream, p, 0, client.fetch_partition_metadata(stream, p).high_watermark + 1)
    }
    assert {b"a", b"b", b"from xcom 1", b"generated 2", b"line 4"} <= values
    assert run.states["rejected"] == "failed"
    assert "3 of 3 messages failed" in run.output
    assert "record #0: ReadonlyPartitionError" in run.output


def test_bad_input_fails_tasks_with_clear_messages(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    body = f"""
        LiftbridgeOffsetRangesOperator(task_id="missing_stream", stream="no-such-stream", start="earliest")
        LiftbridgeOffsetRangesOperator(task_id="unknown_partition", stream={stream!r}, start="earliest", partitions=[9])
        LiftbridgeOffsetRangesOperator(
            task_id="reversed", stream={stream!r}, partitions=[0], start={{"0": 5}}, end={{"0": 2}}
        )
        LiftbridgeOffsetRangesOperator(task_id="negative", stream={stream!r}, start={{"0": -1}}, partitions=[0])
        LiftbridgeCommitCursorOperator(task_id="bad_ranges", ranges='{{"stream": "s", "ranges": [{{"partition": 0}}]}}')
        LiftbridgePartitionOffsetSensor(task_id="bad_target", stream={stream!r}, target_offset=-4, timeout=5)
        LiftbridgePublishOperator(task_id="bad_partition", stream={stream!r}, messages=[b"x"], partitioner=None,
                                  messages_callable_kwargs={{}}, batch_size=1, window=0)
        # a start naming a partition the stream lacks watched nothing, and the sensor waited for its timeout
        LiftbridgeMessageSensor(task_id="start_elsewhere", stream={stream!r}, apply_function="builtins.len",
                                start={{"5": 0}}, timeout=600)
        LiftbridgeMessageSensor(task_id="start_uncovered", stream={stream!r}, apply_function="builtins.len",
                                partitions=[0, 1], start={{"0": 0}}, timeout=600)
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert set(run.states.values()) == {"failed"}, run.states
    expected = [
        "no stream named 'no-such-stream'",
        f"no partition 9: stream '{stream}' has partitions 0-1",
        "partition 0: end 2 is before start 5",
        "start offset of partition 0 must be a whole number >= 0, got -1",
        "each range must be {'partition', 'start', 'end'}",
        "target_offset must be a whole number >= 0, got -4",
        "window must be a whole number >= 1, got 0",
        f"no partition 5: stream '{stream}' has partitions 0-1",
        f"start gives no offset for partition(s) [1] of '{stream}'",
    ]
    for message in expected:
        assert message in run.output, message


def test_bad_connection_and_bad_ack_policy(airflow_home: Path, liftbridge_server: DevServer) -> None:
    body = """
        LiftbridgeOffsetRangesOperator(task_id="freeze", stream="s", start="earliest")
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server, request_timeout="soon"))
    assert run.states == {"freeze": "failed"}
    assert (
        "connection 'liftbridge_default': connection extra request_timeout must be a number, got 'soon'" in run.output
    )
    run = run_dag(
        airflow_home, 'LiftbridgePublishOperator(task_id="p", stream="s", messages=[b"x"], ack_policy="most")\n', {}
    )
    assert run.returncode != 0
    assert "unknown ack policy 'most'; allowed: leader, all, none" in run.output


def test_hook_hands_out_one_pooled_client_per_process(airflow_home: Path, liftbridge_server: DevServer) -> None:
    body = """
        @task
        def first():
            import os
            from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
            client = LiftbridgeHook().get_conn()
            client.fetch_metadata()
            return [os.getpid(), id(client)]

        @task
        def second(previous):
            import os
            from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
            return [os.getpid(), id(LiftbridgeHook().get_conn()), previous]

        second(first())
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-3000:]
    pid, client_id, previous = run.xcom["second"]
    assert previous == [pid, client_id], "the second task reused the first task's client"


def test_connection_test_success_and_failures(
    liftbridge_server: DevServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def check(env: dict[str, str]) -> tuple[bool, str]:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return LiftbridgeHook().test_connection()

    ok, message = check(connection_env(liftbridge_server))
    assert ok, message
    assert "Connected: 1 broker(s)" in message
    with start_single() as stopped:
        env = connection_env(stopped, request_timeout=2)
    ok, message = check(env)
    assert not ok
    assert f"Cannot reach any broker at {stopped.brokers[0]}" in message
    ok, message = check(connection_env(liftbridge_server, request_timeout=2) | {})
    assert ok
    wrong_port = {
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(
            {"conn_type": "liftbridge", "host": "127.0.0.1", "port": 1, "extra": {"request_timeout": 2}}
        )
    }
    ok, message = check(wrong_port)
    assert not ok
    assert "Cannot reach any broker at 127.0.0.1:1" in message
    nats_url = liftbridge_server.nats_servers[0]
    ok, message = check(connection_env(liftbridge_server, nats_servers=nats_url))
    assert ok, message
    assert f"NATS {nats_url} (max_payload 1048576 bytes)" in message
    ok, message = check(connection_env(liftbridge_server, nats_servers="127.0.0.1:1"))
    assert not ok
    assert "but NATS (nats_servers) failed: cannot connect to NATS ['nats://127.0.0.1:1']" in message

    ca = write_ca(tmp_path)
    server_cert = write_server_cert(tmp_path, ca)
    tls = {"tls.cert": str(server_cert.cert_path), "tls.key": str(server_cert.key_path)}
    with start_single(extra_config=tls, credentials=_credentials(ca.cert_pem)) as tls_server:
        ok, message = check(connection_env(tls_server, request_timeout=3))
        assert not ok
        assert "does the server require TLS?" in message
        other_ca = write_ca(tmp_path / "other")
        ok, message = check(connection_env(tls_server, request_timeout=3, tls_ca_cert=str(other_ca.cert_path)))
        assert not ok
        assert "TLS handshake with" in message
        ok, message = check(connection_env(tls_server, tls_ca_cert=str(ca.cert_path)))
        assert ok, message


def _credentials(ca_pem: bytes) -> Any:
    import grpc  # noqa: PLC0415

    return grpc.ssl_channel_credentials(root_certificates=ca_pem)


def test_providers_cli_lists_the_provider_and_connection_type(airflow_home: Path) -> None:
    providers = subprocess.run([AIRFLOW, "providers", "list"], capture_output=True, text=True, timeout=120, check=False)
    assert providers.returncode == 0, providers.stderr[-2000:]
    assert "airflow-provider-liftbridge" in providers.stdout
    hooks = subprocess.run([AIRFLOW, "providers", "hooks"], capture_output=True, text=True, timeout=120, check=False)
    assert hooks.returncode == 0, hooks.stderr[-2000:]
    assert "liftbridge" in hooks.stdout
    assert "liftbridge_provider.hooks.liftbridge.LiftbridgeHook" in hooks.stdout


def test_freeze_refuses_or_skips_when_retention_removed_the_start(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, retention_max_messages=5, segment_max_bytes=256, cleaner_interval=0.2)
    client.publish_batch(stream, [f"m{i}".encode() * 20 for i in range(40)], ack_policy="all")
    time.sleep(2)  # let the cleaner remove old segments before anything reads them
    earliest = client.earliest_offset(stream)
    assert earliest is not None
    assert earliest > 0
    body = f"""
        LiftbridgeOffsetRangesOperator(task_id="strict", stream={stream!r}, cursor_id="never-set")
        LiftbridgeOffsetRangesOperator(task_id="lenient", stream={stream!r}, cursor_id="never-set", on_data_loss="skip")
        LiftbridgeOffsetRangesOperator(
            task_id="capped", stream={stream!r}, start="earliest", end={{"0": 40}}, max_messages_per_partition=2
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"strict": "failed", "lenient": "success", "capped": "success"}, run.output[-3000:]
    assert f"partition 0: offsets 0-{earliest - 1} were already removed by retention" in run.output
    assert run.xcom["lenient"]["ranges"] == [{"partition": 0, "start": earliest, "end": 40}]
    assert run.xcom["capped"]["ranges"] == [{"partition": 0, "start": earliest, "end": min(40, earliest + 2)}]


def test_spark_submit_operator_runs_the_ingest_job_between_freeze_and_commit(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(
        stream, [PublishMessage(f"e{i}".encode(), partition=i % 2) for i in range(50)], ack_policy="all"
    )
    output = tmp_path / "lake"
    ingest = Path(__file__).resolve().parents[2] / "spark_jobs" / "ingest.py"
    body = f"""
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="lake")
        wait = LiftbridgePartitionOffsetSensor(task_id="wait", ranges=freeze.output, poke_interval=1, timeout=60)
        spark = SparkSubmitOperator(
            task_id="ingest",
            application={str(ingest)!r},
            conf={{"spark.pyspark.python": {sys.executable!r}, "spark.ui.enabled": "false"}},
            application_args=[
                "--brokers", {",".join(liftbridge_server.brokers)!r},
                "--ranges", "{{{{ ti.xcom_pull(task_ids='freeze') | tojson }}}}",
                "--output", {str(output)!r},
            ],
        )
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output)
        freeze >> wait >> spark >> commit
    """
    env = connection_env(liftbridge_server) | {
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    run = run_dag(airflow_home, body, env)
    assert run.ok(), run.output[-4000:]
    folders = sorted(str(p.relative_to(output)) for p in output.glob("stream=*/partition=*/range=*"))
    assert folders == [f"stream={stream}/partition=0/range=0-25", f"stream={stream}/partition=1/range=0-25"]
    assert run.xcom["commit"] == {"0": 24, "1": 24}
    assert [client.fetch_cursor("lake", stream, p) for p in (0, 1)] == [24, 24]


# -- paused partitions, compacted streams, bad input ----------------------------------------------


def wait_until_paused(client: LiftbridgeClient, stream: str, partitions: list[int], timeout: float = 30) -> None:
    """Until the stream's metadata says every partition in ``partitions`` is paused (auto_pause_time passed)."""
    deadline = time.monotonic() + timeout
    while not all(client.fetch_metadata([stream]).stream(stream).partitions[p].paused for p in partitions):
        assert time.monotonic() < deadline, f"{stream} partitions {partitions} did not pause within {timeout:g}s"
        time.sleep(0.2)


def is_paused(client: LiftbridgeClient, stream: str, partition: int) -> bool:
    return client.fetch_metadata([stream]).stream(stream).partitions[partition].paused


def test_freeze_and_poke_on_auto_paused_partitions(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Idle partitions auto-pause; freezing them must work, resuming only a non-empty range."""
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2, auto_pause_time=1)
    client.publish_batch(stream, [PublishMessage(b"m", partition=p) for p in (0, 1) * 4], ack_policy="all")
    client.set_cursor("ingest", stream, 0, 3)  # partition 0 has nothing new: its range is empty
    wait_until_paused(client, stream, [0, 1])
    body = f"""
        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="ingest")
        poke = LiftbridgePartitionOffsetSensor(
            task_id="poke", ranges=freeze.output, deferrable=False, mode="poke", poke_interval=1, timeout=30
        )
        freeze >> poke
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-4000:]
    assert run.xcom["freeze"]["ranges"] == [
        {"partition": 0, "start": 4, "end": 4},
        {"partition": 1, "start": 0, "end": 4},
    ]
    assert is_paused(client, stream, 0), "an empty range must not resume its partition"


def test_deferred_sensor_waits_on_an_auto_paused_partition(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """The trigger polls a paused partition until a publish resumes it and reaches the target."""
    stream = stream_name()
    client.create_stream(stream, stream, auto_pause_time=1)
    client.publish_batch(stream, [b"m"] * 3, partitioner=None, ack_policy="all")
    wait_until_paused(client, stream, [0])
    marker = tmp_path / "sensor-deferred"
    write_marked_sensors(airflow_home)

    def publish_once_the_trigger_polled_the_paused_partition() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(8)  # the trigger polls the paused partition for longer than a request may take (2 s)
        client.publish_batch(stream, [b"late"] * 3, partitioner=None)

    publisher = threading.Thread(target=publish_once_the_trigger_polled_the_paused_partition)
    publisher.start()
    body = f"""
        from marked_sensors import MarkedOffsetSensor

        MarkedOffsetSensor(
            task_id="wait", stream={stream!r}, target_offset=5, deferrable=True, poke_interval=1, timeout=60,
            marker={str(marker)!r},
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server, request_timeout=2))
    publisher.join()
    assert run.ok(), run.output[-4000:]
    assert run.xcom["wait"] == {"status": "success", "high_watermarks": {"0": 5}}


def test_freeze_on_a_compacted_stream_reports_no_loss(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Compaction removing a stream's head is not retention loss when compacted=True."""
    stream = stream_name()
    client.create_stream(stream, stream, compact_enabled=True, segment_max_bytes=256, cleaner_interval=0.2)
    client.publish_batch(
        stream, [PublishMessage(b"v" * 30, key=f"k{i % 2}".encode()) for i in range(40)], ack_policy="all"
    )
    deadline = time.monotonic() + 30
    while (client.earliest_offset(stream) or 0) == 0:
        assert time.monotonic() < deadline, "compaction did not remove the head within 30 s"
        time.sleep(0.5)
    earliest = client.earliest_offset(stream)
    assert earliest is not None
    body = f"""
        LiftbridgeOffsetRangesOperator(task_id="plain", stream={stream!r}, cursor_id="ingest")
        LiftbridgeOffsetRangesOperator(task_id="compacted", stream={stream!r}, cursor_id="ingest", compacted=True)
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"plain": "failed", "compacted": "success"}, run.output[-4000:]
    assert run.xcom["compacted"]["ranges"] == [{"partition": 0, "start": 0, "end": 40}]
    assert f"partition 0: offsets 0-{earliest - 1} were already removed by retention" in run.output
    assert f"partition 0: {earliest} offset(s) at the head (0-{earliest - 1}) are gone" in run.output


def test_missing_streams_and_partitions_fail_without_retries(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """Bad input: a missing stream or partition fails every operator and the sensor without retries."""
    stream, missing, deleted = stream_name(), stream_name(), stream_name()
    client.create_stream(stream, stream)
    client.create_stream(deleted, deleted)
    cursors_before = _cursor_writes(client)
    marker = tmp_path / "sensor-deferred"
    write_marked_sensors(airflow_home)

    def delete_once_the_sensor_deferred() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(4)  # the trigger polls the stream a few times first
        client.delete_stream(deleted)

    deleter = threading.Thread(target=delete_once_the_sensor_deferred)
    deleter.start()
    ranges = {"stream": missing, "cursor_id": "c", "ranges": [{"partition": 0, "start": 0, "end": 5}]}
    no_partition = {"stream": stream, "cursor_id": "c", "ranges": [{"partition": 3, "start": 0, "end": 5}]}
    body = f"""
        from datetime import timedelta
        from marked_sensors import MarkedOffsetSensor
        retry = dict(retries=2, retry_delay=timedelta(0))

        LiftbridgeOffsetRangesOperator(task_id="freeze", stream={missing!r}, cursor_id="c", **retry)
        LiftbridgeCommitCursorOperator(task_id="commit", ranges={ranges!r}, **retry)
        LiftbridgeCommitCursorOperator(task_id="commit_partition", ranges={no_partition!r}, **retry)
        LiftbridgePublishOperator(task_id="publish", stream={missing!r}, messages=[b"x"], **retry)
        LiftbridgePauseStreamOperator(task_id="pause", stream={missing!r}, **retry)
        LiftbridgeSetStreamReadonlyOperator(task_id="readonly", stream={missing!r}, **retry)
        LiftbridgePartitionOffsetSensor(
            task_id="poke", stream={missing!r}, target_offset=1, mode="poke", poke_interval=1, timeout=20, **retry
        )
        LiftbridgePartitionOffsetSensor(
            task_id="poke_partition", stream={stream!r}, target_offsets={{"4": 1}}, mode="poke", poke_interval=1,
            timeout=20, **retry
        )
        MarkedOffsetSensor(
            task_id="deferred", stream={deleted!r}, target_offset=1, deferrable=True, poke_interval=1, timeout=60,
            marker={str(marker)!r}, **retry
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    deleter.join()
    failed = run.states
    assert len(failed) == 9, failed
    assert set(failed.values()) == {"failed"}, (failed, run.output[-4000:])
    assert {task: run.tries[task] for task in failed} == dict.fromkeys(failed, 1), run.tries
    assert f"no stream named '{missing}'" in run.output
    assert f"no partition 3: stream '{stream}' has partitions 0-0" in run.output
    # the deferred sensor failed on the deletion, reported by its trigger
    assert f"deferred: waiting for {deleted} failed: {{'status': 'error', 'error': 'NoSuchPartitionError'" in run.output
    assert _cursor_writes(client) == cursors_before, "a cursor was stored for a missing stream or partition"
    client.create_stream(missing, missing)
    assert client.fetch_cursor("c", missing, 0) == -1


def _cursor_writes(client: LiftbridgeClient) -> int:
    """How many cursor writes the server holds (the high watermarks of the ``__cursors`` partitions)."""
    partitions = client.fetch_metadata(["__cursors"]).stream("__cursors").partitions.values()
    return sum(p.high_watermark + 1 for p in partitions)


def test_publish_refuses_records_that_are_not_bytes_str_or_mappings(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Bad input: an int record was published as b"42"; refuse it, naming its index and type. In the second
    batch of a list, it used to fail the task after the first batch was stored (a retry sent it again):
    a source that can be read twice is checked whole before anything is sent."""
    stream = stream_name()
    client.create_stream(stream, stream)
    body = f"""
        from datetime import timedelta
        LiftbridgePublishOperator(
            task_id="publish", stream={stream!r}, messages=[b"ok", "fine", b"three", 42], partitioner=None,
            batch_size=2, retries=2, retry_delay=timedelta(0),
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"publish": "failed"}, run.output[-4000:]
    assert run.tries["publish"] == 1
    assert "record #3: record must be bytes, str or a mapping, got int" in run.output
    assert client.fetch_partition_metadata(stream, 0).high_watermark == -1, "nothing of the list was published"


def test_commit_records_offsets_retention_removed_before_a_freeze(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Found by the chaos harness (seed 65): retention removed every offset after the cursor; the freeze (skip) froze
    the empty range [10, 10) and the commit left the cursor at -1, so the lake kept rows of an earlier,
    uncommitted run above the cursor and every later run reported the same loss again. Committing an empty
    range that starts past the frozen cursor moves the cursor to start - 1 (compare-and-set as usual)."""
    stream = stream_name()
    client.create_stream(stream, stream, retention_max_age=1, segment_max_age=0.5, cleaner_interval=0.2)
    client.publish_batch(stream, [f"m{i}".encode() for i in range(10)], ack_policy="all")
    deadline = time.monotonic() + 30
    while (earliest := client.earliest_offset(stream)) is not None and earliest < 10:
        assert time.monotonic() < deadline, f"retention kept offsets from {earliest} on"
        time.sleep(0.3)
    body = f"""
        freeze = LiftbridgeOffsetRangesOperator(
            task_id="freeze", stream={stream!r}, cursor_id="c65", on_data_loss="skip"
        )
        LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output)
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-3000:]
    assert run.xcom["freeze"]["ranges"] == [{"partition": 0, "start": 10, "end": 10}]
    assert client.fetch_cursor("c65", stream, 0) == 9
    again = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert again.ok(), again.output[-3000:]
    assert "removed by retention" not in again.output
