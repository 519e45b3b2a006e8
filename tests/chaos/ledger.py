"""What a seed published (pure): every acked message by position, every unacked one by value.

Values are unique within a seed (``s<seed>/<step>/<n>``), so a message read
back is identified by its value alone, wherever it landed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Position = tuple[str, int, int]  # stream, partition, offset


@dataclass(frozen=True)
class Sent:
    """One message sent: its stream, key (None: no key) and value."""

    stream: str
    key: bytes | None
    value: bytes


@dataclass
class Ledger:
    """Acked messages by position; messages that failed but may be stored, by value."""

    acked: dict[Position, Sent] = field(default_factory=dict)
    maybe: dict[bytes, Sent] = field(default_factory=dict)
    sent: dict[bytes, Sent] = field(default_factory=dict)

    def record_sent(self, message: Sent) -> None:
        if message.value in self.sent:
            raise ValueError(f"value {message.value!r} sent twice: the harness must make values unique")
        self.sent[message.value] = message

    def record_ack(self, message: Sent, partition: int, offset: int) -> Sent | None:
        """Record an ack; returns the message acked earlier at the same position, if any (an offset reused)."""
        position = (message.stream, partition, offset)
        earlier = self.acked.get(position)
        self.acked[position] = message
        return earlier

    def record_maybe(self, message: Sent) -> None:
        """A publish that failed after it may have reached the server (``may_be_stored``)."""
        self.maybe[message.value] = message

    def acked_in(self, stream: str, partition: int) -> dict[int, Sent]:
        return {o: m for (s, p, o), m in self.acked.items() if s == stream and p == partition}

    def count(self, stream: str) -> int:
        return sum(1 for (s, _, _) in self.acked if s == stream)
