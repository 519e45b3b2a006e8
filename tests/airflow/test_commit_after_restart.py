"""The commit operator on a partition whose high watermark moved back (chaos seed 88, docs/reliability.md).

A single-replica (replication factor 1) leader that restarts after a crash
takes the high watermark of its last checkpoint (Liftbridge v1.9.0 writes one
every 5 s), and commits again only with the next message published to it.
Seed 88 froze ``[0, 49)`` of such a partition (committed then), ingested it,
and the commit, run after the broker's restart, found the high watermark at -1
and refused the range with AirflowFailException: no retries, a run failed for
good on a transient server state, with its data in the lake.

These tests run the freeze and commit operators in this process (as a worker
would) against a node of their own, which they SIGKILL and start again right
after the freeze, so that its high watermark comes back below the range.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.ranges import FROZEN_HIGH_WATERMARKS
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.operators.ranges import LiftbridgeCommitCursorOperator, LiftbridgeOffsetRangesOperator
from tests.chaos.batch import StateStore

MESSAGES = 49  # seed 88's range: [0, 49)
CONN_ID = "commit_after_restart"
ATTEMPTS = 3  # a checkpoint written between the publish and the kill (a 5 s timer) leaves nothing moved back


@dataclass(frozen=True)
class Restarted:
    """A stream frozen and read whole, then its only broker killed and started again."""

    server: DevServer
    stream: str
    document: dict[str, Any]
    high_watermark: int  # after the restart
    newest_offset: int


def context() -> dict[str, Any]:
    return {"run_id": "r1", "task_state_store": StateStore()}


def commit(ranges: dict[str, Any], cursor_id: str | None = None) -> dict[str, int]:
    operator = LiftbridgeCommitCursorOperator(
        task_id="commit", ranges=ranges, cursor_id=cursor_id, liftbridge_conn_id=CONN_ID
    )
    moved: dict[str, int] = operator.execute(context())
    return moved


def _freeze_and_restart(server: DevServer) -> Restarted:
    stream = f"hw-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(server.brokers, request_timeout=5) as client:
        client.create_stream(stream, stream, replication_factor=1)
        client.publish_batch(stream, [PublishMessage(f"m{n}".encode(), partition=0) for n in range(MESSAGES)])
        freeze = LiftbridgeOffsetRangesOperator(
            task_id="freeze", stream=stream, cursor_id="ingest", liftbridge_conn_id=CONN_ID
        )
        document: dict[str, Any] = freeze.execute(context())
        assert document["ranges"] == [{"partition": 0, "start": 0, "end": MESSAGES}]
        # What the ingest does: read the range whole, which needs it committed.
        read = list(client.read_range(stream, 0, 0, MESSAGES))
        assert [m.offset for m in read] == list(range(MESSAGES))
    server.kill("n1")
    server.restart("n1")
    with LiftbridgeClient(server.brokers, request_timeout=5) as client:
        info = client.fetch_partition_metadata(stream, 0)
    return Restarted(server, stream, document, info.high_watermark, info.newest_offset)


@pytest.fixture(scope="module")
def restarted() -> Iterator[Restarted]:
    """A node of this module's own (it is killed), and a stream whose high watermark the restart moved back
    below the frozen range's last offset while the leader still holds it."""
    with start_single() as server, pytest.MonkeyPatch.context() as patch:
        extra = {"request_timeout": 3}  # the commit waits this long for a commit that does not come
        connection = {"conn_type": "liftbridge", "host": server.brokers[0], "extra": extra}
        patch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
        seen = []
        for _ in range(ATTEMPTS):
            found = _freeze_and_restart(server)
            seen.append((found.high_watermark, found.newest_offset))
            if found.high_watermark < MESSAGES - 1 <= found.newest_offset:
                yield found
                return
            time.sleep(1)
        pytest.fail(f"no restart moved the high watermark back below {MESSAGES - 1}: (hw, newest) {seen}")


def _cursor(restarted: Restarted, cursor_id: str) -> int:
    with LiftbridgeClient(restarted.server.brokers, request_timeout=5) as client:
        return client.fetch_cursor(cursor_id, restarted.stream, 0)


def test_a_commit_of_a_range_the_freeze_saw_committed_moves_the_cursor_when_the_high_watermark_moved_back(
    restarted: Restarted, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 88: the freeze saw [0, 49) committed (high watermark 48), the ingest read it, the only broker
    restarted with its high watermark back at its last checkpoint, and the leader still holds offsets 0-48.
    The commit moves the cursor to 48 with a warning naming the partition, the high watermark and the held
    offsets; before the fix it failed without retries ("ends past the committed high watermark -1")."""
    assert restarted.document["metadata"][FROZEN_HIGH_WATERMARKS] == {"0": MESSAGES - 1}
    capsys.readouterr()
    assert commit(restarted.document) == {"0": MESSAGES - 1}
    assert _cursor(restarted, "ingest") == MESSAGES - 1
    # Airflow's task logger (structlog) writes to stdout: "<time> [warning  ] <message> [<logger>] ..."
    warned = [line for line in capsys.readouterr().out.splitlines() if "[warning" in line]
    assert any(
        f"partition 0: the high watermark {restarted.high_watermark} moved back below the range [0, {MESSAGES})" in line
        and f"the leader still holds offsets up to {restarted.newest_offset}" in line
        for line in warned
    ), warned
    assert commit(restarted.document) == {"0": MESSAGES - 1}, "committing again is a no-op"


def test_a_commit_without_the_freezes_high_watermark_is_retried_while_the_high_watermark_is_back(
    restarted: Restarted,
) -> None:
    """A document that does not say what the freeze saw committed (one frozen before the freeze recorded it,
    or written by hand) gives no proof that [0, 49) was ever committed: the commit refuses it, but with a
    retryable error (Airflow's retries try again once the next publish has committed the offsets again),
    naming the partition, the range, the high watermark and what to do; the cursor stays."""
    document = dict(restarted.document, metadata={})  # no record: nor the frozen cursor (expected: -1)
    with pytest.raises(AirflowException) as refused:
        commit(document, cursor_id="legacy")
    assert not isinstance(refused.value, AirflowFailException), f"retryable, not {refused.value!r}"
    message = str(refused.value)
    assert f"partition 0: the range [0, {MESSAGES}) ends past the committed high watermark" in message, message
    assert f"high watermark {restarted.high_watermark}" in message, message
    assert f"the leader holds offsets up to {restarted.newest_offset}" in message, message
    assert "retried" in message, message
    assert _cursor(restarted, "legacy") == -1


def test_a_commit_of_offsets_the_freeze_saw_committed_but_the_leader_no_longer_holds_is_retried(
    restarted: Restarted,
) -> None:
    """The freeze saw offsets committed that the partition's leader no longer holds (a log truncated behind
    them, or a leader without them): nothing proves the ingest's offsets are still those, so the cursor does
    not move, but the error is retryable (a leader change may bring them back), names the partition, the
    range, the high watermark and the newest offset, and says what to do."""
    document = {
        **restarted.document,
        "ranges": [{"partition": 0, "start": 0, "end": MESSAGES + 10}],
        "metadata": {**restarted.document["metadata"], FROZEN_HIGH_WATERMARKS: {"0": MESSAGES + 9}},
    }
    with pytest.raises(AirflowException) as refused:
        commit(document, cursor_id="truncated")
    assert not isinstance(refused.value, AirflowFailException), f"retryable, not {refused.value!r}"
    message = str(refused.value)
    assert f"partition 0: the range [0, {MESSAGES + 10}) ends past the committed high watermark" in message
    assert f"the freeze saw them committed (high watermark {MESSAGES + 9})" in message, message
    assert f"the leader holds offsets only up to {restarted.newest_offset}" in message, message
    assert _cursor(restarted, "truncated") == -1
