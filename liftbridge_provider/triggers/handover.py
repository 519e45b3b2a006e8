"""Watchers without Airflow's shared streams (Airflow < 3.3): the same promise, one event per trigger run.

With shared streams Airflow tells the reader when an event is stored
(:mod:`liftbridge_provider.triggers.watchers`). Without them it never does, but
its triggerer keeps an order this module builds on: the events a trigger run
yielded are written to the metadata database before that same triggerer starts
the trigger again once the run has returned (a trigger with pending events is
not started anew, and the events are written in the loop turn that learns the
run ended). So:

1. A run confirms what the run before it handed over, if that run was in this
   same triggerer process: those events are stored, so their offsets are
   passed (message mode: the position cursor moves to them; batch mode: the
   planned batch is recorded). A hand-over by another process (the triggerer
   was killed or restarted, or the watcher moved to another triggerer) is not
   known to be stored, and is read and sent again. Either way the record is
   then cleared.
2. It reads as a shared reader would, passing messages that fire no event
   (filtered out, or refused and dead-lettered) straight away, up to the first
   event; it notes that event's offset (message mode; a batch is in its
   planned slot already), yields the event, and only once Airflow's triggerer
   took it (the generator is resumed) writes this process's token as the
   hand-over's owner; then it returns and the triggerer starts the next run.

So the cursor passes an event only after Airflow stored it, and a crash at any
point loses nothing: at worst the last event is sent again (as with shared
streams: subscribers must be idempotent; a batch is sent again identical).
The cost is one event per run of the trigger, and a triggerer loop turn
(about a second) between runs.

The process token is a random number drawn once per process (a positive
63-bit cursor value); the records are two cursors on the watched stream,
:attr:`~liftbridge_provider.core.watching.CursorNames.handover` and
:attr:`~liftbridge_provider.core.watching.CursorNames.handed_by`.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

from liftbridge_provider.client import AsyncLiftbridgeClient
from liftbridge_provider.core.watching import WatchSettings
from liftbridge_provider.triggers.watchers import BatchReader, MessageReader

log = logging.getLogger(__name__)

_TOKENS: dict[int, int] = {}  # process id -> this process's token


def process_token() -> int:
    """This process's token (drawn on first use in each process, so a forked child has its own): 1 .. 2**62."""
    pid = os.getpid()
    if pid not in _TOKENS:
        _TOKENS[pid] = 1 + secrets.randbelow(2**62)
    return _TOKENS[pid]


class HandoverMessageReader(MessageReader):
    """Message mode, one event per run: confirms the previous run's hand-over per partition on opening."""

    async def _open(self) -> tuple[AsyncLiftbridgeClient, list[int]]:
        client, partitions = await super()._open()
        for partition in partitions:
            owner = await client.fetch_cursor(self.cursors.handed_by, self.settings.stream, partition)
            if owner <= 0:
                continue
            if owner == process_token():
                handed = await client.fetch_cursor(self.cursors.handover, self.settings.stream, partition)
                position = await self._read_cursor(client, self.cursors.position, partition)
                if handed > position:
                    await self._write_cursor(client, self.cursors.position, partition, handed)
                    log.info("Liftbridge watcher: %s/%d offset %d was stored by Airflow; passed",
                             self.settings.stream, partition, handed)  # fmt: skip
            else:
                log.info("Liftbridge watcher: %s/%d: the event handed over by another triggerer process may not "
                         "be stored; reading it again", self.settings.stream, partition)  # fmt: skip
            await client.set_cursor(self.cursors.handed_by, self.settings.stream, partition, 0)
        return client, partitions

    async def handing(self, broker_payload: Any) -> None:
        """Note the offset about to be handed to Airflow (not owned yet: a run that stops here confirms nothing)."""
        partition, offset = broker_payload
        assert self._client is not None
        await self._client.set_cursor(self.cursors.handover, self.settings.stream, partition, offset)

    async def handed(self, broker_payload: Any) -> None:
        """Airflow's triggerer took the event: this process owns the hand-over, the next run here confirms it."""
        partition, _ = broker_payload
        assert self._client is not None
        await self._client.set_cursor(self.cursors.handed_by, self.settings.stream, partition, process_token())


class HandoverBatchReader(BatchReader):
    """Batch mode, one batch per run: records the previous run's batch on opening when this process sent it."""

    async def _open(self) -> tuple[AsyncLiftbridgeClient, list[int]]:
        client, partitions = await super()._open()
        self._partitions, first, stream = partitions, partitions[0], self.settings.stream
        owner = await client.fetch_cursor(self.cursors.handed_by, stream, first)
        if owner <= 0:
            return client, partitions
        point = await self._resume_point(client, partitions)
        if owner == process_token() and point.resend is not None:
            batch = point.next_batch - 1
            await self._record(batch, {r.partition: r.last for r in point.resend.ranges if r.last is not None})
            log.info("Liftbridge watcher: batch %d of %s was stored by Airflow; recorded", batch, stream)
        await client.set_cursor(self.cursors.handed_by, stream, first, 0)
        return client, partitions

    async def handing(self, broker_payload: Any) -> None:
        """The batch is in its planned slot already: nothing to note."""

    async def handed(self, broker_payload: Any) -> None:
        """Airflow's triggerer took the batch: this process owns it, the next run here records it."""
        assert self._client is not None
        await self._client.set_cursor(self.cursors.handed_by, self.settings.stream, self._partitions[0],
                                      process_token())  # fmt: skip


def handover_reader_for(settings: WatchSettings) -> HandoverMessageReader | HandoverBatchReader:
    """The reader of one trigger run without shared streams."""
    return HandoverMessageReader(settings) if settings.mode == "message" else HandoverBatchReader(settings)
