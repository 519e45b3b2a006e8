"""``within``: bounded awaits that never drop a cancellation (Python 3.11's ``asyncio.wait_for`` can)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from liftbridge_provider.client.aio_timeout import within

PACKAGE = Path(__file__).resolve().parents[2] / "liftbridge_provider"


async def soon(switches: int) -> str:
    for _ in range(switches):
        await asyncio.sleep(0)
    return "result"


def outcomes_of(bounded: object) -> list[str]:
    """Cancel ``bounded(soon(2))`` after each number of task switches: what the cancelled task did."""

    async def bounded_soon() -> object:
        return await bounded(5.0, soon(2))  # type: ignore[operator]

    async def at(switches: int) -> str:
        task = asyncio.create_task(bounded_soon())
        for _ in range(switches):
            await asyncio.sleep(0)
        if not task.cancel():
            return "finished first"
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "went on"

    async def every() -> list[str]:
        return [await at(switches) for switches in range(8)]

    return asyncio.run(every())


def test_a_cancelled_bounded_await_is_cancelled_at_every_point() -> None:
    outcomes = outcomes_of(within)
    assert "finished first" in outcomes
    assert "cancelled" in outcomes
    assert "went on" not in outcomes, outcomes


def test_the_standard_wait_for_drops_a_cancellation_before_python_3_12() -> None:
    """Why ``within`` exists: on Python 3.11 the same probe finds ``asyncio.wait_for`` going on after a
    cancellation (3.12 rebuilt it on ``asyncio.timeout``)."""

    def wait_for(seconds: float, awaitable: object) -> object:
        return asyncio.wait_for(awaitable, seconds)  # type: ignore[arg-type]

    assert ("went on" in outcomes_of(wait_for)) == (sys.version_info < (3, 12))


def test_the_package_bounds_no_await_with_asyncio_wait_for() -> None:
    uses = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(", line)
    ]
    assert not uses, f"use aio_timeout.within instead of asyncio.wait_for: {uses}"


def test_within_raises_timeout_error_when_its_seconds_pass() -> None:
    with pytest.raises(TimeoutError):
        asyncio.run(within(0.01, asyncio.sleep(5)))
    assert asyncio.run(within(None, soon(1))) == "result"
