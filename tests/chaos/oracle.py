"""The oracle (pure): compares what was acked, what the stream holds and what the lake holds.

Checked after every step:

- the stream holds every acked message at its acked offset with its value,
  unless compaction (a later message with the same key survives) or retention
  (the offset is below the oldest retained one) removed it; each removal is
  reported with its cause. Nothing is stored twice, nothing unknown appears;
- the lake has no offset twice, each row equals the message published at
  that offset, and lies inside the range folder it was written to;
- every offset the stream holds below a committed cursor is in the lake;
- cursors never move backwards.

At the end of a seed (``final=True``) every acked message must be visible and
the lake must hold nothing beyond the committed cursors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from liftbridge_provider.core.ranges import RangesDocument
from tests.chaos.ledger import Ledger, Sent
from tests.chaos.streams import StreamShape


@dataclass(frozen=True)
class StoredMessage:
    key: bytes | None
    value: bytes


@dataclass(frozen=True)
class Snapshot:
    """A full read of one partition: ``messages`` by offset, up to the high watermark ``high_watermark``."""

    stream: str
    partition: int
    high_watermark: int
    messages: Mapping[int, StoredMessage]
    step: int  # the step after which it was read (older when the partition could not be read since)


@dataclass(frozen=True)
class LakeRow:
    stream: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    folder: str  # the range folder, "partition=<p>/range=<start>-<end>"
    start: int  # the folder's range [start, end)
    end: int


@dataclass(frozen=True)
class Finding:
    """A broken promise: ``kind`` names it (one word), ``message`` says what and where."""

    kind: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)
    removed: dict[tuple[str, int, int], str] = field(default_factory=dict)  # position -> cause
    notes: list[str] = field(default_factory=list)  # what is seen but not promised (single-replica streams)

    def add(self, kind: str, message: str) -> None:
        self.findings.append(Finding(kind, message))

    def add_or_note(self, shape: StreamShape, kind: str, message: str) -> None:
        """A finding on a stream with the guaranteed settings, a note on the others."""
        if shape.guaranteed:
            self.add(kind, message)
        else:
            self.notes.append(f"[{kind}, not promised at RF {shape.replication}] {message}")


def check_stream(shape: StreamShape, snapshot: Snapshot, ledger: Ledger, verdict: Verdict, *, final: bool) -> None:
    """The partition holds exactly the acked messages, less what compaction or retention removed."""
    where = f"{snapshot.stream}/{snapshot.partition}"
    acked = ledger.acked_in(snapshot.stream, snapshot.partition)
    for offset, stored in sorted(snapshot.messages.items()):
        sent = acked.get(offset) or ledger.maybe.get(stored.value)
        if sent is None:
            known = ledger.sent.get(stored.value)
            what = "was acked at another offset" if known else "was never published"
            verdict.add("phantom", f"{where} offset {offset} holds {stored.value!r}, which {what}")
        elif sent.value != stored.value:
            verdict.add(
                "mismatch", f"{where} offset {offset} holds {stored.value!r} but {sent.value!r} was acked there"
            )
    twice = [v for v, n in Counter(m.value for m in snapshot.messages.values()).items() if n > 1]
    if twice:
        verdict.add("stored-twice", f"{where} holds these values more than once: {twice[:5]}")
    invisible, lost = [], []
    survivors = _last_offset_by_key(snapshot)
    if shape.replication == 1:
        # A single replica restarted with an old checkpointed high watermark still compacts with the acked
        # messages above it (chaos seed 79): those count as survivors, though invisible until the next publish.
        for offset, sent in acked.items():
            if offset > snapshot.high_watermark:
                survivors[sent.key] = max(offset, survivors.get(sent.key, -1))
    maybe_above = set() if final else _maybe_keys_above(snapshot, ledger)
    oldest = min(snapshot.messages, default=snapshot.high_watermark + 1)
    for offset, sent in sorted(acked.items()):
        if offset in snapshot.messages:
            continue
        if offset > snapshot.high_watermark:
            invisible.append(offset)
            continue
        cause = removal_cause(shape, offset, sent, survivors, oldest)
        if cause is None and shape.removal == "compaction" and sent.key in maybe_above:
            cause = f"compaction (key {sent.key!r}: a later message that may be stored, above the read)"
        if cause is None:
            lost.append(offset)
        else:
            verdict.removed[(snapshot.stream, snapshot.partition, offset)] = cause
    if lost:
        explains = shape.removal if shape.removal != "none" else "compaction or retention"
        verdict.add("lost", f"{where} offsets {_spans(lost)} were acked and are gone; no {explains} explains it")
    if invisible and final:
        verdict.add_or_note(
            shape,
            "invisible",
            f"{where} offsets {_spans(invisible)} were acked but the high watermark is {snapshot.high_watermark}",
        )


def _maybe_keys_above(snapshot: Snapshot, ledger: Ledger) -> set[bytes | None]:
    """Keys of messages that failed but may be stored and are not in the read: each may have landed above the
    high watermark read, after it was read, and compacted older ones away before the read reached them (CI
    seed 1). The final check reads after the drain, when everything stored is below the high watermark."""
    held = {stored.value for stored in snapshot.messages.values()}
    return {
        sent.key
        for sent in ledger.maybe.values()
        if sent.stream == snapshot.stream and sent.key is not None and sent.value not in held
    }


def _last_offset_by_key(snapshot: Snapshot) -> dict[bytes | None, int]:
    last: dict[bytes | None, int] = {}
    for offset, stored in snapshot.messages.items():
        last[stored.key] = max(offset, last.get(stored.key, -1))
    return last


def removal_cause(
    shape: StreamShape, offset: int, sent: Sent, survivors: Mapping[bytes | None, int], oldest: int
) -> str | None:
    """Why an acked offset below the high watermark is missing, or None when nothing explains it.

    ``survivors`` maps each key to its last offset in the partition; ``oldest`` is the oldest offset held.
    """
    if shape.removal == "retention" and offset < oldest:
        return f"retention (oldest retained offset {oldest})"
    if shape.removal == "compaction" and survivors.get(sent.key, -1) > offset:
        return f"compaction (key {sent.key!r} survives at offset {survivors[sent.key]})"
    return None


def check_lake(
    rows: Iterable[LakeRow],
    *,
    shapes: Mapping[str, StreamShape],
    snapshots: Mapping[tuple[str, int], Snapshot],
    ledger: Ledger,
    cursors: Mapping[tuple[str, int], int],
    verdict: Verdict,
    final: bool,
    step: int | None = None,
) -> None:
    """No duplicate, every row true to what was published and inside its folder's range; no gap below a cursor.

    A gap needs a snapshot read at this ``step`` where retention acts: a snapshot
    kept from an earlier step (the partition could not be read since, e.g. its
    oldest offset looked past the high watermark while a node was down) may list
    offsets retention removed meanwhile, which a freeze rightly skipped (seed 125).
    """
    by_position: dict[tuple[str, int, int], list[LakeRow]] = {}
    for row in rows:
        by_position.setdefault((row.stream, row.partition, row.offset), []).append(row)
    bad: dict[tuple[str, str, int], list[int]] = {}  # (kind, stream, partition) -> offsets
    folders: dict[tuple[str, str, int], set[str]] = {}
    for (stream, partition, offset), found in sorted(by_position.items()):
        kinds = []
        if len(found) > 1:
            kinds.append("duplicate")
        if any(not r.start <= offset < r.end for r in found):
            kinds.append("outside-range")
        if any(_published_value(r, snapshots, ledger) is not None for r in found):
            kinds.append("lake-mismatch")
        if final and offset > cursors.get((stream, partition), -1):
            kinds.append("uncommitted")
        for kind in kinds:
            bad.setdefault((kind, stream, partition), []).append(offset)
            folders.setdefault((kind, stream, partition), set()).update(r.folder for r in found)
    for (kind, stream, partition), found_at in sorted(bad.items()):
        offsets = found_at
        shown = sorted(folders[(kind, stream, partition)])[:4]
        where = f"lake {stream}/{partition}"
        snapshot = snapshots.get((stream, partition))
        if kind == "uncommitted" and snapshot is not None:
            # Above the final high watermark no run can freeze them, so none can commit them: on a single
            # replica restarted with an old checkpointed high watermark that is not promised (seed 4).
            hidden = [o for o in found_at if o > snapshot.high_watermark]
            offsets = [o for o in found_at if o <= snapshot.high_watermark]
            if hidden:
                verdict.add_or_note(
                    shapes[stream],
                    kind,
                    f"{where} offsets {_spans(hidden)}: {LAKE_PROBLEMS[kind]}, above the high watermark "
                    f"{snapshot.high_watermark} (in {shown})",
                )
            if not offsets:
                continue
        verdict.add(kind, f"{where} offsets {_spans(offsets)}: {LAKE_PROBLEMS[kind]} (in {shown})")
    for (stream, partition), cursor in sorted(cursors.items()):
        snapshot = snapshots.get((stream, partition))
        if snapshot is None:
            continue
        if step is not None and snapshot.step != step and shapes[stream].removal == "retention" and not final:
            continue  # kept from before: retention may have removed what it lists (checked again when fresh)
        missing = [
            o
            for o, stored in snapshot.messages.items()
            if o <= min(cursor, snapshot.high_watermark)
            and (stream, partition, o) not in by_position
            and not (shapes[stream].compacted and _superseded(o, stored, snapshot))
        ]
        if missing:
            verdict.add(
                "gap",
                f"lake {stream}/{partition} lacks offsets {_spans(sorted(missing))} that the stream "
                f"holds below the committed cursor {cursor}",
            )


def check_delta(
    rows: Iterable[LakeRow],
    *,
    landed: Iterable[RangesDocument],
    shapes: Mapping[str, StreamShape],
    snapshots: Mapping[tuple[str, int], Snapshot],
    ledger: Ledger,
    verdict: Verdict,
    step: int | None = None,
) -> None:
    """The Delta table (ranges ingested in any order, at once, twice, after a death before commit): no offset
    twice, every row true to what was published, and every offset of a landed range that the stream holds is
    in the table (on a compacted stream, unless a later message has its key; on a retention stream, only
    with a snapshot read at this ``step``: an older one may list offsets retention removed before the ingest).
    """
    held: dict[tuple[str, int, int], int] = Counter((r.stream, r.partition, r.offset) for r in rows)
    twice: dict[tuple[str, int], list[int]] = {}
    wrong: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        if held[(row.stream, row.partition, row.offset)] > 1:
            twice.setdefault((row.stream, row.partition), []).append(row.offset)
        if _published_value(row, snapshots, ledger) is not None:
            wrong.setdefault((row.stream, row.partition), []).append(row.offset)
    for (stream, partition), offsets in sorted(twice.items()):
        verdict.add(
            "delta-duplicate",
            f"Delta table {stream}/{partition} holds offsets {_spans(sorted(set(offsets)))} more than once",
        )
    for (stream, partition), offsets in sorted(wrong.items()):
        verdict.add(
            "delta-mismatch",
            f"Delta table {stream}/{partition} offsets {_spans(sorted(offsets))}: not what was published",
        )
    missing: dict[tuple[str, int], set[int]] = {}
    for document in landed:
        shape = shapes[document.stream]
        for wanted in document.ranges:
            snapshot = snapshots.get((document.stream, wanted.partition))
            if snapshot is None or (shape.removal == "retention" and step is not None and snapshot.step != step):
                continue
            for offset, stored in snapshot.messages.items():
                if not wanted.start <= offset < wanted.end or (document.stream, wanted.partition, offset) in held:
                    continue
                if shape.compacted and _superseded(offset, stored, snapshot):
                    continue
                missing.setdefault((document.stream, wanted.partition), set()).add(offset)
    for (stream, partition), lacking in sorted(missing.items()):
        verdict.add(
            "delta-lost",
            f"Delta table {stream}/{partition} lacks offsets {_spans(sorted(lacking))} of ranges it took as landed",
        )


LAKE_PROBLEMS = {
    "duplicate": "written more than once",
    "outside-range": "written to a range folder that does not hold them",
    "lake-mismatch": "their value differs from what was published there",
    "uncommitted": "beyond the committed cursor at the end of the seed",
}


def _superseded(offset: int, stored: StoredMessage, snapshot: Snapshot) -> bool:
    """A later message with the same key exists: compaction may have removed this one on the leader of the day."""
    return any(o > offset and m.key == stored.key for o, m in snapshot.messages.items())


def _published_value(row: LakeRow, snapshots: Mapping[tuple[str, int], Snapshot], ledger: Ledger) -> str | None:
    """None when the row's value is what was published at its offset; else what was expected."""
    stream, partition, offset, value = row.stream, row.partition, row.offset, row.value
    acked = ledger.acked.get((stream, partition, offset))
    if acked is not None:
        return None if acked.value == value else f"{acked.value!r} was acked there"
    snapshot = snapshots.get((stream, partition))
    stored = snapshot.messages.get(offset) if snapshot is not None else None
    if stored is not None:
        return None if stored.value == value else f"the stream holds {stored.value!r} there"
    if value in ledger.maybe and ledger.maybe[value].stream == stream:
        return None
    return "no such message was published there"


def check_high_watermarks(
    shapes: Mapping[str, StreamShape],
    previous: Mapping[tuple[str, int], Snapshot],
    current: Mapping[tuple[str, int], Snapshot],
    verdict: Verdict,
) -> dict[tuple[str, int], int]:
    """High watermarks that move backwards are noted, not failed: right after a failover the new leader's
    high watermark lags the old one's (seen on RF 3 streams), and the client waits for it to catch
    up. What such a drop could hide is checked elsewhere: an offset reused by another message, and acked
    offsets still invisible at the final check. Returns ``{position: high watermark before}`` of those."""
    moved_back = {}
    for position, snapshot in sorted(current.items()):
        before = previous.get(position)
        if before is not None and snapshot.high_watermark < before.high_watermark:
            moved_back[position] = before.high_watermark
            verdict.notes.append(
                f"[hw-back] high watermark of {position[0]}/{position[1]} moved back from {before.high_watermark} "
                f"(after step {before.step}) to {snapshot.high_watermark} (after step {snapshot.step})"
            )
    return moved_back


def check_cursor_moves(
    previous: Mapping[tuple[str, int], int], current: Mapping[tuple[str, int], int], verdict: Verdict
) -> None:
    """Cursors never move backwards."""
    for position, offset in sorted(current.items()):
        before = previous.get(position, -1)
        if offset < before:
            verdict.add("cursor-back", f"cursor of {position[0]}/{position[1]} moved back from {before} to {offset}")


def _spans(offsets: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"`` (at most 6 spans)."""
    spans: list[list[int]] = []
    for o in offsets:
        if spans and o == spans[-1][1] + 1:
            spans[-1][1] = o
        else:
            spans.append([o, o])
    text = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans[:6])
    return text + (f" (+{len(spans) - 6} more spans)" if len(spans) > 6 else "")
