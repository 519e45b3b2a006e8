"""Run a coroutine to completion on a private event loop in its own thread.

The batch publishers run on asyncio (far less CPU per message than gRPC's
threaded streaming API or a blocking socket), but are called from synchronous
code that may itself be inside a running loop (a notebook, an Airflow
triggerer): a thread of its own keeps them apart.

The work stops when its caller stops waiting for it: a caller interrupted in
the wait (Ctrl-C, or the exception Airflow's SIGTERM handler raises in a task
being killed) cancels the coroutine, and so does the client's ``close()``;
otherwise the thread would go on sending after the caller has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from liftbridge_provider.client.errors import ClientClosedError

T = TypeVar("T")
CLOSED_CHECK = 0.1  # seconds between the waiting caller's looks at ``closed()``
STOP_WAIT = 5.0  # seconds the caller waits for the cancelled coroutine to end before it leaves anyway


def _new_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed and wanted (less CPU per message), else asyncio's default."""
    if use_uvloop:
        try:
            import uvloop  # noqa: PLC0415 - optional speed-up
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _run_to_end(coroutine: Coroutine[Any, Any, T], use_uvloop: bool, name: str) -> T:
    """Run ``coroutine`` on a new loop and close the loop as ``asyncio.run`` does, except that the loop's
    executor threads are not waited for: a name lookup (``getaddrinfo`` runs there) that outlives the
    coroutine's deadline would otherwise hold the caller until it returned, for as long as the resolver takes."""
    loop = _new_loop(use_uvloop)
    executor = ThreadPoolExecutor(thread_name_prefix=f"{name}-lookup")
    loop.set_default_executor(executor)
    try:
        return loop.run_until_complete(coroutine)
    finally:
        try:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()


def run_in_private_loop(
    coroutine: Coroutine[Any, Any, T],
    *,
    name: str,
    use_uvloop: bool = True,
    closed: Callable[[], bool] = lambda: False,
) -> T:
    """Run ``coroutine`` on a new loop in a daemon thread called ``name``; return its result or raise its error.

    When ``closed()`` turns true (checked every ``CLOSED_CHECK`` s) the coroutine is cancelled and
    ClientClosedError (``may_be_stored``: what was sent before may have been stored) is raised; when the wait
    is interrupted, the coroutine is cancelled and the interruption raised. Either way the caller waits up to
    ``STOP_WAIT`` s for the coroutine to end (a coroutine that ignores its cancellation longer is left running).
    """
    outcome: list[T] = []
    errors: list[BaseException] = []
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []
    stopped = threading.Event()

    async def tracked() -> T:
        task = asyncio.current_task()
        assert task is not None
        running.append((asyncio.get_running_loop(), task))
        if stopped.is_set():  # cancelled before it started: _cancel may not have seen the task
            coroutine.close()
            raise asyncio.CancelledError()
        return await coroutine

    def main() -> None:
        try:
            outcome.append(_run_to_end(tracked(), use_uvloop, name))
        except BaseException as exc:  # handed to the calling thread below
            errors.append(exc)

    worker = threading.Thread(target=main, name=name, daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(CLOSED_CHECK)
            if worker.is_alive() and closed():
                _cancel(stopped, running, worker)
                raise ClientClosedError(
                    "the Liftbridge client was closed while a batch was being published; messages sent before "
                    "may have been stored",
                    may_be_stored=True,
                )
    except BaseException:
        _cancel(stopped, running, worker)
        raise
    if errors:
        raise errors[0]
    return outcome[0]


def _cancel(
    stopped: threading.Event,
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]],
    worker: threading.Thread,
) -> None:
    """Cancel the coroutine (or stop it from starting) and wait up to ``STOP_WAIT`` s for its thread to end."""
    stopped.set()
    for loop, task in list(running):
        with contextlib.suppress(RuntimeError):  # the loop has closed: the coroutine is over
            loop.call_soon_threadsafe(task.cancel)
    worker.join(STOP_WAIT)
