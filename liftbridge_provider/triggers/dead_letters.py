"""The dead-letter stream of a message watcher: where messages its watchers refuse are published.

Created on first use with the watched stream's partition count and replication
factor; a refused message goes to the same partition there (partition 0 when
the dead-letter stream has fewer partitions), with ack policy ALL, carrying
``lb-dlq-*`` headers (:func:`~liftbridge_provider.core.watching.dead_letter_headers`).
Publishing is at least once: a crash after the publish and before the cursor
moved publishes the message again, with the same headers.
"""

from __future__ import annotations

import asyncio
import logging

from liftbridge_provider.client import ClientConfig, LiftbridgeClient, LiftbridgeError, Message
from liftbridge_provider.client.errors import StreamExistsError
from liftbridge_provider.core.watching import WatchSettings, dead_letter_headers
from liftbridge_provider.telemetry import count_dead_letter

log = logging.getLogger(__name__)


class DeadLetters:
    """Publishes refused messages of one watcher group (the blocking client, in a thread)."""

    def __init__(self, client: LiftbridgeClient, settings: WatchSettings, partitions: int) -> None:
        self._client = client
        self._settings = settings
        self._partitions = partitions

    @classmethod
    async def open(cls, config: ClientConfig, settings: WatchSettings, watched: list[int]) -> DeadLetters:
        """Connect, and create the dead-letter stream if it does not exist."""
        client = LiftbridgeClient(config)
        try:
            partitions = await asyncio.to_thread(_ensure_stream, client, settings)
        except BaseException:
            client.close()
            raise
        log.info("Liftbridge watcher dead-letters refused messages of %s to %s", settings.stream, settings.dlq_stream)
        return cls(client, settings, partitions)

    async def publish(self, message: Message, error: str) -> None:
        """Publish one refused message with its origin and error; raises if it was not acknowledged."""
        assert self._settings.dlq_stream is not None
        partition = message.partition if message.partition < self._partitions else 0
        headers = dead_letter_headers(message, cursor_id=self._settings.cursor, error=error)
        await asyncio.to_thread(
            self._client.publish,
            self._settings.dlq_stream,
            message.value,
            key=message.key or None,
            headers=headers,
            partition=partition,
            ack_policy="all",
        )
        count_dead_letter(self._settings, message.partition)
        log.warning(
            "Liftbridge watcher published %s/%d offset %d to dead-letter stream %s: %s",
            message.stream,
            message.partition,
            message.offset,
            self._settings.dlq_stream,
            error,
        )

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)


def _ensure_stream(client: LiftbridgeClient, settings: WatchSettings) -> int:
    """The dead-letter stream's partition count, after creating it like the watched stream if missing."""
    dlq = settings.dlq_stream
    assert dlq is not None
    source = client.fetch_metadata([settings.stream]).stream(settings.stream)
    existing = client.fetch_metadata([dlq]).streams.get(dlq)
    if existing is None:
        replicas = len(source.partitions[0].replicas)
        try:
            client.create_stream(dlq, dlq, partitions=len(source.partitions), replication_factor=replicas)
        except StreamExistsError:
            pass  # created by another watcher meanwhile
        except LiftbridgeError as exc:
            raise LiftbridgeError(f"cannot create dead-letter stream {dlq!r}: {exc}") from exc
        existing = client.fetch_metadata([dlq]).stream(dlq)
    return len(existing.partitions)
