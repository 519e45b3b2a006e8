"""A probe for lost cancellations: cancel a call after each number of task switches, see what it did."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def cancelled_at_each_switch(call: Callable[[], Awaitable[Any]], switches: int) -> list[str]:
    """For 0 .. ``switches`` - 1 task switches: start ``call()`` in a task, let it run that many switches,
    cancel it; each outcome is "finished first", "cancelled" or "went on" (the cancellation was lost)."""

    async def run() -> Any:
        return await call()

    async def at(count: int) -> str:
        task = asyncio.create_task(run())
        for _ in range(count):
            await asyncio.sleep(0)
        if not task.cancel():
            return "finished first"
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "went on"

    return [await at(count) for count in range(switches)]
