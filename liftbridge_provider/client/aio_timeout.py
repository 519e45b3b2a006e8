"""``within``: an await bounded in time that never loses a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when its task is
cancelled just as that result arrives, and the cancelled task goes on (fixed
in 3.12). ``asyncio.timeout`` runs the await in the caller's task, so a
cancellation always reaches the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(seconds: float | None, awaitable: Awaitable[T]) -> T:
    """``await awaitable`` for at most ``seconds`` (None: no limit); TimeoutError when they pass."""
    async with asyncio.timeout(seconds):
        return await awaitable
