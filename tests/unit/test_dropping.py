"""A large batch's prepared requests are freed off the caller's thread (client/publish/dropping.py), so a call
whose deadline passed returns without first freeing a million objects (0.7 s late under CPU contention)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from liftbridge_provider.client import AckPolicy
from liftbridge_provider.client.publish import dropping, prepare
from liftbridge_provider.client.publish.prepare import PreparedTooLong, batch_requests
from liftbridge_provider.client.retry import Deadline


class Freed:
    """Records the thread that freed it."""

    def __init__(self, record: list[str]) -> None:
        self.record = record

    def __del__(self) -> None:
        self.record.append(threading.current_thread().name)


def test_a_large_list_is_emptied_by_the_background_thread() -> None:
    record: list[str] = []
    items: list[Any] = [Freed(record) for _ in range(3 * dropping.CHUNK + 5)]
    dropping.drop_in_background(items)
    deadline = time.monotonic() + 30
    while items and time.monotonic() < deadline:
        time.sleep(0.01)
    assert items == [], "the background thread did not empty the list"
    assert len(record) == 3 * dropping.CHUNK + 5
    assert set(record) == {"liftbridge-drop"}, "every item must be freed by the background thread"


def test_a_small_list_is_left_to_the_caller() -> None:
    record: list[str] = []
    items: list[Any] = [Freed(record) for _ in range(dropping.CHUNK - 1)]
    dropping.drop_in_background(items)
    assert len(items) == dropping.CHUNK - 1
    del items
    assert set(record) == {threading.current_thread().name}


def test_requests_built_before_the_deadline_passed_are_handed_to_the_background_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline is checked every 1024 messages: the check after the pause finds it passed, and the 5120
    requests built until then go to drop_in_background instead of being freed while the exception unwinds."""
    handed: list[int] = []
    monkeypatch.setattr(prepare, "drop_in_background", lambda items: handed.append(len(items)))

    class OnePartition:
        def partition_count(self, stream: str, *, timeout: float | None = None) -> int:
            return 1

    def values() -> Iterator[bytes]:
        for index in range(20_000):
            if index == 5000:
                time.sleep(0.3)  # the deadline passes here
            yield b"x"

    with pytest.raises(PreparedTooLong) as late:
        batch_requests(OnePartition(), "s", values(), None, policy=AckPolicy.LEADER, deadline=Deadline(0.2))
    assert handed == [5120]
    assert late.value.count == 20_000
