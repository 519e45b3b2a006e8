"""Waiting on a condition instead of sleeping a fixed time: the one poll loop the server-facing tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from liftbridge_provider.client import LiftbridgeError

POLL = 0.1  # seconds between two looks at the condition


def wait_until(condition: Callable[[], Any], timeout: float, what: str, *, poll: float = POLL) -> None:
    """Return once ``condition()`` is true; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def wait_until_answered(condition: Callable[[], Any], timeout: float, what: str) -> None:
    """Like :func:`wait_until`, but a ``LiftbridgeError`` from the condition means "ask again": a cluster
    that is electing a leader answers with errors for a while."""

    def answered() -> bool:
        try:
            return bool(condition())
        except LiftbridgeError:
            return False

    wait_until(answered, timeout, what)
