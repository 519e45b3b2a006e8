"""The lake's claim ledger: which offsets of a partition the lake holds, so no offset is written twice (pure).

Layout under ``OUTPUT/stream=<s>/`` (names starting with ``_`` are invisible to
``spark.read.parquet``)::

    partition=<p>/range=<start>-<end>/part-<seq>.parquet  a published piece: ONE object, readable by anyone
    _ledger/partition=<p>/claim-<seq>.json                 piece <seq> of the partition: {"start", "end", "run"}
    _ledger/partition=<p>/claim-<seq>.commit.json          its commit: the staged object that won, its bytes, rows
    _ledger/partition=<p>/checkpoint-<upto>.json           claims 0..upto-1 folded (core/lake_checkpoint.py)
    _ledger/partition=<p>/nodes/L<k>-<first>-<upto>.json   details of blocks of folded claims (immutable)
    _staging/<run>/p=<p>-claim=<seq>-<attempt>.parquet     a task's rows for piece <seq>, before the commit

Claims of one partition are numbered 0, 1, 2, ... and each is created with an
exclusive create (create-if-absent): a writer reads the ledger, decides which
offsets of its range no claim covers yet, and creates the next claim for the
first such piece. If another writer created that number first, it reads again
and decides again. So a claim is always decided knowing every earlier claim,
and two claims never share an offset, however many writers race.

A claimed piece is read by exactly one Spark task, so its staged rows are one
Parquet object. Its commit file, created exclusively, names the staged object
that won (and its size); publishing copies that one object to its final key,
so a reader sees a piece whole or not at all, and a copy repeated after a crash
is idempotent. An empty piece (compaction or retention removed its offsets)
commits with no object and publishes nothing. A committed claim is final.

Once a prefix of claims is committed and published it is folded into an
immutable checkpoint (``lake_checkpoint.py``; the rules: ``lake_ledger.py``),
so a run reads the newest checkpoint and the few claims above it, whatever the
lake's age. This module decides and parses; the I/O goes through a
:class:`LedgerStore` that the caller provides (``lake_ledger.Ledger`` drives it).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from liftbridge_provider.core.ranges import OffsetRange

CLAIM_FILE = re.compile(r"^claim-(\d{10})\.json$")
COMMIT_FILE = re.compile(r"^claim-(\d{10})\.commit\.json$")
CHECKPOINT_FILE = re.compile(r"^checkpoint-(\d{10})\.json$")

Interval = tuple[int, int]


class LakeError(Exception):
    """The ledger cannot be read or kept consistent (a message names the file and what to do)."""


class UnreadableClaimError(LakeError):
    """A ledger file exists but does not parse yet (a writer may still be writing it)."""


class MissingFileError(LakeError):
    """A file listed a moment ago is gone (a compaction deleted it): the reader lists again."""


@dataclass(frozen=True)
class Commit:
    """Which staged object holds a claim's rows, and what they are (counted before the commit).

    ``staging``: the staged object, relative to the stream's folder ("" for an
    empty piece). ``size``: its bytes, checked against the published copy;
    None for a commit written before pieces were one object (``staging`` is
    then a folder that was renamed whole).
    """

    staging: str
    rows: int
    min_offset: int | None
    max_offset: int | None
    run: str
    size: int | None = 0

    @property
    def legacy(self) -> bool:
        """A folder commit of a lake written before pieces were one object each."""
        return self.size is None

    def to_json(self) -> dict[str, Any]:
        place = {"staging": self.staging} if self.legacy else {"object": self.staging, "bytes": self.size}
        return {
            **place,
            "rows": self.rows,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "run": self.run,
        }

    @classmethod
    def from_json(cls, item: Mapping[str, Any], name: str) -> Commit:
        try:
            legacy = "object" not in item
            return cls(
                staging=str(item["staging"] if legacy else item["object"]),
                rows=int(item["rows"]),
                min_offset=None if item["min_offset"] is None else int(item["min_offset"]),
                max_offset=None if item["max_offset"] is None else int(item["max_offset"]),
                run=str(item["run"]),
                size=None if legacy else int(item["bytes"]),
            )
        except (KeyError, TypeError, ValueError):
            raise LakeError(f"ledger file {name} lacks object/bytes/rows/min_offset/max_offset/run") from None


@dataclass(frozen=True)
class Claim:
    """Piece ``seq`` of a partition: offsets ``start <= offset < end``, committed once ``commit`` is set."""

    seq: int
    partition: int
    start: int
    end: int
    run: str
    commit: Commit | None = None

    @property
    def committed(self) -> bool:
        return self.commit is not None

    @property
    def file(self) -> str:
        return f"claim-{self.seq:010d}.json"

    @property
    def commit_file(self) -> str:
        return f"claim-{self.seq:010d}.commit.json"

    @property
    def folder(self) -> str:
        """The piece's folder, relative to the stream's folder (readers see ``range`` as a column)."""
        return f"partition={self.partition}/range={self.start}-{self.end}"

    @property
    def object(self) -> str:
        """The piece's published object, relative to the stream's folder."""
        return f"{self.folder}/part-{self.seq:010d}.parquet"

    @property
    def published_path(self) -> str | None:
        """Where readers find the committed piece: its object (a folder for a legacy commit); None when empty."""
        if self.commit is None or (self.commit.rows == 0 and not self.commit.legacy):
            return None
        return self.folder if self.commit.legacy else self.object

    def overlaps(self, start: int, end: int) -> bool:
        return self.start < end and start < self.end

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "start": self.start, "end": self.end, "run": self.run}

    def detail_json(self) -> dict[str, Any]:
        """The claim with its commit, as a checkpoint keeps it once folded."""
        assert self.commit is not None
        return {"seq": self.seq, "start": self.start, "end": self.end, "run": self.run, "commit": self.commit.to_json()}

    @classmethod
    def from_detail(cls, partition: int, item: Mapping[str, Any], name: str) -> Claim:
        try:
            return cls(
                int(item["seq"]),
                partition,
                int(item["start"]),
                int(item["end"]),
                str(item["run"]),
                Commit.from_json(item["commit"], name),
            )
        except (KeyError, TypeError, ValueError):
            raise LakeError(f"ledger file {name} holds a folded claim without seq/start/end/run/commit") from None


@dataclass(frozen=True)
class WritePlan:
    """What a writer of one range must do, given the partition's claims.

    ``claim``: parts of the range that no claim covers yet, to claim as new
    pieces (one claim each, in order, each at most the plan's piece size).
    ``write``: claimed but uncommitted pieces that overlap the range, to write
    (whoever claimed them). ``held``: committed pieces that overlap the range,
    already in the lake. ``gaps``: offsets between the lake's first and last
    offset that neither a claim nor this range covers (the lake will miss
    them). ``next_seq``: the number of the next claim.
    """

    claim: tuple[OffsetRange, ...]
    write: tuple[Claim, ...]
    held: tuple[Claim, ...]
    gaps: tuple[tuple[int, int], ...]
    next_seq: int

    @property
    def settled(self) -> bool:
        """Every offset of the range is claimed and committed."""
        return not self.claim and not self.write


def uncovered(pieces: Iterable[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` that no ``(start, end)`` piece covers, in order."""
    parts, position = [], start
    for piece_start, piece_end in sorted(pieces):
        if piece_end <= position or piece_start >= end:
            continue
        if piece_start > position:
            parts.append((position, piece_start))
        position = max(position, piece_end)
    if position < end:
        parts.append((position, end))
    return parts


def merged(pieces: Iterable[Interval]) -> tuple[Interval, ...]:
    """Non-empty ``(start, end)`` pieces merged into sorted, disjoint, non-touching intervals."""
    out: list[list[int]] = []
    for start, end in sorted(p for p in pieces if p[1] > p[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((s, e) for s, e in out)


def cut(parts: Iterable[Interval], size: int | None) -> list[Interval]:
    """Each part cut into consecutive pieces of at most ``size`` offsets (None: uncut)."""
    pieces: list[Interval] = []
    for start, end in parts:
        step = size or max(end - start, 1)
        pieces.extend((s, min(s + step, end)) for s in range(start, end, step))
    return pieces


def piece_size(offsets: int, tasks: int, max_records: int | None = None) -> int:
    """How many offsets one claimed piece may span so that ``offsets`` new offsets give at least ``tasks``
    pieces (each piece is one Spark task and one object), at most ``max_records`` (pure)."""
    size = max(1, -(-offsets // max(tasks, 1)))
    return min(size, max_records) if max_records else size


def check_ledger(claims: Sequence[Claim], *, first: int = 0, covered: Sequence[Interval] = ()) -> None:
    """Raise LakeError unless the claims are numbered first..n-1, share no offset with each other nor with the
    ``covered`` intervals of folded claims (the ledger's invariant)."""
    seqs = sorted(c.seq for c in claims)
    if seqs != list(range(first, first + len(seqs))):
        raise LakeError(f"ledger claims must be numbered {first}..{first + len(seqs) - 1} without holes, found {seqs}")
    ordered = sorted(claims, key=lambda c: (c.start, c.end))
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise LakeError(
                f"ledger of partition {after.partition}: claims {before.seq} [{before.start}, {before.end}) and "
                f"{after.seq} [{after.start}, {after.end}) overlap; the ledger was edited by hand or by a store "
                "without an atomic create-if-absent"
            )
    for claim in claims:
        hit = next(((s, e) for s, e in covered if s < claim.end and claim.start < e), None)
        if hit is not None:
            raise LakeError(
                f"ledger of partition {claim.partition}: claim {claim.seq} [{claim.start}, {claim.end}) overlaps "
                f"offsets [{hit[0]}, {hit[1]}) of its checkpoint; the ledger was edited by hand or by a store without "
                "an atomic create-if-absent"
            )


def plan_write(
    claims: Sequence[Claim],
    offset_range: OffsetRange,
    *,
    first: int = 0,
    covered: Sequence[Interval] = (),
    folded: Sequence[Claim] = (),
    size: int | None = None,
) -> WritePlan:
    """Decide what a writer of ``offset_range`` must claim and write, given the partition's claims (pure).

    ``claims`` are the claims numbered ``first`` and up; ``covered`` the merged offsets of the folded ones
    below ``first`` (a checkpoint's), ``folded`` those of them the caller looked up because they overlap the
    range (they join ``held``). New pieces are cut to at most ``size`` offsets.
    """
    check_ledger(claims, first=first, covered=covered)
    foreign = [c for c in [*claims, *folded] if c.partition != offset_range.partition]
    if foreign:
        raise LakeError(f"claim {foreign[0].seq} of partition {foreign[0].partition} in the ledger of another one")
    start, end = offset_range.start, offset_range.end
    overlapping = sorted((c for c in claims if c.overlaps(start, end)), key=lambda c: c.start)
    pieces = [*covered, *((c.start, c.end) for c in claims if c.end > c.start)]
    to_claim = tuple(OffsetRange(offset_range.partition, s, e) for s, e in cut(uncovered(pieces, start, end), size))
    spans = pieces + ([(start, end)] if end > start else [])
    gaps: tuple[tuple[int, int], ...] = ()
    if spans:
        lowest, highest = min(s for s, _ in spans), max(e for _, e in spans)
        gaps = tuple(uncovered(spans, lowest, highest))
    held = [c for c in overlapping if c.committed] + [c for c in folded if c.overlaps(start, end)]
    return WritePlan(
        claim=to_claim,
        write=tuple(c for c in overlapping if not c.committed),
        held=tuple(sorted(held, key=lambda c: c.start)),
        gaps=gaps,
        next_seq=first + len(claims),
    )


def holdings(claims: Iterable[Claim]) -> list[Claim]:
    """The committed pieces, in offset order: what the partition's folder holds."""
    return sorted((c for c in claims if c.committed), key=lambda c: c.start)


def encode(document: Mapping[str, Any]) -> bytes:
    """A ledger file's bytes: canonical JSON (sorted keys), so equal documents are equal bytes."""
    return (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()


def load(data: bytes, name: str) -> dict[str, Any]:
    """A ledger file's JSON object (UnreadableClaimError while it is incomplete, LakeError when not an object)."""
    try:
        value = json.loads(data)
    except ValueError:
        raise UnreadableClaimError(f"ledger file {name} is not complete JSON yet") from None
    if not isinstance(value, dict):
        raise LakeError(f"ledger file {name} must hold a JSON object")
    return value


def ledger_seq(name: str) -> int | None:
    """The claim number of a claim or commit file's name, else None."""
    match = CLAIM_FILE.match(name) or COMMIT_FILE.match(name)
    return int(match.group(1)) if match else None


def checkpoint_upto(name: str) -> int | None:
    """The ``upto`` of a checkpoint file's name, else None."""
    match = CHECKPOINT_FILE.match(name)
    return int(match.group(1)) if match else None


def parse_claims(partition: int, files: Mapping[str, bytes], *, first: int = 0) -> list[Claim]:
    """The claims numbered ``first`` and up of a partition from its ledger files (name -> content); other names,
    and claim or commit files below ``first`` (folded into a checkpoint, left for deletion), are ignored."""
    commits = {}
    for name, data in files.items():
        match = COMMIT_FILE.match(name)
        if match and int(match.group(1)) >= first:
            commits[int(match.group(1))] = Commit.from_json(load(data, name), name)
    claims = []
    for name, data in files.items():
        match = CLAIM_FILE.match(name)
        if match and int(match.group(1)) >= first:
            item = load(data, name)
            seq = int(match.group(1))
            if item.get("partition") != partition:
                raise LakeError(f"ledger file {name} is for partition {item.get('partition')!r}, not {partition}")
            try:
                claim = Claim(seq, partition, int(item["start"]), int(item["end"]), str(item["run"]), commits.get(seq))
            except (KeyError, TypeError, ValueError):
                raise LakeError(f"ledger file {name} lacks start/end/run") from None
            if claim.end < claim.start:
                raise LakeError(f"ledger file {name}: end {claim.end} is before start {claim.start}")
            claims.append(claim)
    orphans = sorted(set(commits) - {c.seq for c in claims})
    if orphans:
        raise LakeError(f"ledger of partition {partition}: commits {orphans} have no claim file")
    return sorted(claims, key=lambda c: c.seq)


class LedgerStore(Protocol):
    """What the ledger needs from a filesystem or object store; paths are strings joined with ``/``."""

    def list_names(self, folder: str) -> list[str]:
        """Names directly in ``folder`` (empty when it does not exist): one LIST request."""
        ...

    def read(self, path: str) -> bytes:
        """The file's bytes; MissingFileError when it does not exist."""
        ...

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists, atomically; False when it existed."""
        ...

    def delete_files(self, folder: str, names: Sequence[str]) -> None:
        """Delete these files of ``folder`` (missing ones are no error), in as few requests as the store allows."""
        ...

    def object_size(self, path: str) -> int | None:
        """The size in bytes of a file, None when it does not exist (a folder: -1)."""
        ...

    def rename(self, source: str, target: str) -> bool:
        """Move ``source`` to ``target`` (which must not exist): True when moved, False when it did not.

        A file (an object) must appear at ``target`` whole or not at all; a
        folder is needed only for commits of lakes written before pieces were
        one object each.
        """
        ...


def problems(entries: list[dict[str, Any]], allow_gaps: bool, head_loss_ok: bool = False) -> list[str]:
    """What is wrong with the rows of each piece: shortfalls, or offsets outside it.

    ``allow_gaps`` (compacted streams) accepts any shortfall; ``head_loss_ok``
    (``--on-data-loss skip``) accepts a piece whose first offsets are missing
    but which holds every offset from its first row to its end.
    """
    found = []
    for e in entries:
        spanned = e["end"] - e["start"]
        if e["rows"] and (e["min_offset"] < e["start"] or e["max_offset"] >= e["end"]):
            outside = f"offsets {e['min_offset']}-{e['max_offset']} outside [{e['start']}, {e['end']})"
            found.append(f"partition {e['partition']}: {outside}")
            continue
        head_lost = e["rows"] == 0 or e["rows"] == e["end"] - e["min_offset"]
        if e["rows"] > spanned or (e["rows"] < spanned and not allow_gaps and not (head_loss_ok and head_lost)):
            found.append(
                f"partition {e['partition']}: {e['rows']} rows for {spanned} offsets [{e['start']}, {e['end']})"
            )
    return found


@dataclass
class Outcome:
    """What a run wrote: manifest entries (one per piece), problems found, gaps, the manifest's path."""

    entries: list[dict[str, Any]]
    problems: list[str]
    gaps: list[str]
    manifest: str
