"""The Airflow faces that move cursors, each by the one cursor-advance rule, run in this process against a
real node: the commit operator, the consume operator and the message sensor (the watchers' fence is tested
in test_watcher_delivery.py, the consumer's checkpoint in test_cursor_advance.py).

The tasks run with a minimal context (a run id and a task state store), as a worker would run them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from liftbridge_provider.client import LiftbridgeClient, Message, PublishMessage
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.operators.consume import LiftbridgeConsumeOperator
from liftbridge_provider.operators.ranges import LiftbridgeCommitCursorOperator, LiftbridgeOffsetRangesOperator
from liftbridge_provider.sensors.message import LiftbridgeMessageSensor
from tests.chaos.batch import StateStore


@pytest.fixture
def conn_id(liftbridge_server: DevServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A connection of its own for each test (the hook pools one client per connection and process)."""
    name = f"cursor_writers_{uuid.uuid4().hex[:8]}"
    connection = {"conn_type": "liftbridge", "host": liftbridge_server.brokers[0]}
    monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps(connection))
    return name


def new_stream(client: LiftbridgeClient, messages: int) -> str:
    name = f"cw-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    if messages:
        client.publish_batch(name, [PublishMessage(f"m{n}".encode(), partition=0) for n in range(messages)])
    return name


def context() -> dict[str, Any]:
    return {"run_id": "r1", "task_state_store": StateStore()}


def freeze(conn_id: str, stream: str, **options: Any) -> dict[str, Any]:
    operator = LiftbridgeOffsetRangesOperator(task_id="freeze", stream=stream, liftbridge_conn_id=conn_id, **options)
    document: dict[str, Any] = operator.execute(context())
    return document


def commit(conn_id: str, ranges: dict[str, Any]) -> dict[str, int]:
    operator = LiftbridgeCommitCursorOperator(task_id="commit", ranges=ranges, liftbridge_conn_id=conn_id)
    moved: dict[str, int] = operator.execute(context())
    return moved


def test_a_commit_of_ranges_behind_the_cursor_never_moves_it_back(conn_id: str, client: LiftbridgeClient) -> None:
    """Ranges frozen behind the cursor (a re-ingest of [0, 10) while the cursor is at 15, frozen from there):
    committing them would take the cursor back to 9. The commit fails without retries naming the offsets,
    and the cursor stays at 15."""
    stream = new_stream(client, 20)
    client.set_cursor("ingest", stream, 0, 15)
    ranges = freeze(conn_id, stream, cursor_id="ingest", start="earliest", end={0: 10})
    with pytest.raises(AirflowFailException, match=r"9 is behind 15, where this writer last saw the cursor"):
        commit(conn_id, ranges)
    assert client.fetch_cursor("ingest", stream, 0) == 15


def test_a_commit_never_moves_the_cursor_past_the_high_watermark(conn_id: str, client: LiftbridgeClient) -> None:
    """Ranges frozen with an explicit end past what the partition holds ({0: 1000} on 10 messages) and
    committed with no wait before: the cursor went to 999, the next freeze began at 1000, and the offsets
    published from 10 on were never ingested. The commit fails without retries naming the range and the high
    watermark, and the cursor stays where it was."""
    stream = new_stream(client, 10)
    client.set_cursor("ingest", stream, 0, 6)
    ranges = freeze(conn_id, stream, cursor_id="ingest", end={0: 1000})
    with pytest.raises(AirflowFailException, match=r"\[7, 1000\) ends past the committed high watermark 9"):
        commit(conn_id, ranges)
    assert client.fetch_cursor("ingest", stream, 0) == 6


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [('{"0": 3}', '{"0": 5}', (3, 5)), (" cursor ", '{"0": 9}', (7, 9)), ("cursor", "high_watermark", (7, 10))],
    ids=["json-text", "spaced-keyword", "keywords"],
)
def test_a_freeze_reads_start_and_end_rendered_as_text(
    conn_id: str, client: LiftbridgeClient, start: str, end: str, expected: tuple[int, int]
) -> None:
    """start and end given as XComArgs arrive as text when the upstream task returned JSON: any text end was
    read as "high_watermark" and any text start other than the keywords as "earliest", so '{"0": 3}' and
    '{"0": 5}' froze [0, 10). Text is read as the keyword it names or as {partition: offset} JSON."""
    stream = new_stream(client, 10)
    client.set_cursor("ingest", stream, 0, 6)
    operator = LiftbridgeOffsetRangesOperator(
        task_id="freeze", stream=stream, liftbridge_conn_id=conn_id, cursor_id="ingest", start={0: 0}, end={0: 1}
    )
    operator.start, operator.end = start, end  # type: ignore[assignment] # as the rendered XComArgs
    document = operator.execute(context())
    (offset_range,) = document["ranges"]
    assert (offset_range["start"], offset_range["end"]) == expected


def test_a_freeze_refuses_text_that_is_neither_a_keyword_nor_offsets(conn_id: str, client: LiftbridgeClient) -> None:
    stream = new_stream(client, 10)
    operator = LiftbridgeOffsetRangesOperator(
        task_id="freeze", stream=stream, liftbridge_conn_id=conn_id, cursor_id="ingest", start={0: 0}
    )
    operator.start = "latest"  # type: ignore[assignment]
    with pytest.raises(AirflowFailException, match=r"start must be 'cursor', 'earliest', 'delta'.*got 'latest'"):
        operator.execute(context())


def test_a_commit_overwritten_right_after_it_fails_the_task(
    conn_id: str, client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer sets the cursor right after the commit's SetCursor: the commit reads it back, and fails
    without retries saying its write was overwritten (before, it reported success). A commit that nobody
    overwrites succeeds and a repeated one is a no-op."""
    stream = new_stream(client, 12)
    ranges = freeze(conn_id, stream, cursor_id="ingest")
    real_set = LiftbridgeClient.set_cursor

    def set_then_overwritten(self: LiftbridgeClient, cursor_id: str, stream: str, partition: int, offset: int,
                             **kw: Any) -> None:  # fmt: skip
        real_set(self, cursor_id, stream, partition, offset, **kw)
        real_set(client, cursor_id, stream, partition, 4)  # the other writer

    with monkeypatch.context() as patched:
        patched.setattr(LiftbridgeClient, "set_cursor", set_then_overwritten)
        with pytest.raises(AirflowFailException, match=r"read back 4 right after it was set to 11"):
            commit(conn_id, ranges)
    assert client.fetch_cursor("ingest", stream, 0) == 4
    client.set_cursor("ingest", stream, 0, -1)
    assert commit(conn_id, ranges) == {"0": 11}
    assert commit(conn_id, ranges) == {"0": 11}, "a repeated commit finds the cursor there"
    assert client.fetch_cursor("ingest", stream, 0) == 11


def consume(conn_id: str, stream: str, handle: Any, **options: Any) -> dict[str, Any]:
    operator = LiftbridgeConsumeOperator(
        task_id="consume", stream=stream, cursor_id="ingest", liftbridge_conn_id=conn_id, apply_function=handle,
        **options,
    )  # fmt: skip
    output: dict[str, Any] = operator.execute(context())
    return output


def test_a_consume_task_whose_cursor_another_writer_moves_fails_and_leaves_it(
    conn_id: str, client: LiftbridgeClient
) -> None:
    """A consume task committing after each batch of 5: another writer moves the cursor while the second batch
    is handled. The task's next commit fails without retries, naming where it found the cursor, and the
    other writer's cursor stays."""
    stream = new_stream(client, 15)

    def handle(message: Message) -> None:
        if message.offset == 7:
            client.set_cursor("ingest", stream, 0, 12)

    with pytest.raises(AirflowFailException, match=r"is at 12, expected 4: someone else moved it"):
        consume(conn_id, stream, handle, commit_cadence="end_of_batch", max_batch_size=5)
    assert client.fetch_cursor("ingest", stream, 0) == 12


def test_a_consume_task_of_ranges_behind_the_cursor_never_moves_it_back(conn_id: str, client: LiftbridgeClient) -> None:
    """A consume task that reads [0, 10) from the earliest offset while the cursor is at 15 handles the
    messages, but its commit would take the cursor back to 9: it fails without retries, cursor at 15."""
    stream = new_stream(client, 20)
    client.set_cursor("ingest", stream, 0, 15)
    handled: list[int] = []
    with pytest.raises(AirflowFailException, match=r"9 is behind 15, where this writer last saw the cursor"):
        consume(conn_id, stream, lambda m: handled.append(m.offset), start="earliest", end={0: 10})
    assert handled == list(range(10))
    assert client.fetch_cursor("ingest", stream, 0) == 15


def test_the_message_sensor_moves_its_cursor_to_the_match_but_never_back(
    conn_id: str, client: LiftbridgeClient
) -> None:
    """With commit_cursor, a match at offset 6 moves the cursor from 2 to 6; a match at 6 when another writer
    already moved the cursor to 9 leaves it at 9 (the task still succeeds: the match stands)."""
    stream = new_stream(client, 10)
    for cursor, expected in ((2, 6), (9, 9)):
        client.set_cursor("sensed", stream, 0, cursor)
        sensor = LiftbridgeMessageSensor(
            task_id="sense", stream=stream, start={0: 0}, cursor_id="sensed", commit_cursor=True,
            apply_function=lambda m: m.offset == 6, liftbridge_conn_id=conn_id,
        )  # fmt: skip
        result = sensor.poke(context())
        assert result.is_done
        assert result.xcom_value is not None
        assert result.xcom_value["offset"] == 6
        assert client.fetch_cursor("sensed", stream, 0) == expected
