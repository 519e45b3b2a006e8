"""Run as a script by test_event_publisher: a process with a connected event publisher forks; the child publishes.

It runs in a fresh interpreter, as Airflow's scheduler and task processes do,
so that no thread of another test is inside a gRPC call at the fork: gRPC
cannot copy such a call into a child (the child may abort; see
docs/airflow.md, "Forked processes"). Arguments: the broker address, the
stream, and how many children to fork one after the other. Prints one JSON
line: each child's exit code (0 only if its own event was published) and what
the parent published.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.events.publisher import EventPublisher

CHILD_DEADLINE = 30.0  # seconds a child may take (its drain is bounded by 15 s); then it is killed


def wait_for(pid: int, deadline: float) -> int | str:
    """The child's exit code, or "hung" once it was killed after ``deadline`` seconds (no child outlives us)."""
    ends = time.monotonic() + deadline
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > ends:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.01)


def main(broker: str, stream: str, children: int) -> None:
    events = EventPublisher(
        connect=lambda: LiftbridgeClient([broker], request_timeout=5.0),
        stream=stream,
        queue_size=1000,
        publish_timeout=5.0,
        retry_interval=0.0,
        on_drop=lambda reason, count: None,
    )
    events.offer(b"k", b'{"who": "parent"}')
    assert events.drain(30) == 0, "the parent's first event was not published"
    events.offer(b"k", b'{"who": "parent, queued at the fork"}', delay=600)
    codes: list[int | str] = []
    for child in range(children):
        pid = os.fork()
        if pid == 0:  # the child: exits with 0 only if its own event (and no other) was published
            try:
                events.offer(b"k", json.dumps({"who": f"child {child}"}).encode())
                left = events.drain(15)
                os._exit(0 if (left, events.published) == (0, 1) else 1)
            finally:
                os._exit(2)
        codes.append(wait_for(pid, CHILD_DEADLINE))
    left = events.drain(30)
    events.close(5)
    print(json.dumps({"children": codes, "parent_left": left, "parent_published": events.published}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
