"""How a dev server's start waits until it is ready, and the two start-up failures of the pinned Liftbridge it
recovers from instead of failing a caller's test.

Both are server behaviours on a loaded machine, not the caller's doing; each gets one more try within the
start's own time:

- a lone node can panic while it becomes the metadata leader (its first Raft apply times out, it steps down,
  and stepping down panics, "cannot find peer"); its data is intact and it starts again;
- a cluster can form whose metadata leader never lists one running node that serves gRPC ("knows brokers
  [n1, n2], expected 3" for the whole 90 s, seen once in a whole run of the suite); such a cluster is stopped
  and started anew.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from liftbridge_provider.devserver.errors import DevServerError
from liftbridge_provider.devserver.readiness import UNFORMED

log = logging.getLogger(__name__)

STARTUP_PANIC = "error on metadata leadership step down"
"""What the log of a lone node that panicked while it became the metadata leader ends with."""


class _Process(Protocol):
    def log_tail(self, lines: int = ...) -> str: ...


class _Node(Protocol):
    @property
    def server_id(self) -> str: ...

    @property
    def process(self) -> _Process: ...

    @property
    def running(self) -> bool: ...


class _Server(Protocol):
    def wait_ready(self, timeout: float = ...) -> None: ...

    def restart(self, server_id: str, timeout: float = ...) -> object: ...


class Unformed(Exception):
    """A cluster's nodes run, but its metadata leader still lists only some of them: start it anew."""


def wait_ready_once_more_after_a_startup_panic(server: _Server, node: _Node, timeout: float) -> None:
    """``server.wait_ready(timeout)``; a lone node that exited with :data:`STARTUP_PANIC` is started once more."""
    try:
        server.wait_ready(timeout)
    except DevServerError:
        if node.running or STARTUP_PANIC not in node.process.log_tail():
            raise
        server.restart(node.server_id, timeout)


def wait_formed(server: _Server, deadline: float, *, last_attempt: bool) -> None:
    """A cluster ready by ``deadline`` (``time.monotonic()``). A first start gets half the time left: if its
    nodes then still do not all know each other, :class:`Unformed` (the caller starts the cluster anew);
    anything else not ready yet gets the rest of the time, as a slow start. The last attempt gets all of it
    and raises DevServerError."""
    try:
        server.wait_ready((deadline - time.monotonic()) / (1 if last_attempt else 2))
    except DevServerError as exc:
        if last_attempt:
            raise
        if UNFORMED in str(exc).partition("\n")[0]:
            log.warning("a dev cluster formed without all its nodes; starting it anew: %s", str(exc)[:300])
            raise Unformed(str(exc)) from exc
        server.wait_ready(max(deadline - time.monotonic(), 0.0))
