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
import sys

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.events.publisher import EventPublisher


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
    codes = []
    for child in range(children):
        pid = os.fork()
        if pid == 0:  # the child: exits with 0 only if its own event (and no other) was published
            try:
                events.offer(b"k", json.dumps({"who": f"child {child}"}).encode())
                left = events.drain(15)
                os._exit(0 if (left, events.published) == (0, 1) else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    left = events.drain(30)
    events.close(5)
    print(json.dumps({"children": codes, "parent_left": left, "parent_published": events.published}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
