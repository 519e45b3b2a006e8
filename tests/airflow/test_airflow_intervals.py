"""Interval-bounded ranges and cursor lag, run by `airflow dags test` against a real node.

The freeze operator's ``start_time``/``end_time`` turn times into offsets with the
server's time index; the tests publish in three windows a second apart, read the
times the server gave each message, and check every interval's ranges hold
exactly that window's offsets.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from pathlib import Path

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from tests.airflow.airflow_runs import connection_env, run_dag, stream_name
from tests.airflow.statsd import StatsdListener


def iso(nanoseconds: int) -> str:
    return datetime.fromtimestamp(nanoseconds / 1e9, tz=UTC).isoformat()


def test_each_interval_freezes_exactly_its_window(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    windows: list[list[tuple[int, int]]] = []  # per window: (partition, offset) published in it
    for window in range(3):
        sent = []
        for i in range(5):
            ack = client.publish(stream, f"w{window}-{i}".encode(), partition=i % 2, ack_policy="all")
            assert ack is not None
            sent.append((ack.partition, ack.offset))
        windows.append(sent)
        time.sleep(1.0)
    ends = {p: client.fetch_partition_metadata(stream, p).high_watermark + 1 for p in (0, 1)}  # 9 and 6
    stamps = {(m.partition, m.offset): m.timestamp for p in (0, 1) for m in client.read_range(stream, p, 0, ends[p])}
    times = [[stamps[key] for key in window] for window in windows]
    # Boundaries: before window 0, between windows, after window 2; and an interval before everything.
    bounds = [min(times[0]) - 10**8, *((max(a) + min(b)) // 2 for a, b in itertools.pairwise(times))]
    bounds.append(max(times[2]) + 10**8)
    body = "\n".join(
        f'LiftbridgeOffsetRangesOperator(task_id="w{n}", stream={stream!r}, '
        f'start_time="{iso(bounds[n])}", end_time="{{{{ \'{iso(bounds[n + 1])}\' }}}}")'
        for n in range(3)
    )
    before = f'start_time="{iso(bounds[0] - 10**9)}", end_time="{iso(bounds[0])}"'
    body += f'\nLiftbridgeOffsetRangesOperator(task_id="before", stream={stream!r}, {before})'
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-3000:]
    for n in range(3):
        ranges = run.xcom[f"w{n}"]["ranges"]
        covered = {(r["partition"], o) for r in ranges for o in range(r["start"], r["end"])}
        assert covered == set(windows[n]), f"window {n}: {ranges}"
        assert run.xcom[f"w{n}"]["metadata"]["interval"] == {"start": iso(bounds[n]), "end": iso(bounds[n + 1])}
    assert run.xcom["before"]["ranges"] == [
        {"partition": 0, "start": 0, "end": 0},
        {"partition": 1, "start": 0, "end": 0},
    ]
    client.publish_batch(stream, [b"later"] * 6, partitioner="round_robin", ack_policy="all")
    again = run_dag(airflow_home, body, connection_env(liftbridge_server))  # a backfill of the same intervals
    assert again.ok(), again.output[-3000:]
    assert {t: x["ranges"] for t, x in again.xcom.items()} == {t: x["ranges"] for t, x in run.xcom.items()}


def test_an_interval_older_than_what_retention_kept_is_reported(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, retention_max_messages=5, segment_max_bytes=256, cleaner_interval=0.2)
    started = datetime.now(UTC)
    client.publish_batch(stream, [f"m{i}".encode() * 20 for i in range(40)], ack_policy="all")
    time.sleep(2)  # the cleaner removes the old segments
    earliest = client.earliest_offset(stream)
    assert earliest is not None
    assert earliest > 0
    times = f'start_time="{started.isoformat()}", end_time="{datetime.now(UTC).isoformat()}"'
    body = f"""
        LiftbridgeOffsetRangesOperator(task_id="strict", stream={stream!r}, {times})
        LiftbridgeOffsetRangesOperator(task_id="lenient", stream={stream!r}, {times}, on_data_loss="skip")
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"strict": "failed", "lenient": "success"}, run.output[-3000:]
    assert f"the interval starts at offset {earliest}, the oldest one retention kept" in run.output
    assert run.xcom["lenient"]["ranges"] == [{"partition": 0, "start": earliest, "end": 40}]


def test_an_interval_still_to_come_is_retried_and_bad_times_fail_at_once(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream)
    body = f"""
        LiftbridgeOffsetRangesOperator(
            task_id="future", stream={stream!r}, start="earliest", end_time="2999-01-01T00:00:00+00:00"
        )
        LiftbridgeOffsetRangesOperator(task_id="naive", stream={stream!r}, start_time="2026-01-01T00:00:00")
        LiftbridgeOffsetRangesOperator(
            task_id="backwards", stream={stream!r},
            start_time="2026-01-02T00:00:00+00:00", end_time="2026-01-01T00:00:00+00:00",
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.states == {"future": "failed", "naive": "failed", "backwards": "failed"}, run.output[-3000:]
    assert "is still to come: the interval is not over yet" in run.output
    assert "start_time must carry a time zone" in run.output
    assert "is before start_time" in run.output


def test_cursor_lag_in_the_freeze_xcom_the_sensor_and_the_gauges(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(stream, [b"a"] * 6, partitioner="round_robin", ack_policy="all")  # 3 per partition
    statsd = StatsdListener()
    env = {**connection_env(liftbridge_server), **statsd.env}
    body = f"""
        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="lagc")
        behind = LiftbridgeCursorLagSensor(
            task_id="behind", stream={stream!r}, cursor_id="lagc", max_lag=2, timeout=2, poke_interval=0.5,
        )
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output, trigger_rule="all_done")
        caught_up = LiftbridgeCursorLagSensor(task_id="caught_up", stream={stream!r}, cursor_id="lagc", timeout=30)
        freeze >> behind >> commit >> caught_up
    """
    run = run_dag(airflow_home, body, env)
    gauges = {p: statsd.received(f"airflow.liftbridge.cursor_lag.lagc.{stream}.{p}") for p in (0, 1)}
    statsd.close()
    assert run.states["freeze"] == "success", run.output[-3000:]
    assert run.xcom["freeze"]["metadata"]["cursor_lag"] == {"0": 3, "1": 3}
    assert run.states["behind"] == "failed", "3 behind is more than max_lag=2: the sensor times out"
    assert run.states["commit"] == "success"
    assert run.states["caught_up"] == "success"
    assert run.xcom["caught_up"] == {"0": 0, "1": 0}
    for partition in (0, 1):
        assert "3|g" in gauges[partition], gauges  # the freeze's (and the first sensor's) figure
        assert "0|g" in gauges[partition], gauges  # after the commit
