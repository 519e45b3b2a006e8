"""run_in_private_loop: the coroutine's thread stops when its caller stops waiting (no server: pure asyncio)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from liftbridge_provider.client import ClientClosedError
from liftbridge_provider.client.publish.private_loop import run_in_private_loop


def test_result_and_error_come_back_to_the_caller() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def failing() -> None:
        raise ValueError("from the loop")

    assert run_in_private_loop(answer(), name="unit-loop") == 42
    with pytest.raises(ValueError, match="from the loop"):
        run_in_private_loop(failing(), name="unit-loop")


def test_closing_cancels_the_running_coroutine_and_raises_client_closed() -> None:
    """The client closes while the coroutine runs: it is cancelled (its cleanup runs), and the caller gets
    ClientClosedError promptly instead of waiting for the work to finish."""
    steps: list[str] = []
    closed = threading.Event()

    async def endless() -> None:
        steps.append("started")
        try:
            while True:
                await asyncio.sleep(0.01)
        finally:
            steps.append("cleaned up")

    threading.Timer(0.3, closed.set).start()
    started = time.monotonic()
    with pytest.raises(ClientClosedError) as raised:
        run_in_private_loop(endless(), name="unit-loop", closed=closed.is_set)
    assert time.monotonic() - started < 3
    assert raised.value.may_be_stored
    assert steps == ["started", "cleaned up"]
