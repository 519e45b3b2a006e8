"""``within``: bounded awaits that never drop a cancellation (Python 3.11's ``asyncio.wait_for`` can)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client.aio_timeout import within
from tests.cancellation import cancelled_at_each_switch

PACKAGE = Path(__file__).resolve().parents[2] / "liftbridge_provider"


async def soon(switches: int) -> str:
    for _ in range(switches):
        await asyncio.sleep(0)
    return "result"


def outcomes_of(bounded: Any) -> list[str]:
    """What ``bounded(5.0, soon(2))`` did when cancelled after each number of task switches."""
    return asyncio.run(cancelled_at_each_switch(lambda: bounded(5.0, soon(2)), 8))


def test_a_cancelled_bounded_await_is_cancelled_at_every_point() -> None:
    outcomes = outcomes_of(within)
    assert "finished first" in outcomes
    assert "cancelled" in outcomes
    assert "went on" not in outcomes, outcomes


def test_the_standard_wait_for_drops_a_cancellation_before_python_3_12() -> None:
    """Why ``within`` exists: on Python 3.11 the same probe finds ``asyncio.wait_for`` going on after a
    cancellation (3.12 rebuilt it on ``asyncio.timeout``)."""

    def wait_for(seconds: float, awaitable: Any) -> Any:
        return asyncio.wait_for(awaitable, seconds)

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
