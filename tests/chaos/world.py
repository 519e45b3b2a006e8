"""The running state of one seed: the cluster, its streams, the ledger, the lake, the runs, what was last seen."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from tests.chaos.batch import BatchPath, BatchRun
from tests.chaos.delta import DeltaLake
from tests.chaos.lake import Lake
from tests.chaos.ledger import Ledger
from tests.chaos.oracle import Snapshot
from tests.chaos.streams import StreamShape
from tests.chaos.timing import CallTimer


@dataclass(frozen=True)
class Timeouts:
    """Seconds. Every client call of the harness passes one of these as its deadline."""

    request: float = 5.0  # ClientConfig.request_timeout (the client's and the operators' connection)
    publish: float = 5.0  # one sync publish
    batch: float = 10.0  # one publish_batch
    ack_wait: float = 3.0  # per-message ack timeout of publish_batch
    read: float = 8.0  # the oracle's full read of one partition
    settle: float = 6.0  # after a restart or thaw, the cluster counts as impaired this long
    resubscribe_wait: float = 5.0


@dataclass
class World:
    seed: int
    cluster: DevServer
    client: LiftbridgeClient
    timer: CallTimer
    ledger: Ledger
    lake: Lake
    batch: BatchPath
    shapes: dict[str, StreamShape]
    timeouts: Timeouts
    delta: DeltaLake
    runs: dict[tuple[str, int], BatchRun] = field(default_factory=dict)
    snapshots: dict[tuple[str, int], Snapshot] = field(default_factory=dict)
    cursors: dict[tuple[str, int], int] = field(default_factory=dict)
    killed: list[str] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)  # nodes that died on their own (not yet reported)
    readonly: set[tuple[str, int]] = field(default_factory=set)
    reused: list[str] = field(default_factory=list)  # offsets acked twice, not yet reported
    # positions whose high watermark moved back, with the high watermark they had before, until it is back
    hw_back: dict[tuple[str, int], int] = field(default_factory=dict)
    calm_since: float = field(default_factory=time.monotonic)

    @property
    def impaired(self) -> str | None:
        """Why the cluster is not healthy now (a node down or frozen, or settling), or None.

        A node whose server died on its own (a server crash) counts as killed from then on: it is
        restarted like one, and the crash is reported as a note.
        """
        for node in self.cluster.nodes:
            if node.server_id not in self.killed and not node.process.running:
                self.killed.append(node.server_id)
                self.crashed.append(node.server_id)
        if self.killed:
            return f"{', '.join(self.killed)} killed"
        if self.cluster.frozen:
            return f"{', '.join(self.cluster.frozen)} frozen"
        settling = self.timeouts.settle - (time.monotonic() - self.calm_since)
        if settling > 0:
            return f"settling for {settling:.1f}s more"
        return None

    def impaired_during(self, seconds: float) -> str | None:
        """Why the cluster was not healthy at some time in the last ``seconds`` (a call's duration), or None.

        Faults come and go between steps, so a call saw an impaired cluster if it is impaired now or if
        the call began before the last fault's settle time ended (seed 92).
        """
        now = self.impaired
        if now is not None:
            return now
        settled_at = self.calm_since + self.timeouts.settle
        began = time.monotonic() - seconds
        if began < settled_at:
            return f"settling when the call began ({settled_at - began:.1f}s before it settled)"
        return None

    def run(self, stream: str, number: int) -> BatchRun:
        key = (stream, number)
        if key not in self.runs:
            self.runs[key] = BatchRun(self.shapes[stream], number)
        return self.runs[key]

    def positions(self) -> list[tuple[str, int]]:
        return [(s.name, p) for s in self.shapes.values() for p in range(s.partitions)]
