"""Named fault points: the places where a test may make this process fail as a crash would.

Product code calls :func:`reached` at a step boundary that a crash test needs
(for example between the ingest job's claim and its write). Nothing happens
unless a test armed that name, either in this process with :func:`armed`
(the action is any callable: raise, wait on an event, kill) or in a child
process through the environment variable ``LIFTBRIDGE_FAULT_POINTS``, a comma
separated list of ``name=action`` where action is

- ``exit``: end the process at once with status 75 (``os._exit``: no cleanup,
  as after SIGKILL, but a status the test can tell from a real failure);
- ``kill-group``: SIGKILL the process's whole process group (a triggerer and
  its supervised children die together);
- ``kill-session``: SIGKILL the process group of the process's session leader
  (a Spark Python worker, whose daemon made a group of its own, kills the
  ``spark-submit`` a test started with ``start_new_session``, its JVM and its
  Python driver: a driver killed in the middle of Spark's work);
- ``raise``: raise :class:`FaultPointError` (an unexpected error at that step).

One module for every fault point, so that the product's code paths hold no
test-only branches of their own, and every point is listed by grepping
``fault_points.reached``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

log = logging.getLogger("liftbridge.fault_points")

ENV = "LIFTBRIDGE_FAULT_POINTS"
EXIT_STATUS = 75  # the status of a process ended by an armed "exit" point

_lock = threading.Lock()
_armed: dict[str, Callable[[str], object]] = {}


def _exit(name: str) -> None:
    log.error("fault point %r: exiting with status %d (%s)", name, EXIT_STATUS, ENV)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    os._exit(EXIT_STATUS)


def _kill_group(name: str) -> None:
    log.error("fault point %r: killing process group %d (%s)", name, os.getpgrp(), ENV)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _kill_session(name: str) -> None:
    leader = os.getsid(0)
    log.error("fault point %r: killing the process group of session leader %d (%s)", name, leader, ENV)
    os.killpg(leader, signal.SIGKILL)


class FaultPointError(RuntimeError):
    """Raised by a fault point armed with ``raise``."""


def _raise(name: str) -> None:
    raise FaultPointError(f"fault point {name!r} armed to raise ({ENV})")


ACTIONS: dict[str, Callable[[str], object]] = {
    "exit": _exit,
    "kill-group": _kill_group,
    "kill-session": _kill_session,
    "raise": _raise,
}


def parse(spec: str) -> dict[str, str]:
    """``{point: action}`` from the environment variable's value; ValueError naming a malformed item."""
    points = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        if not sep or not name or action not in ACTIONS:
            raise ValueError(f"{ENV}: {item!r} is not name=action with action one of {sorted(ACTIONS)}")
        points[name] = action
    return points


def reached(name: str) -> None:
    """Run the action armed for ``name``, if any (none in production: a dictionary lookup and an env read)."""
    action = _armed.get(name)
    if action is None:
        spec = os.environ.get(ENV)
        if not spec:
            return
        chosen = parse(spec).get(name)
        if chosen is None:
            return
        action = ACTIONS[chosen]
    action(name)


@contextmanager
def armed(name: str, action: Callable[[str], object]) -> Iterator[None]:
    """Arm ``name`` in this process while the block runs: ``action(name)`` runs at each :func:`reached`."""
    with _lock:
        if name in _armed:
            raise RuntimeError(f"fault point {name!r} is armed already")
        _armed[name] = action
    try:
        yield
    finally:
        with _lock:
            _armed.pop(name, None)
