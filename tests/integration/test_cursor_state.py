"""CursorStateStore: a task's state per DAG run in a stream's cursors (Airflow without a task state store)."""

from __future__ import annotations

import uuid

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.cursor_state import CursorStateStore
from liftbridge_provider.devserver import DevServer


def store(client: LiftbridgeClient, stream: str, run_id: str, task_id: str = "freeze") -> CursorStateStore:
    return CursorStateStore(client, stream, dag_id="d", task_id=task_id, run_id=run_id, map_index=-1)


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
    """While a value is being written its slot names no run: a try that died mid-write leaves nothing to read."""
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        stream = f"state-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream)
        kept = store(client, stream, "run-1")
        kept.set("ranges", {"a": 1})
        client.set_cursor(kept._cursor("ranges", "run"), stream, 0, 0)  # what set() writes first
        assert kept.get("ranges") is None
