"""The stream shapes a chaos seed creates: replication, compaction, retention, auto-pause."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Removal = Literal["none", "compaction", "retention"]


@dataclass(frozen=True)
class StreamShape:
    """One stream of a seed and how the batch path treats it.

    ``removal`` says which server process may remove acked offsets (the oracle
    accepts a missing offset only with that cause). ``keys`` is the size of the
    key space (0: no keys); a compacted stream always has keys.
    """

    name: str
    partitions: int
    replication: int
    options: dict[str, Any] = field(default_factory=dict)
    removal: Removal = "none"
    keys: int = 0
    ack_policy: str = "all"

    @property
    def compacted(self) -> bool:
        return self.removal == "compaction"

    @property
    def guaranteed(self) -> bool:
        """Replicated with the settings the promise is made for (RF 3, min ISR 2, ack ALL).

        A single replica restarts with the high watermark of its last checkpoint
        (up to 5 s old), so acked offsets can stay invisible until the next
        publish; the oracle notes that for such streams instead of failing.
        """
        return self.replication >= 3 and self.options.get("min_isr", 1) >= 2 and self.ack_policy == "all"

    @property
    def subject(self) -> str:
        return f"chaos.{self.name}"

    def create_options(self) -> dict[str, Any]:
        """Keyword arguments of ``LiftbridgeClient.create_stream``."""
        return {"partitions": self.partitions, "replication_factor": self.replication, **self.options}


# Small segments and a 1 s cleaner make compaction and retention act within a few steps.
SHAPES: tuple[StreamShape, ...] = (
    StreamShape("plain", partitions=3, replication=3, options={"min_isr": 2}),
    StreamShape(
        "compact",
        partitions=2,
        replication=1,
        options={"compact_enabled": True, "segment_max_bytes": 1024, "cleaner_interval": 1},
        removal="compaction",
        keys=6,
    ),
    StreamShape(
        "count",
        partitions=2,
        replication=3,
        options={"min_isr": 2, "retention_max_messages": 40, "segment_max_bytes": 1024, "cleaner_interval": 1},
        removal="retention",
    ),
    StreamShape(
        "age",
        partitions=2,
        replication=1,
        options={"retention_max_age": 6, "segment_max_age": 1, "cleaner_interval": 1},
        removal="retention",
    ),
    StreamShape("pausing", partitions=2, replication=3, options={"min_isr": 2, "auto_pause_time": 2}, keys=4),
)


def shape_named(name: str) -> StreamShape:
    for shape in SHAPES:
        if shape.name == name:
            return shape
    raise KeyError(f"no stream shape {name!r}; shapes are {[s.name for s in SHAPES]}")
