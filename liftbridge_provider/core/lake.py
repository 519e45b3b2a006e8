"""The lake's claim ledger: which offsets of a partition the lake holds, so no offset is written twice.

Layout under ``OUTPUT/stream=<s>/`` (folders starting with ``_`` are invisible
to ``spark.read.parquet``)::

    partition=<p>/range=<start>-<end>/               a committed piece: its rows, readable by anyone
    _ledger/partition=<p>/claim-<seq>.json           piece <seq> of the partition: {"start", "end", "run"}
    _ledger/partition=<p>/claim-<seq>.commit.json    its commit: which staged folder holds its rows, their count
    _staging/partition=<p>/claim-<seq>-<run>/        a writer's rows for piece <seq>, before the commit

Claims of one partition are numbered 0, 1, 2, ... and each is created with an
exclusive create (create-if-absent): a writer reads claims ``0..n-1``, decides
which offsets of its range no claim covers yet, and creates claim ``n`` for
the first such piece. If another writer created ``n`` first, it reads again
and decides again. So claim ``n`` is always decided knowing every earlier
claim, and two claims never share an offset, however many writers race.

A claim is written by whoever needs it: its creator, or any later writer
whose range overlaps it while it is not committed (the repair after a crash).
Each writer stages the rows in its own folder; the commit file is created
exclusively too, so exactly one staged folder wins and is renamed to
``range=<start>-<end>`` (any writer finishes a rename that a crash
interrupted). A committed claim is final: a rerun of the same range finds its
pieces committed and writes nothing.

This module decides and parses; it does no I/O except through a
:class:`LedgerStore` that the caller provides (the Spark job passes a Hadoop
filesystem adapter).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from liftbridge_provider.core.ranges import OffsetRange

CLAIM_FILE = re.compile(r"^claim-(\d{10})\.json$")
COMMIT_FILE = re.compile(r"^claim-(\d{10})\.commit\.json$")


class LakeError(Exception):
    """The ledger cannot be read or kept consistent (a message names the file and what to do)."""


class UnreadableClaimError(LakeError):
    """A ledger file exists but does not parse yet (a writer may still be writing it)."""


@dataclass(frozen=True)
class Commit:
    """Which staged folder holds a claim's rows, and what they are (counted before the commit)."""

    staging: str
    rows: int
    min_offset: int | None
    max_offset: int | None
    run: str

    def to_json(self) -> dict[str, Any]:
        return {
            "staging": self.staging,
            "rows": self.rows,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "run": self.run,
        }


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
        """The piece's folder, relative to the stream's folder."""
        return f"partition={self.partition}/range={self.start}-{self.end}"

    def staging_folder(self, run: str) -> str:
        """The folder where ``run`` stages the piece's rows, relative to the stream's folder."""
        return f"_staging/partition={self.partition}/claim-{self.seq:010d}-{run}"

    def overlaps(self, start: int, end: int) -> bool:
        return self.start < end and start < self.end

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "start": self.start, "end": self.end, "run": self.run}


@dataclass(frozen=True)
class WritePlan:
    """What a writer of one range must do, given the partition's claims.

    ``claim``: parts of the range that no claim covers yet, to claim as new
    pieces (one claim each, in order). ``write``: claimed but uncommitted
    pieces that overlap the range, to write (whoever claimed them). ``held``:
    committed pieces that overlap the range, already in the lake. ``gaps``:
    offsets between the lake's first and last offset that neither a claim nor
    this range covers (the lake will miss them). ``next_seq``: the number of
    the next claim.
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


def check_ledger(claims: Sequence[Claim]) -> None:
    """Raise LakeError unless the claims are numbered 0..n-1 and share no offset (the ledger's invariant)."""
    seqs = sorted(c.seq for c in claims)
    if seqs != list(range(len(seqs))):
        raise LakeError(f"ledger claims must be numbered 0..{len(seqs) - 1} without holes, found {seqs}")
    ordered = sorted(claims, key=lambda c: (c.start, c.end))
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise LakeError(
                f"ledger of partition {after.partition}: claims {before.seq} [{before.start}, {before.end}) and "
                f"{after.seq} [{after.start}, {after.end}) overlap; the ledger was edited by hand or by a store "
                "without an atomic create-if-absent"
            )


def plan_write(claims: Sequence[Claim], offset_range: OffsetRange) -> WritePlan:
    """Decide what a writer of ``offset_range`` must claim and write, given the partition's claims (pure)."""
    check_ledger(claims)
    foreign = [c for c in claims if c.partition != offset_range.partition]
    if foreign:
        raise LakeError(f"claim {foreign[0].seq} of partition {foreign[0].partition} in the ledger of another one")
    start, end = offset_range.start, offset_range.end
    overlapping = sorted((c for c in claims if c.overlaps(start, end)), key=lambda c: c.start)
    pieces = [(c.start, c.end) for c in claims if c.end > c.start]
    to_claim = tuple(OffsetRange(offset_range.partition, s, e) for s, e in uncovered(pieces, start, end))
    covered = pieces + ([(start, end)] if end > start else [])
    gaps: tuple[tuple[int, int], ...] = ()
    if covered:
        lowest, highest = min(s for s, _ in covered), max(e for _, e in covered)
        gaps = tuple(uncovered(covered, lowest, highest))
    return WritePlan(
        claim=to_claim,
        write=tuple(c for c in overlapping if not c.committed),
        held=tuple(c for c in overlapping if c.committed),
        gaps=gaps,
        next_seq=len(claims),
    )


def holdings(claims: Iterable[Claim]) -> list[Claim]:
    """The committed pieces, in offset order: what the partition's folder holds."""
    return sorted((c for c in claims if c.committed), key=lambda c: c.start)


def encode(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, sort_keys=True) + "\n").encode()


def _load(data: bytes, name: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise UnreadableClaimError(f"ledger file {name} is not complete JSON yet") from None
    if not isinstance(value, dict):
        raise LakeError(f"ledger file {name} must hold a JSON object")
    return value


def parse_claims(partition: int, files: Mapping[str, bytes]) -> list[Claim]:
    """The claims of a partition from its ledger files (name -> content); other names are ignored."""
    commits = {}
    for name, data in files.items():
        match = COMMIT_FILE.match(name)
        if match:
            item = _load(data, name)
            try:
                commits[int(match.group(1))] = Commit(
                    staging=str(item["staging"]),
                    rows=int(item["rows"]),
                    min_offset=item["min_offset"],
                    max_offset=item["max_offset"],
                    run=str(item["run"]),
                )
            except (KeyError, TypeError, ValueError):
                raise LakeError(f"ledger file {name} lacks staging/rows/min_offset/max_offset/run") from None
    claims = []
    for name, data in files.items():
        match = CLAIM_FILE.match(name)
        if match:
            item = _load(data, name)
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
    """The three operations the ledger needs from a filesystem; paths are strings joined with ``/``."""

    def list_names(self, folder: str) -> list[str]:
        """Names of the files directly in ``folder`` (empty when it does not exist)."""
        ...

    def read(self, path: str) -> bytes: ...

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists, atomically; False when it existed."""
        ...


class Ledger:
    """The claims of one partition of one stream's folder, read and extended through a LedgerStore.

    :param stream_folder: ``OUTPUT/stream=<s>``.
    :param run: this writer's id (any unique string without ``/``).
    :param settle_timeout: seconds to wait for a ledger file that exists but is
        not complete yet (a store whose create is not atomic with its content)
        before failing (default 30).
    """

    def __init__(
        self,
        store: LedgerStore,
        stream_folder: str,
        partition: int,
        run: str,
        *,
        settle_timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.folder = f"{stream_folder.rstrip('/')}/_ledger/partition={partition}"
        self.partition = partition
        self.run = run
        self.settle_timeout = settle_timeout
        self._sleep = sleep

    def claims(self) -> list[Claim]:
        """Every claim of the partition, with its commit when there is one."""
        waited = 0.0
        while True:
            names = [n for n in self.store.list_names(self.folder) if CLAIM_FILE.match(n) or COMMIT_FILE.match(n)]
            try:
                return parse_claims(self.partition, {n: self.store.read(f"{self.folder}/{n}") for n in names})
            except UnreadableClaimError as exc:
                if waited >= self.settle_timeout:
                    raise LakeError(
                        f"{exc} after {waited:.0f}s in {self.folder}: a writer stopped while creating it; "
                        "if no ingest is running, delete that file"
                    ) from exc
                self._sleep(0.2)
                waited += 0.2

    def claim(self, offset_range: OffsetRange, *, attempts: int = 1000) -> WritePlan:
        """Claim every part of ``offset_range`` that no claim covers; returns the plan that remains to write.

        Loops: read the claims, decide, create the next claim; when another
        writer took that number first, read again. Each round either adds a
        claim or sees one added by someone else, so ``attempts`` bounds it.
        """
        for _ in range(attempts):
            plan = plan_write(self.claims(), offset_range)
            if not plan.claim:
                return plan
            piece = plan.claim[0]
            claim = Claim(plan.next_seq, self.partition, piece.start, piece.end, self.run)
            self.store.create_exclusive(f"{self.folder}/{claim.file}", encode(claim.to_json()))
        raise LakeError(f"could not claim {offset_range} in {self.folder} after {attempts} attempts")

    def commit(self, claim: Claim, commit: Commit) -> Commit:
        """Record ``commit`` as the claim's rows unless another writer committed first; returns the winner."""
        if self.store.create_exclusive(f"{self.folder}/{claim.commit_file}", encode(commit.to_json())):
            return commit
        for current in self.claims():
            if current.seq == claim.seq and current.commit is not None:
                return current.commit
        raise LakeError(f"claim {claim.seq} of {self.folder} has a commit file that cannot be read")


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
