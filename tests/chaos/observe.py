"""After every step: read every partition in full, every cursor, the whole lake, and ask the oracle.

A partition that cannot be read now (paused: reading would resume it; its
leader down) keeps its last snapshot. Reads are timed like every other call
and run side by side, so a frozen leader costs one deadline, not one per read.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from liftbridge_provider.client import LiftbridgeTimeoutError, PartitionPausedError
from liftbridge_provider.client.messages import Message
from tests.chaos import oracle
from tests.chaos.batch import CURSOR_ID, PROBE
from tests.chaos.oracle import Finding, Snapshot, StoredMessage, Verdict
from tests.chaos.world import World


def observe(world: World, index: int, *, final: bool = False) -> Verdict:
    """Refresh snapshots and cursors, then check everything; ``final`` adds the end-of-seed checks."""
    verdict = Verdict()
    previous = dict(world.cursors)
    previous_snapshots = dict(world.snapshots)
    positions = world.positions()
    with ThreadPoolExecutor(max_workers=len(positions), thread_name_prefix="chaos-observe") as pool:
        reads = [pool.submit(_refresh_snapshot, world, s, p, index, verdict, final=final) for s, p in positions]
        reads += [pool.submit(_refresh_cursor, world, s, p) for s, p in positions]
        for read in reads:
            read.result()  # every call inside is bounded by the timer
    oracle.check_cursor_moves(previous, world.cursors, verdict)
    _track_moved_back(world, oracle.check_high_watermarks(world.shapes, previous_snapshots, world.snapshots, verdict))
    for (stream, _), snapshot in sorted(world.snapshots.items()):
        oracle.check_stream(world.shapes[stream], snapshot, world.ledger, verdict, final=final)
    oracle.check_lake(
        world.lake.rows(),
        shapes=world.shapes,
        snapshots=world.snapshots,
        ledger=world.ledger,
        cursors=world.cursors,
        verdict=verdict,
        final=final,
        step=index,
    )
    oracle.check_delta(
        world.delta.rows(),
        landed=list(world.delta.landed),
        shapes=world.shapes,
        snapshots=world.snapshots,
        ledger=world.ledger,
        verdict=verdict,
        step=index,
    )
    return verdict


def _refresh_snapshot(world: World, stream: str, partition: int, index: int, verdict: Verdict, *, final: bool) -> None:
    t = world.timeouts
    overshoot: list[int] = []

    def read() -> Snapshot | None:
        if final:
            _resume(world, stream, partition)  # the seed is over: the final check may resume a paused partition
        try:
            return read_once()
        except LiftbridgeTimeoutError:
            if world.shapes[stream].removal != "retention":
                raise
            # A reader inside a segment the cleaner deletes stalls on the server (docs/reliability.md, known
            # limits): like a user, read again once; the new read starts at the new oldest offset.
            return read_once()

    def read_once() -> Snapshot | None:
        high_watermark = world.client.fetch_partition_metadata(stream, partition, timeout=t.request).high_watermark
        start = 0
        if world.shapes[stream].removal == "retention" and high_watermark >= 0:
            # Reading a range that retention emptied waits for its whole timeout: ask for the oldest offset first.
            start = world.client.earliest_offset(stream, partition, timeout=t.request) or 0
            if start > high_watermark and world.impaired is not None:
                return None  # "nothing retained" may be a silent leader: keep the last snapshot
        messages: dict[int, StoredMessage] = {}
        if start <= high_watermark:
            end = high_watermark + 1
            reader = world.client.read_range(
                stream, partition, start, end, beyond_high_watermark="wait", timeout=t.read
            )
            for message in reader:  # a paused partition raises PartitionPausedError: reading would resume it
                if message.offset >= end:
                    overshoot.append(message.offset)
                    break
                messages[message.offset] = _stored(message)
        return Snapshot(stream, partition, high_watermark, messages, index)

    retries = 2 if world.shapes[stream].removal == "retention" else 1
    outcome = world.timer.call(f"snapshot {stream}/{partition}", retries * (2 * t.request + PROBE + t.read), read)
    if overshoot:
        verdict.add("past-end", f"read_range({stream}, {partition}, 0, end) yielded offset {overshoot[0]} >= end")
    if outcome.ok and outcome.value is not None:
        world.snapshots[(stream, partition)] = outcome.value
    elif (
        outcome.error is not None
        and not isinstance(outcome.error, PartitionPausedError)
        and (final or world.impaired is None)
    ):
        verdict.findings.append(Finding("read-failed", f"full read on a healthy cluster: {outcome.describe()}"))


def _resume(world: World, stream: str, partition: int) -> None:
    """Resume a paused partition: read_range resumes first, then finds the range beyond the high watermark."""
    t = world.timeouts
    after = world.client.fetch_partition_metadata(stream, partition, timeout=t.request).high_watermark + 1
    for _ in world.client.read_range(
        stream, partition, after, after + 1, beyond_high_watermark="truncate", resume=True, timeout=t.read
    ):
        pass


def _refresh_cursor(world: World, stream: str, partition: int) -> None:
    def fetch() -> int:
        return world.client.fetch_cursor(CURSOR_ID, stream, partition, timeout=world.timeouts.request)

    outcome = world.timer.call(f"fetch_cursor {stream}/{partition}", world.timeouts.request, fetch)
    if outcome.ok and outcome.value is not None:
        world.cursors[(stream, partition)] = outcome.value


def _stored(message: Message) -> StoredMessage:
    return StoredMessage(key=message.key or None, value=message.value)


def _track_moved_back(world: World, moved: dict[tuple[str, int], int]) -> None:
    """Remember each position whose high watermark moved back (with the highest it had) until it is back."""
    for position, before in moved.items():
        world.hw_back[position] = max(world.hw_back.get(position, -1), before)
    for position, before in list(world.hw_back.items()):
        snapshot = world.snapshots.get(position)
        if snapshot is not None and snapshot.high_watermark >= before:
            del world.hw_back[position]
