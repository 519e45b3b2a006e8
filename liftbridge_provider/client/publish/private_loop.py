"""Run a coroutine to completion on a private event loop in its own thread.

The batch publishers run on asyncio (far less CPU per message than gRPC's
threaded streaming API or a blocking socket), but are called from synchronous
code that may itself be inside a running loop (a notebook, an Airflow
triggerer): a thread of its own keeps them apart.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _run_loop(coroutine: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    """Run ``coroutine`` in a new event loop: uvloop's when installed and wanted (less CPU per message)."""
    if not use_uvloop:
        return asyncio.run(coroutine)
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def run_in_private_loop(coroutine: Coroutine[Any, Any, T], *, name: str, use_uvloop: bool = True) -> T:
    """Run ``coroutine`` on a new loop in a daemon thread called ``name``; return its result or raise its error."""
    outcome: list[T] = []
    errors: list[BaseException] = []

    def main() -> None:
        try:
            outcome.append(_run_loop(coroutine, use_uvloop))
        except BaseException as exc:  # handed to the calling thread below
            errors.append(exc)

    worker = threading.Thread(target=main, name=name, daemon=True)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return outcome[0]
