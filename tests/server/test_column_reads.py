"""The column read path (``Subscription.column_batches``, the Spark task's read) against a real server: every
offset of a range exactly once, however often the Subscribe call is reopened in the middle of a batch."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from liftbridge_provider.client import LiftbridgeClient, StartPosition, StopPosition, columns
from liftbridge_provider.client import subscription as subscription_module
from liftbridge_provider.devserver import DevServer

BUILDERS = [pytest.param(False, id="compiled")] if columns.NATIVE else []
BUILDERS.append(pytest.param(True, id="pure-python"))
MESSAGES = 30_000


@pytest.fixture(scope="module")
def filled_stream(client: LiftbridgeClient) -> str:
    name = f"cols-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    client.publish_batch(name, [f"m{i}".encode() for i in range(MESSAGES)], ack_policy="leader")
    return name


def column_offsets(client: LiftbridgeClient, stream: str, *, max_rows: int) -> tuple[list[int], int]:
    """Every offset the column path delivers for the whole stream, and how many batches carried them."""
    subscription = client.subscribe(
        stream, start=StartPosition.at_offset(0), stop=StopPosition.at_offset(MESSAGES - 1), timeout=120
    )
    offsets: list[int] = []
    batches = 0
    with subscription:
        for batch in subscription.column_batches(max_rows=max_rows, max_bytes=1 << 30):
            offsets += batch.offsets_list()
            batches += 1
    return offsets, batches


def use_builder(monkeypatch: pytest.MonkeyPatch, pure_python: bool) -> None:
    """The Subscription makes its builders of the given kind (the process's own is the compiled one)."""
    if pure_python:
        monkeypatch.setattr(subscription_module, "new_builder", columns.PYTHON_BUILDER)


@pytest.mark.parametrize("pure_python", BUILDERS)
def test_a_call_reopened_in_the_middle_of_a_batch_repeats_no_offset(
    node: DevServer, filled_stream: str, pure_python: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each Subscribe call lives at most liveness_interval seconds. When one ended while the builder held
    messages the subscription had not been told of yet, the next call started from the last offset the
    subscription knew, and the builder took those messages again: a Spark task wrote up to a batch of
    rows twice (1,003,835 rows for a range of 1,000,000). Calls of 10 ms here end many times per batch."""
    use_builder(monkeypatch, pure_python)
    with LiftbridgeClient(node.brokers, liveness_interval=0.01) as short_calls:
        offsets, batches = column_offsets(short_calls, filled_stream, max_rows=MESSAGES)
    repeated = {offset: count for offset, count in Counter(offsets).items() if count > 1}
    assert not repeated, f"{len(repeated)} offsets came more than once, e.g. {sorted(repeated)[:5]}"
    assert offsets == list(range(MESSAGES)), "every offset, in order"
    assert batches == 1


def test_calls_reopened_between_full_batches_repeat_no_offset(node: DevServer, filled_stream: str) -> None:
    """The same with batches that fill within a call: the subscription is told at each full batch, and a
    reopened call starts right after the last row of the batch it was building."""
    with LiftbridgeClient(node.brokers, liveness_interval=0.01) as short_calls:
        offsets, batches = column_offsets(short_calls, filled_stream, max_rows=700)
    assert offsets == list(range(MESSAGES))
    assert batches == -(-MESSAGES // 700)
