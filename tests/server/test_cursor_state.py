"""CursorStateStore: a task's state per DAG run in a stream's cursors (Airflow without a task state store).

Interleavings of two writers are made deterministic by :class:`SteppedClient`, a real client that runs
another writer's whole ``set`` (or dies) just before one of its own cursor writes (issue 47, item 8).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.cursor_state import CursorStateStore
from liftbridge_provider.devserver import DevServer

# Hourly runs of one DAG, as a scheduler or a backfill names them.
HOURLY = [f"scheduled__2026-01-01T{hour:02d}:00:00+00:00" for hour in range(24)]


def store(client: LiftbridgeClient, stream: str, run_id: str, task_id: str = "freeze") -> CursorStateStore:
    return CursorStateStore(client, stream, dag_id="d", task_id=task_id, run_id=run_id, map_index=-1)


def slot_before_issue_47(run_id: str) -> int:
    """The slot (of 16) the store gave a run of task ``d.freeze`` until issue 47: runs with equal slots shared
    cursors. Kept here to pick the runs that used to collide; the store no longer has slots."""
    digest = hashlib.sha256("\0".join(("d", "freeze", "-1", run_id)).encode()).digest()
    return int.from_bytes(digest[8:12], "big") % 16


def same_slot_runs() -> tuple[str, str]:
    """The first two hourly runs that shared a slot before issue 47 (found by search: the slot is fixed)."""
    seen: dict[int, str] = {}
    for run_id in HOURLY:
        if (slot := slot_before_issue_47(run_id)) in seen:
            return seen[slot], run_id
        seen[slot] = run_id
    raise AssertionError("no two hourly runs share a slot")


def ranges(stream: str, start: int, end: int) -> dict[str, Any]:
    """A time-bounded freeze's document (no cursor), as the freeze operator keeps it."""
    return {"version": 1, "stream": stream, "cursor_id": None,
            "ranges": [{"partition": 0, "start": start, "end": end}],
            "metadata": {"interval": {"start": f"2026-01-01T00:{start % 60:02d}:00+00:00"}}}  # fmt: skip


class Died(Exception):
    """A try that died between two cursor writes."""


class SteppedClient(LiftbridgeClient):
    """A real client whose cursor write number ``at`` (0-based) is preceded by ``before()``: another writer's
    whole ``set``, or raising :class:`Died`. Counts its writes in ``writes``."""

    def __init__(self, brokers: list[str], *, at: int = -1, before: Callable[[], None] = lambda: None) -> None:
        super().__init__(brokers)
        self.at, self.before, self.writes = at, before, 0

    def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int, **kwargs: Any) -> None:
        if self.writes == self.at:
            self.before()
        self.writes += 1
        super().set_cursor(cursor_id, stream, partition, offset, **kwargs)


def writes_of_one_set(server: DevServer, stream: str, run_id: str, value: Any) -> int:
    """How many cursor writes one ``set`` of ``value`` makes (on a key of its own, so nothing is disturbed)."""
    counting = SteppedClient(server.brokers)
    with counting:
        store(counting, stream, run_id).set("counting", value)
    return counting.writes


def new_stream(client: LiftbridgeClient) -> str:
    stream = f"state-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    return stream


def test_a_value_set_in_a_run_is_read_back_by_that_run_only(liftbridge_server: DevServer) -> None:
    """The same run reads back the very value (a ranges document, any size); another run of the task, or
    another task, reads nothing."""
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = f"state-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, partitions=2)
        value = {"version": 1, "stream": stream, "ranges": [{"partition": p, "start": p, "end": 10 * p + 7}
                                                            for p in range(40)], "metadata": {"é": "ü"}}  # fmt: skip
        store(client, stream, "run-1").set("ranges", value)
        assert store(client, stream, "run-1").get("ranges") == value
        assert store(client, stream, "run-2").get("ranges") is None
        assert store(client, stream, "run-1", task_id="other").get("ranges") is None
        assert store(client, stream, "run-1").get("other-key") is None
        store(client, stream, "run-1").set("ranges", {"small": True})  # a shorter value over a longer one
        assert store(client, stream, "run-1").get("ranges") == {"small": True}


def test_a_write_cut_short_is_never_read(liftbridge_server: DevServer) -> None:
    """A try that died between any two of its cursor writes leaves nothing to read (a first value), or the
    run's earlier value (a second one): never a part of the new value, never a decode error."""
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client)
        first, second = ranges(stream, 0, 100), ranges(stream, 100, 250)
        for at in range(writes_of_one_set(liftbridge_server, stream, "run-1", second)):
            store(client, stream, "run-1").set(f"kept-{at}", first)
            for key in (f"new-{at}", f"kept-{at}"):
                with SteppedClient(liftbridge_server.brokers, at=at, before=_die) as dying, pytest.raises(Died):
                    store(dying, stream, "run-1").set(key, second)
            assert store(client, stream, "run-1").get(f"new-{at}") is None, f"cut before write {at}"
            assert store(client, stream, "run-1").get(f"kept-{at}") in (first, None), f"cut before write {at}"


def _die() -> None:
    raise Died


def test_a_retry_never_reads_the_ranges_another_run_wrote_meanwhile(liftbridge_server: DevServer) -> None:
    """Two runs of one DAG (a backfill, or max_active_runs > 1) whose run ids shared a slot before issue 47:
    run A froze [0, 100) and run B's whole write of [100, 250) fell just before A's last cursor write. A's
    retry reads A's own ranges, B's reads B's. (Before: A's retry got B's ranges, which pass the freeze
    operator's stream/cursor check, so with time-bounded freezes A's interval was never ingested.)"""
    run_a, run_b = same_slot_runs()
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client)
        mine, theirs = ranges(stream, 0, 100), ranges(stream, 100, 250)
        last = writes_of_one_set(liftbridge_server, stream, run_a, mine) - 1
        run_b_writes = lambda: store(client, stream, run_b).set("ranges", theirs)  # noqa: E731
        with SteppedClient(liftbridge_server.brokers, at=last, before=run_b_writes) as stepped:
            store(stepped, stream, run_a).set("ranges", mine)
        assert store(client, stream, run_a).get("ranges") == mine, "run A's retry must get A's own ranges"
        assert store(client, stream, run_b).get("ranges") == theirs, "run B's retry must get B's own ranges"


@pytest.mark.parametrize("writers", ["two runs that shared a slot", "two tries of one run"])
def test_interleaved_writers_never_leave_a_mixed_value_to_read(liftbridge_server: DevServer, writers: str) -> None:
    """Another writer's whole set() falls before each of a writer's cursor writes in turn: every get then
    returns a value its run set, or nothing; never a decode error (zlib.error, JSON), never a mix of the two.
    (Before issue 47: a mix was read, and every retry of that run failed with zlib.error.)"""
    run_a, run_b = same_slot_runs() if writers == "two runs that shared a slot" else ("run-1", "run-1")
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client)
        mine, theirs = ranges(stream, 0, 100), ranges(stream, 12345678, 98765432)
        allowed = {run_a: [mine, None], run_b: [theirs, None]} if run_a != run_b else {run_a: [mine, theirs, None]}
        for at in range(writes_of_one_set(liftbridge_server, stream, run_a, mine)):
            key = f"ranges-{at}"
            other = lambda key=key: store(client, stream, run_b).set(key, theirs)  # noqa: E731
            with SteppedClient(liftbridge_server.brokers, at=at, before=other) as stepped:
                store(stepped, stream, run_a).set(key, mine)
            for run_id, values in allowed.items():
                assert store(client, stream, run_id).get(key) in values, f"{run_id}, other writer before write {at}"


def test_a_runs_state_survives_any_number_of_later_runs(liftbridge_server: DevServer) -> None:
    """A clear of a run a day later (23 hourly runs of the task since, one of which shared its slot before
    issue 47) still gets the ranges it froze: freeze once per DAG run, as the README promises."""
    first, later = HOURLY[0], HOURLY[1:]
    assert slot_before_issue_47(first) in {slot_before_issue_47(r) for r in later}, "a later run took its slot"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client)
        store(client, stream, first).set("ranges", ranges(stream, 0, 100))
        for hour, run_id in enumerate(later, start=1):
            store(client, stream, run_id).set("ranges", ranges(stream, 100 * hour, 100 * hour + 100))
        assert store(client, stream, first).get("ranges") == ranges(stream, 0, 100)
        assert store(client, stream, later[-1]).get("ranges") == ranges(stream, 2300, 2400)


def test_the_freeze_without_a_task_state_store_returns_each_runs_own_ranges(
    liftbridge_server: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freeze operator on the Airflow < 3.3 path (a context without task_state_store: the run's ranges go
    to the stream's cursors). Runs A and B of one DAG, running side by side, shared a slot before issue 47: A
    froze [0, 50), 30 messages landed, B froze [0, 80); A's retry still returns [0, 50), B's [0, 80). (Before:
    A's retry froze [0, 80) anew.) In this process, with the task instance's ids as the context's ``ti``."""
    from liftbridge_provider.operators.ranges import LiftbridgeOffsetRangesOperator  # noqa: PLC0415 - Airflow

    monkeypatch.setenv("AIRFLOW_CONN_STATE_TEST", json.dumps({"conn_type": "liftbridge",
                                                              "host": liftbridge_server.brokers[0]}))  # fmt: skip
    run_a, run_b = same_slot_runs()

    def freeze(run_id: str) -> dict[str, Any]:
        operator = LiftbridgeOffsetRangesOperator(
            task_id="freeze", stream=stream, cursor_id="ingest", liftbridge_conn_id="state_test"
        )
        ti = SimpleNamespace(dag_id="d", task_id="freeze", run_id=run_id, map_index=-1, try_number=1)
        return operator.execute({"run_id": run_id, "ti": ti})

    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = new_stream(client)
        client.publish_batch(stream, [b"early"] * 50)
        first_a = freeze(run_a)
        client.publish_batch(stream, [b"late"] * 30)
        first_b = freeze(run_b)
    assert [(r["start"], r["end"]) for r in first_a["ranges"]] == [(0, 50)]
    assert [(r["start"], r["end"]) for r in first_b["ranges"]] == [(0, 80)]
    assert freeze(run_a) == first_a, "run A's retry returns the ranges A froze"
    assert freeze(run_b) == first_b, "run B's retry returns the ranges B froze"
