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
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.watching import CursorNames

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


class Triggerer:
    """`airflow triggerer` in its own process group (it starts a trigger-runner child), logging to a file."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.home / f"triggerer-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [AIRFLOW, "triggerer"], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self) -> None:
        """SIGKILL the triggerer and its children: no cleanup runs."""
        self._signal_group(signal.SIGKILL)

    def stop(self) -> None:
        self._signal_group(signal.SIGTERM, wait=30)
        self._signal_group(signal.SIGKILL)

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
        register_dags(
            home,
            env,
            f"""
            from airflow.sdk import DAG, Asset, AssetWatcher, task
            from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

            events = Asset(name="events", uri="liftbridge://{liftbridge_server.brokers[0]}/{stream}", watchers=[
                AssetWatcher(name="events", trigger=LiftbridgeMessageTrigger(stream="{stream}", max_in_flight=2)),
            ])
            with DAG("on_events", schedule=[events]):
                task(lambda: None, task_id="noop")()
            """,
        )
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
    repeated = {position: n for position, n in counts.items() if n > 1}
    # Only events in flight at the kill (at most max_in_flight=2 per partition) may come again, once.
    assert len(repeated) <= 3 * 2, repeated
    assert set(repeated.values()) <= {2}, repeated
    for partition, offset in repeated:
        copies = [p for p in payloads if (p["partition"], p["offset"]) == (partition, offset)]
        assert copies[0] == copies[1], "a repeated event must be identical"


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
    """Defect 3 (issue 11): a batch watcher polls high watermarks, so it must work on paused partitions."""
    env = _env(home, connection(liftbridge_server))
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = f"watch-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, partitions=2, auto_pause_time=1)
        publish(client, stream, 2, 0, 12)
        deadline = time.monotonic() + 30
        while not all(p.paused for p in client.fetch_metadata([stream]).stream(stream).partitions.values()):
            assert time.monotonic() < deadline, "the partitions did not auto-pause within 30 s"
            time.sleep(0.2)
        register_dags(
            home,
            env,
            f"""
            from airflow.sdk import DAG, Asset, AssetWatcher, task
            from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

            batches = Asset(name="paused", uri="liftbridge://{liftbridge_server.brokers[0]}/{stream}", watchers=[
                AssetWatcher(name="paused", trigger=LiftbridgeMessageTrigger(
                    stream="{stream}", mode="batch", max_messages=10, max_wait=2, poll_interval=0.2)),
            ])
            with DAG("on_paused", schedule=[batches]):
                task(lambda: None, task_id="noop")()
            """,
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
