"""Event-driven DAG runs for real: asset watchers run by the `airflow triggerer` process.

Each test gets its own Airflow home (a copy of a SQLite DB migrated once), writes
a DAG file whose assets have Liftbridge watchers, registers it with
`airflow dags reserialize`, runs the real triggerer as a subprocess and reads the
asset events Airflow stored straight from the metadata DB.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider import fault_points
from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.watching import CursorNames
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.leftovers import end_session
from tests.airflow.statsd import StatsdListener

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
WAIT = 120.0  # seconds any wait below may take before the test fails


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("airflow-template")
    result = subprocess.run(
        [AIRFLOW, "db", "migrate"], env=_env(home, {}), capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return home / "airflow.db"


@pytest.fixture
def home(tmp_path: Path, migrated_db: Path) -> Path:
    (tmp_path / "dags").mkdir()
    shutil.copy(migrated_db, tmp_path / "airflow.db")
    return tmp_path


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # A killed triggerer's watchers move to the next one within seconds.
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "4",
        **extra,
    }


_LOG_NUMBERS = itertools.count()


class Triggerer:
    """`airflow triggerer` in its own process group (it starts a trigger-runner child), logging to a file."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.home / f"triggerer-{next(_LOG_NUMBERS)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [AIRFLOW, "triggerer"], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self) -> None:
        """SIGKILL the triggerer and its children: no cleanup runs."""
        self._signal_group(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 30 s, then whatever of its session or its AIRFLOW_HOME is left."""
        if self.process is not None:
            end_session(self.process, ("AIRFLOW_HOME", self.env["AIRFLOW_HOME"]), timeout=30)
            self.process = None  # stopped once: the fixture's teardown stops every triggerer again

    def _signal_group(self, sig: signal.Signals, wait: float = 10) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait)

    def log_text(self) -> str:
        return "".join(log.read_text(errors="replace") for log in self.logs)


@pytest.fixture
def triggerer_factory(home: Path) -> Iterator[Callable[[dict[str, str]], Triggerer]]:
    started: list[Triggerer] = []

    def make(env: dict[str, str]) -> Triggerer:
        triggerer = Triggerer(home, env)
        started.append(triggerer)
        return triggerer

    yield make
    for triggerer in started:
        triggerer.stop()


def register_dags(home: Path, env: dict[str, str], body: str, name: str = "watch_dags.py") -> None:
    (home / "dags" / name).write_text(textwrap.dedent(body))
    result = subprocess.run(
        [AIRFLOW, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with sqlite3.connect(home / "airflow.db") as db:
        errors = db.execute("SELECT filename, stacktrace FROM import_error").fetchall()
        assert not errors, errors
        triggers = db.execute("SELECT classpath FROM trigger").fetchall()
    assert triggers, "the DAG file registered no asset watcher triggers"


def asset_payloads(home: Path, asset_name: str) -> list[dict[str, Any]]:
    """Payloads of the events Airflow stored for the asset, oldest first."""
    with sqlite3.connect(home / "airflow.db", timeout=30) as db:
        rows = db.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id",
            (asset_name,),
        ).fetchall()
    payloads = []
    for (extra,) in rows:
        stored = json.loads(extra)
        assert stored["from_trigger"] is True
        payloads.append(stored["payload"])
    return payloads


def wait_until(condition: Callable[[], bool], what: str, triggerer: Triggerer, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            log = triggerer.log_text()[-6000:]
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}; triggerer log:\n{log}")
        time.sleep(0.5)


def connection(server: DevServer) -> dict[str, str]:
    value = {"conn_type": "liftbridge", "host": ",".join(server.brokers)}
    return {"AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(value)}


def new_stream(client: LiftbridgeClient, partitions: int) -> str:
    name = f"watch-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=partitions)
    return name


def publish(client: LiftbridgeClient, stream: str, partitions: int, first: int, count: int) -> set[tuple[int, str]]:
    """Messages first..first+count-1, round robin over partitions; returns ``{(partition, value)}``."""
    sent = set()
    for number in range(first, first + count):
        value = f"event {number}"
        client.publish(stream, value.encode(), key=f"k{number}".encode(), partition=number % partitions)
        sent.add((number % partitions, value))
    return sent


def offsets_of(payloads: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    return Counter((p["partition"], p["offset"]) for p in payloads)


def test_two_watchers_share_one_subscription_and_get_every_message_once(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=2)
        # The triggerer imports apply_function from its Python path; Airflow adds the plugins folder.
        (home / "plugins").mkdir()
        (home / "plugins" / "watch_functions.py").write_text(
            "def even_offsets_only(payload):\n"
            "    return {**payload, 'checked': True} if payload['offset'] % 2 == 0 else None\n"
        )
        register_dags(
            home,
            env,
            f"""
            from airflow.sdk import DAG, Asset, AssetWatcher, task
            from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
            from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

            every = Asset(name="every", uri="liftbridge://{liftbridge_server.brokers[0]}/{stream}", watchers=[
                AssetWatcher(name="every", trigger=LiftbridgeMessageTrigger(stream="{stream}")),
            ])
            even = Asset(name="even", uri="liftbridge://{liftbridge_server.brokers[0]}/{stream}-even", watchers=[
                AssetWatcher(name="even", trigger=MessageQueueTrigger(
                    scheme="liftbridge", stream="{stream}", value_format="base64",
                    apply_function="watch_functions.even_offsets_only")),
            ])
            for asset in (every, even):
                with DAG(f"on_{{asset.name}}", schedule=[asset]):
                    task(lambda: None, task_id="noop")()
            """,
        )
        sent = publish(client, stream, 2, 0, 20)
        triggerer = triggerer_factory(env)
        triggerer.start()
        wait_until(lambda: len(asset_payloads(home, "every")) >= 20, "20 events for 'every'", triggerer)
        sent |= publish(client, stream, 2, 20, 10)  # while the triggerer runs
        wait_until(lambda: len(asset_payloads(home, "every")) >= 30, "30 events for 'every'", triggerer)
        wait_until(lambda: len(asset_payloads(home, "even")) >= 16, "16 events for 'even'", triggerer)
        time.sleep(3)  # anything extra would show up now
        every, even = asset_payloads(home, "every"), asset_payloads(home, "even")
        cursor = {p: client.fetch_cursor(CursorNames("airflow-message-watcher").position, stream, p) for p in (0, 1)}
    triggerer.stop()

    assert {(p["partition"], p["value"]) for p in every} == sent
    assert max(offsets_of(every).values()) == 1, "an event was stored twice"
    assert sorted(offsets_of(every)) == [(p, o) for p in (0, 1) for o in range(15)]
    assert all(p["stream"] == stream and p["key_encoding"] == "text" for p in every)
    # The second watcher has its own filter and format, on the same reader.
    assert sorted(offsets_of(even)) == [(p, o) for p in (0, 1) for o in range(0, 15, 2)]
    assert all(p["checked"] and p["value_encoding"] == "base64" for p in even)
    assert {base64.b64decode(p["value"]).decode() for p in even} <= {value for _, value in sent}
    assert cursor == {0: 14, 1: 14}
    subscribed = [line for line in triggerer.log_text().splitlines() if "Liftbridge watcher subscribed" in line]
    assert len(subscribed) == 2, f"expected one subscription per partition for both watchers, got {subscribed}"


def test_killed_triggerer_resumes_from_the_cursor_and_loses_nothing(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=3)
        register_watcher(home, env, liftbridge_server, stream, asset="events", options="max_in_flight=2")
        sent = publish(client, stream, 3, 0, 60)
        first = triggerer_factory(env)
        first.start()
        wait_until(lambda: len(asset_payloads(home, "events")) >= 15, "15 events before the kill", first)
        first.kill()
        before_restart = len(asset_payloads(home, "events"))
        assert before_restart < 60, "the triggerer finished before it could be killed; publish more"
        sent |= publish(client, stream, 3, 60, 30)
        second = triggerer_factory(env)
        second.start()
        wait_until(lambda: len(set(offsets_of(asset_payloads(home, "events")))) >= 90, "all 90 offsets", second)
        time.sleep(3)
        payloads = asset_payloads(home, "events")
    second.stop()

    assert {(p["partition"], p["value"]) for p in payloads} == sent
    counts = offsets_of(payloads)
    assert sorted(counts) == [(p, o) for p in range(3) for o in range(30)]
    # Only events in flight at the kill (at most max_in_flight=2 per partition) may come again, once each.
    assert set(counts.values()) <= {1, 2}, counts
    assert_repeats_identical_and_bounded(payloads, per_partition=2)


def test_batch_watcher_hands_out_contiguous_ranges_across_a_kill(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=2)
        register_dags(
            home,
            env,
            f"""
            from airflow.sdk import DAG, Asset, AssetWatcher, task
            from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

            batches = Asset(name="batches", uri="liftbridge://{liftbridge_server.brokers[0]}/{stream}", watchers=[
                AssetWatcher(name="batches", trigger=MessageQueueTrigger(
                    scheme="liftbridge", stream="{stream}", mode="batch",
                    max_messages=10, max_wait=2, poll_interval=0.2)),
            ])
            with DAG("on_batches", schedule=[batches]):
                task(lambda: None, task_id="noop")()
            """,
        )
        triggerer = triggerer_factory(env)
        triggerer.start()
        publish(client, stream, 2, 0, 12)
        wait_until(lambda: _covered(asset_payloads(home, "batches")) >= 12, "the first batch", triggerer)
        publish(client, stream, 2, 12, 12)
        wait_until(lambda: _covered(asset_payloads(home, "batches")) >= 24, "the second batch", triggerer)
        triggerer.kill()
        publish(client, stream, 2, 24, 7)  # fewer than max_messages: fires after max_wait
        restarted = triggerer_factory(env)
        restarted.start()
        wait_until(lambda: _covered(asset_payloads(home, "batches")) >= 31, "batches covering all 31", restarted)
        time.sleep(3)
        payloads = asset_payloads(home, "batches")
        recorded = client.fetch_cursor(CursorNames("airflow-batch-watcher").recorded, stream, 0)
    restarted.stop()

    by_number: dict[int, dict[str, Any]] = {}
    for payload in payloads:
        number = payload["metadata"]["batch"]
        if number in by_number:
            assert by_number[number] == payload, "a batch sent again must be identical"
        by_number[number] = payload
    assert sorted(by_number) == list(range(len(by_number)))
    assert recorded == len(by_number) - 1
    for partition, count in ((0, 16), (1, 15)):
        ranges = [r for n in sorted(by_number) for r in by_number[n]["ranges"] if r["partition"] == partition]
        assert ranges[0]["start"] == 0
        assert ranges[-1]["end"] == count
        assert all(a["end"] == b["start"] for a, b in itertools.pairwise(ranges)), ranges
    sizes = [p["metadata"]["offsets"] for p in by_number.values()]
    assert max(sizes) >= 10, sizes  # fired by count
    assert sizes[-1] == 7, sizes  # fired by time


def _covered(payloads: list[dict[str, Any]]) -> int:
    """Offsets covered by distinct batches."""
    distinct = {p["metadata"]["batch"]: p for p in payloads}
    return sum(p["metadata"]["offsets"] for p in distinct.values())


def test_batch_watcher_fires_for_auto_paused_partitions_without_resuming_them(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """A batch watcher polls high watermarks, so it must work on paused partitions."""
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = f"watch-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, partitions=2, auto_pause_time=1)
        publish(client, stream, 2, 0, 12)
        deadline = time.monotonic() + 30
        while not all(p.paused for p in client.fetch_metadata([stream]).stream(stream).partitions.values()):
            assert time.monotonic() < deadline, "the partitions did not auto-pause within 30 s"
            time.sleep(0.2)
        register_watcher(
            home,
            env,
            liftbridge_server,
            stream,
            asset="paused",
            options='mode="batch", max_messages=10, max_wait=2, poll_interval=0.2',
        )
        triggerer = triggerer_factory(env)
        triggerer.start()
        wait_until(lambda: _covered(asset_payloads(home, "paused")) >= 12, "a batch of 12", triggerer, timeout=60)
        time.sleep(2)
        (payload,) = asset_payloads(home, "paused")
        still_paused = [p.paused for p in client.fetch_metadata([stream]).stream(stream).partitions.values()]
    triggerer.stop()
    assert payload["ranges"] == [{"partition": 0, "start": 0, "end": 6}, {"partition": 1, "start": 0, "end": 6}]
    assert still_paused == [True, True], "watching high watermarks must not resume a partition"


def register_watcher(
    home: Path, env: dict[str, str], server: DevServer, stream: str, *, asset: str, options: str
) -> None:
    """A DAG scheduled on asset ``asset``, watched by one LiftbridgeMessageTrigger on ``stream`` with ``options``."""
    register_dags(
        home,
        env,
        f"""
        from airflow.sdk import DAG, Asset, AssetWatcher, task
        from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

        watched = Asset(name="{asset}", uri="liftbridge://{server.brokers[0]}/{stream}", watchers=[
            AssetWatcher(name="{asset}", trigger=LiftbridgeMessageTrigger(stream="{stream}", {options})),
        ])
        with DAG("on_{asset}", schedule=[watched]):
            task(lambda: None, task_id="noop")()
        """,
    )


def register_refusing_watcher(home: Path, env: dict[str, str], server: DevServer, stream: str, options: str) -> None:
    """Asset "orders" watching ``stream`` with an apply_function that refuses the message "event 2" (a ValueError)."""
    (home / "plugins").mkdir()
    (home / "plugins" / "poison_functions.py").write_text(
        "def refuse_event_2(payload):\n"
        "    if payload['value'] == 'event 2':\n"
        "        raise ValueError('bad order ' + payload['value'])\n"
        "    return payload\n"
    )
    register_watcher(
        home,
        env,
        server,
        stream,
        asset="orders",
        options=f'apply_function="poison_functions.refuse_event_2", {options}',
    )


def test_refused_message_goes_to_the_dead_letter_stream_and_lag_reaches_zero(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """Dead letters and lag, with the real triggerer: a message the apply_function refuses is
    dead-lettered with its origin, the watcher goes on, and the lag gauge and DLQ counter reach StatsD."""
    statsd = StatsdListener()
    env = _env(home, {**connection(liftbridge_server), **statsd.env})
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=1)
        register_refusing_watcher(
            home, env, liftbridge_server, stream, f'cursor_id="dlq-watch", dlq_stream="{stream}-dlq"'
        )
        publish(client, stream, 1, 0, 5)
        triggerer = triggerer_factory(env)
        triggerer.start()
        wait_until(lambda: len(asset_payloads(home, "orders")) >= 4, "the four good events", triggerer)
        wait_until(lambda: client.fetch_cursor("dlq-watch", stream, 0) == 4, "the cursor at offset 4", triggerer)
        lag = f"airflow.liftbridge.watcher.lag.dlq-watch.{stream}.0"
        wait_until(lambda: "0|g" in statsd.received(lag), f"a lag of 0 on {lag}", triggerer, timeout=60)
        dead = list(client.read_range(f"{stream}-dlq", 0, 0, 1))
        payloads = asset_payloads(home, "orders")
        counted = statsd.received(f"airflow.liftbridge.watcher.dead_lettered.dlq-watch.{stream}.0")
    triggerer.stop()
    statsd.close()
    assert sorted(offsets_of(payloads)) == [(0, 0), (0, 1), (0, 3), (0, 4)]
    (message,) = dead
    assert message.value == b"event 2"
    assert dict(message.headers)["lb-dlq-offset"] == b"2"
    assert b"ValueError: bad order event 2" in dict(message.headers)["lb-dlq-error"]
    assert counted == ["1|c"]
    assert f"published {stream}/0 offset 2 to dead-letter stream {stream}-dlq" in triggerer.log_text()


def test_refused_message_without_a_dead_letter_stream_stops_the_watcher_loudly(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """A refused message without a dead-letter stream, with the real triggerer: without dlq_stream the watcher stops
    before the refused message every time it is restarted, saying which offset and why; nothing passes it, and the lag
    shows it. Then the documented way to skip it (docs/events.md): set the cursor to the refused offset."""
    statsd = StatsdListener()
    env = _env(home, {**connection(liftbridge_server), **statsd.env})
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=1)
        register_refusing_watcher(home, env, liftbridge_server, stream, 'cursor_id="no-dlq"')
        publish(client, stream, 1, 0, 5)
        triggerer = triggerer_factory(env)
        triggerer.start()
        refusal = f"{stream}/0 offset 2 was refused by apply_function"
        wait_until(lambda: triggerer.log_text().count(refusal) >= 2, "the refusal, twice (a restart)", triggerer)
        lag = f"airflow.liftbridge.watcher.lag.no-dlq.{stream}.0"
        # Stuck after offset 1 with the high watermark at 4: three offsets behind, and it stays so.
        wait_until(lambda: "3|g" in statsd.received(lag), f"a lag of 3 on {lag}", triggerer, timeout=60)
        payloads = asset_payloads(home, "orders")
        position = client.fetch_cursor("no-dlq", stream, 0)
        lags_while_stuck = statsd.received(lag)
        client.set_cursor("no-dlq", stream, 0, 2)  # skip offset 2
        wait_until(lambda: len(asset_payloads(home, "orders")) >= 4, "offsets 3 and 4 after the skip", triggerer)
        after_skip = asset_payloads(home, "orders")
    triggerer.stop()
    statsd.close()
    assert set(offsets_of(payloads)) == {(0, 0), (0, 1)}
    assert position == 1
    assert "ValueError: bad order event 2" in triggerer.log_text()
    assert f"{stream}/0 (cursor no-dlq): 3 offsets behind the high watermark 4" in triggerer.log_text()
    assert "0|g" not in lags_while_stuck, "the lag never reached 0: nothing passed the refused message"
    assert sorted(offsets_of(after_skip)) == [(0, 0), (0, 1), (0, 3), (0, 4)]


def test_start_from_latest_survives_a_kill_before_the_first_message(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """A restarted 'latest' watcher misses nothing, with the real triggerer: messages published while a 'latest' watcher
    that never saw a message was down are delivered after its restart. Partition 1 is empty at the first start: its
    'latest' position was the high watermark -1, stored as -1 ("never set"), so the restart took 'latest' again and
    skipped what arrived while it was down (the defect); partition 0 had messages."""
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=2)
        for number in range(3):  # before the watcher existed, on partition 0 only: not wanted with 'latest'
            client.publish(stream, f"early {number}".encode(), partition=0)
        register_watcher(home, env, liftbridge_server, stream, asset="fresh", options='start_from="latest"')
        first = triggerer_factory(env)
        first.start()
        subscribed = "Liftbridge watcher subscribed to"
        wait_until(lambda: first.log_text().count(subscribed) >= 2, "both partitions subscribed", first)
        first.kill()
        sent = publish(client, stream, 2, 0, 6)  # while no triggerer runs: offsets 3-5 of 0, 0-2 of 1
        second = triggerer_factory(env)
        second.start()
        wait_until(lambda: len(asset_payloads(home, "fresh")) >= 6, "the six published while down", second)
        time.sleep(3)
        payloads = asset_payloads(home, "fresh")
    second.stop()
    assert f"{subscribed} {stream}/1 at offset 0" in first.log_text(), "partition 1 was empty at the first start"
    assert {(p["partition"], p["value"]) for p in payloads} == sent
    assert sorted(offsets_of(payloads)) == [(0, 3), (0, 4), (0, 5), (1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("step", ["planned", "stored", "recorded"])
def test_batch_watcher_killed_at_each_step_sends_every_offset_once(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer], step: str
) -> None:
    """Batches survive a killed triggerer: the triggerer SIGKILLed after a batch is planned, after Airflow stored it,
    and after it was recorded: the next triggerer sends that batch again identical (or goes on after it), and the
    batches cover every offset once."""
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=2)
        register_watcher(
            home,
            env,
            liftbridge_server,
            stream,
            asset="batches",
            options='mode="batch", max_messages=6, max_wait=2, poll_interval=0.2',
        )
        publish(client, stream, 2, 0, 8)
        crashing = triggerer_factory({**env, fault_points.ENV: f"watcher.{step}=kill-group"})
        crashing.start()
        assert crashing.process is not None
        crashing.process.wait(WAIT)
        stored_at_crash = len(asset_payloads(home, "batches"))
        publish(client, stream, 2, 8, 4)
        restarted = triggerer_factory(env)
        restarted.start()
        wait_until(lambda: _covered(asset_payloads(home, "batches")) >= 12, "batches covering all 12", restarted)
        time.sleep(3)
        payloads = asset_payloads(home, "batches")
        recorded = client.fetch_cursor(CursorNames("airflow-batch-watcher").recorded, stream, 0)
    restarted.stop()
    assert crashing.process.returncode == -signal.SIGKILL, "the triggerer must have died at the crash point"
    assert stored_at_crash == (0 if step == "planned" else 1)
    by_number: dict[int, dict[str, Any]] = {}
    for payload in payloads:
        number = payload["metadata"]["batch"]
        assert by_number.setdefault(number, payload) == payload, "a batch sent again must be identical"
    assert sorted(by_number) == list(range(len(by_number)))
    assert recorded == len(by_number) - 1
    for partition in (0, 1):
        ranges = [r for n in sorted(by_number) for r in by_number[n]["ranges"] if r["partition"] == partition]
        assert (ranges[0]["start"], ranges[-1]["end"]) == (0, 6)
        assert all(a["end"] == b["start"] for a, b in itertools.pairwise(ranges)), ranges
    repeats = len(payloads) - len(by_number)
    assert repeats == (1 if step == "stored" else 0), [p["metadata"]["batch"] for p in payloads]


class CursorSampler:
    """The oracle of the fault tests: reads partition 0's cursor every 0.1 s on a thread, and right after each
    read the events Airflow stored for ``assets``. It remembers every value the cursor took, in order, and every
    sample where the cursor had passed an offset that an asset had no stored event for (the cursor moves only
    after Airflow stored the events, so the database read after the cursor must hold every offset up to it)."""

    def __init__(self, server: DevServer, cursor_id: str, stream: str, home: Path, assets: tuple[str, ...]) -> None:
        self.values: list[int] = []
        self.passed_unstored: list[str] = []
        self._stop = threading.Event()
        self._args = (server, cursor_id, stream, home, assets)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        server, cursor_id, stream, home, assets = self._args
        with LiftbridgeClient(server.brokers) as client:
            while not self._stop.wait(0.1):
                with contextlib.suppress(Exception):
                    value = client.fetch_cursor(cursor_id, stream, 0)
                    if not self.values or self.values[-1] != value:
                        self.values.append(value)
                    for asset in assets:
                        stored = {o for p, o in offsets_of(asset_payloads(home, asset)) if p == 0}
                        missing = sorted(set(range(value + 1)) - stored)
                        if missing:
                            self.passed_unstored.append(f"cursor {value} passed {missing[:5]} unstored for {asset}")

    def stop(self) -> list[int]:
        """The values the cursor took; fails the test if it moved back or passed an unstored event."""
        self._stop.set()
        self.thread.join(10)
        assert self.values == sorted(self.values), f"the cursor moved back: {self.values}"
        assert not self.passed_unstored, self.passed_unstored[:3]
        return self.values


def assert_repeats_identical_and_bounded(payloads: list[dict[str, Any]], per_partition: int) -> None:
    """Each offset's events are identical copies, and no partition has more than ``per_partition`` repeats."""
    by_offset: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for payload in payloads:
        by_offset.setdefault((payload["partition"], payload["offset"]), []).append(payload)
    repeats: Counter[int] = Counter()
    for (partition, offset), copies in by_offset.items():
        assert all(copy == copies[0] for copy in copies), f"{partition}/{offset} came back different: {copies}"
        repeats[partition] += len(copies) - 1
    assert all(n <= per_partition for n in repeats.values()), f"repeats per partition {dict(repeats)} > {per_partition}"


def test_two_triggerers_a_frozen_owner_wakes_up_and_does_not_move_the_cursor_back(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """A stale triggerer never moves a cursor back, with two real triggerers: the one running the watcher is frozen
    (SIGSTOP) until the other takes the watcher over and moves on; when it wakes, it must not write its stale
    position."""
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=1)
        register_watcher(home, env, liftbridge_server, stream, asset="ha", options='cursor_id="ha"')
        sampler = CursorSampler(liftbridge_server, "ha", stream, home, ("ha",))
        sent = publish(client, stream, 1, 0, 30)
        owner, other = triggerer_factory(env), triggerer_factory(env)
        owner.start()  # the first to run takes the watcher; the other starts once it has
        wait_until(lambda: len(asset_payloads(home, "ha")) >= 3, "three events", owner)
        other.start()
        wait_until(lambda: "Starting the triggerer" in other.log_text(), "the second triggerer", other)
        assert owner.process is not None
        os.killpg(owner.process.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: "Liftbridge watcher subscribed" in other.log_text(), "the takeover", other)
            wait_until(lambda: client.fetch_cursor("ha", stream, 0) >= 20, "the new owner to pass offset 20", other)
        finally:
            os.killpg(owner.process.pid, signal.SIGCONT)
        wait_until(lambda: client.fetch_cursor("ha", stream, 0) == 29, "the cursor at the last offset", other)
        time.sleep(5)  # the woken triggerer has had time to act on its stale state
        payloads = asset_payloads(home, "ha")
        seen = sampler.stop()
    for triggerer in (owner, other):
        triggerer.stop()
    assert {(p["partition"], p["value"]) for p in payloads} == sent
    repeated = len(payloads) - len(sent)
    # The event in flight at the freeze, and one the woken triggerer sent before it learned it lost the watcher.
    assert_repeats_identical_and_bounded(payloads, per_partition=2)
    print(f"cursor values seen: {seen}; repeats: {repeated}; fenced: {'moved by another writer' in owner.log_text()}")


@pytest.mark.cluster
def test_watcher_rides_out_a_killed_cursors_leader_and_a_frozen_partition_leader(
    home: Path, liftbridge_cluster: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """Watchers through cursor and stream leader failures, with the real triggerer on three nodes: the `__cursors`
    leader SIGKILLed while the watcher stores its position (SetCursor fails or fails over), then the stream's leader
    frozen (SIGSTOP). Every message arrives, the cursor never moves back, and only events in flight come twice."""
    env = _env(home, connection(liftbridge_cluster))
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=20) as client:
        stream = f"watch-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, replication_factor=3)
        register_watcher(
            home, env, liftbridge_cluster, stream, asset="faults", options='cursor_id="faults", max_in_flight=2'
        )
        sampler = CursorSampler(liftbridge_cluster, "faults", stream, home, ("faults",))
        values = [f"event {n}".encode() for n in range(30)]
        client.publish_batch(stream, values[:10], ack_policy="all")
        triggerer = triggerer_factory(env)
        triggerer.start()
        wait_until(lambda: len(asset_payloads(home, "faults")) >= 4, "four events", triggerer)

        cursors_leader = liftbridge_cluster.partition_leaders("__cursors")[0]
        assert cursors_leader is not None
        liftbridge_cluster.kill(cursors_leader)
        _publish_once_led(client, liftbridge_cluster, stream, values[10:20], avoid=cursors_leader)
        wait_until(lambda: _values(home, "faults") >= set(values[:20]), "the first 20 after the kill", triggerer)
        liftbridge_cluster.restart(cursors_leader)

        leader = liftbridge_cluster.partition_leaders(stream)[0]
        assert leader is not None
        leader_address = next(n.address for n in liftbridge_cluster.nodes if n.server_id == leader)
        liftbridge_cluster.freeze(leader)
        frozen_at = time.monotonic()
        try:
            _publish_once_led(client, liftbridge_cluster, stream, values[20:], avoid=leader)
            wait_until(lambda: _values(home, "faults") == set(values), "all 30 with the leader frozen", triggerer)
            recovered_after = time.monotonic() - frozen_at
        finally:
            liftbridge_cluster.thaw(leader)
        time.sleep(3)
        payloads = asset_payloads(home, "faults")
        sampler.stop()
    triggerer.stop()
    counts = Counter(p["offset"] for p in payloads)
    assert sorted(counts) == list(range(30))
    assert_repeats_identical_and_bounded(payloads, per_partition=2 * 2)  # two faults x max_in_flight
    # A frozen leader sends no reset: the subscription's liveness interval (30 s) finds it, then a new call
    # goes to the new leader; failover and the new leader's first messages come on top.
    assert recovered_after < 30 + 30, f"the frozen leader held the watcher for {recovered_after:.0f} s"
    assert f"subscription to {stream}/0 moves from {leader_address} to" in triggerer.log_text()
    print(f"all 30 events {recovered_after:.1f} s after the leader froze")


def _publish_once_led(
    client: LiftbridgeClient, cluster: DevServer, stream: str, values: list[bytes], *, avoid: str
) -> None:
    """Publish once the stream has a leader other than ``avoid`` (a killed or frozen node)."""
    deadline = time.monotonic() + 60
    while cluster.partition_leaders(stream).get(0) in (None, avoid):
        assert time.monotonic() < deadline, f"{stream} got no leader but {avoid} within 60 s"
        time.sleep(0.2)
    client.publish_batch(stream, values, ack_policy="leader", ack_wait=20)


def _values(home: Path, asset: str) -> set[bytes]:
    return {p["value"].encode() for p in asset_payloads(home, asset)}


def test_event_one_watcher_fails_to_store_in_time_is_delivered_again_not_skipped(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """A cursor waits for every watcher sharing its reader, with the real triggerer: of two watchers sharing a reader,
    one takes longer than the ack timeout on offset 2 (Airflow force-fails it: the event counts as not stored). The
    cursor must not pass offset 2 on the other watcher's word; after the restart both assets hold every offset."""
    env = _env(home, {**connection(liftbridge_server), "AIRFLOW__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "2"})
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client, partitions=1)
        (home / "plugins").mkdir()
        marker = home / "slowed-once"
        (home / "plugins" / "slow_functions.py").write_text(
            "import pathlib, time\n"
            "def slow_on_offset_2_once(payload):\n"
            f"    marker = pathlib.Path({str(marker)!r})\n"
            "    if payload['offset'] == 2 and not marker.exists():\n"
            "        marker.touch()\n"
            "        time.sleep(5)\n"
            "    return payload\n"
        )
        register_dags(
            home,
            env,
            f"""
            from airflow.sdk import DAG, Asset, AssetWatcher, task
            from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

            uri = "liftbridge://{liftbridge_server.brokers[0]}/{stream}"
            slow = Asset(name="slow", uri=uri, watchers=[AssetWatcher(name="slow", trigger=LiftbridgeMessageTrigger(
                stream="{stream}", cursor_id="shared", apply_function="slow_functions.slow_on_offset_2_once"))])
            fast = Asset(name="fast", uri=uri + "-fast", watchers=[AssetWatcher(name="fast",
                trigger=LiftbridgeMessageTrigger(stream="{stream}", cursor_id="shared"))])
            for asset in (slow, fast):
                with DAG(f"on_{{asset.name}}", schedule=[asset]):
                    task(lambda: None, task_id="noop")()
            """,
        )
        sampler = CursorSampler(liftbridge_server, "shared", stream, home, ("slow", "fast"))
        publish(client, stream, 1, 0, 6)
        triggerer = triggerer_factory(env)
        triggerer.start()
        wait_until(marker.exists, "the slow watcher to reach offset 2", triggerer)
        wait_until(lambda: len(set(offsets_of(asset_payloads(home, "slow")))) == 6, "all six for 'slow'", triggerer)
        wait_until(lambda: len(set(offsets_of(asset_payloads(home, "fast")))) == 6, "all six for 'fast'", triggerer)
        # The cursor moves after Airflow stored both watchers' events: a fixed 3 s here was too short on a
        # loaded CI machine (the last value sampled was 4). Waiting for 5 still fails the test if it never gets there.
        wait_until(lambda: sampler.values[-1:] == [5], "the shared cursor to reach offset 5", triggerer)
        seen = sampler.stop()
        slow, fast = asset_payloads(home, "slow"), asset_payloads(home, "fast")
    triggerer.stop()
    assert "Ack timeout; force-failing subscriber" in triggerer.log_text(), "Airflow's ack timeout must have fired"
    assert f"{stream}/0 offset 2: Airflow did not store its event" in triggerer.log_text(), "the reader stopped at 2"
    assert seen[-1] == 5
    for payloads in (slow, fast):
        counts = offsets_of(payloads)
        assert sorted(counts) == [(0, o) for o in range(6)]
        assert_repeats_identical_and_bounded(payloads, per_partition=2)  # the events in flight at the stop


def test_an_activity_watcher_fires_for_the_changes_it_was_told_about(
    home: Path, liftbridge_server: DevServer, triggerer_factory: Callable[[dict[str, str]], Triggerer]
) -> None:
    """Cluster activity as asset events: a watcher on __activity with value_format='activity' fires an asset event per
    stream created (activity_ops), not for the deletion, and the events carry the decoded change."""
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        register_watcher(
            home, env, liftbridge_server, "__activity", asset="shape",
            options='value_format="activity", activity_ops=["create_stream"], start_from="latest", cursor_id="shape"',
        )  # fmt: skip
        triggerer = triggerer_factory(env)
        triggerer.start()
        wait_until(lambda: "Liftbridge watcher subscribed" in triggerer.log_text(), "the watcher", triggerer)
        names = [f"shape-{uuid.uuid4().hex[:6]}" for _ in range(2)]
        for name in names:
            client.create_stream(name, name, partitions=2)
        client.delete_stream(names[0])
        wait_until(lambda: len(asset_payloads(home, "shape")) >= 2, "two creations", triggerer)
        time.sleep(3)  # the deletion passes without an event
        payloads = asset_payloads(home, "shape")
    triggerer.stop()
    created = [p["activity"] for p in payloads if p["activity"]["stream"] in names]
    assert [(a["op"], a["stream"], a["partitions"]) for a in created] == [("create_stream", n, [0, 1]) for n in names]
    assert all(p["activity"]["op"] == "create_stream" for p in payloads)
