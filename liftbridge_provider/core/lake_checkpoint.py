"""A partition's checkpoint: the claims ``0..upto-1`` folded into one immutable summary (pure).

A run needs two things of old claims: which offsets they cover (to claim only
what no claim covers) and, for a range that overlaps them, their details (rows,
run, published object: the manifest's entries). ``checkpoint-<upto>.json``
keeps the first as merged intervals, and the second in an append-only tree of
immutable node files, so that reading a checkpoint costs the same after ten
runs and after a million:

- ``levels[0]``: details of folded claims not yet in a node (fewer than :data:`FANOUT`);
- ``levels[k]`` (k >= 1): references to level-k nodes not yet gathered into a level-(k+1) node;
- node ``nodes/L<k>-<first>-<upto>.json``: :data:`FANOUT` entries of the level below, claims
  ``first..upto-1``, with the offsets they span (``low``, ``high``), so a lookup reads only the
  nodes whose span overlaps its range.

Every node holds exactly :data:`FANOUT` entries and claims are folded in order,
so the tree is a function of ``upto`` and the claims alone: two compactors that
fold the same claims write byte-identical nodes and checkpoints, whatever
checkpoint each started from. A checkpoint holds at most ``FANOUT - 1`` entries
per level (four levels reach 16 million claims).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from liftbridge_provider.core.lake import Claim, Interval, LakeError, encode, load, merged

FANOUT = 64
"""Entries per node: a node of folded claims is about 16 KB of JSON."""

NODES = "nodes"
"""The sub-folder of a partition's ledger that holds the nodes (never listed by a run)."""


@dataclass(frozen=True)
class NodeRef:
    """A level-``level`` node: claims ``first..upto-1``, whose offsets lie within ``[low, high)``."""

    level: int
    first: int
    upto: int
    low: int
    high: int

    @property
    def name(self) -> str:
        """The node's file, relative to the partition's ledger folder."""
        return f"{NODES}/L{self.level}-{self.first:010d}-{self.upto:010d}.json"

    def overlaps(self, start: int, end: int) -> bool:
        return self.low < end and start < self.high

    def to_json(self) -> dict[str, int]:
        return {"level": self.level, "first": self.first, "upto": self.upto, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, item: Any, name: str) -> NodeRef:
        try:
            return cls(int(item["level"]), int(item["first"]), int(item["upto"]), int(item["low"]), int(item["high"]))
        except (KeyError, TypeError, ValueError):
            raise LakeError(f"ledger file {name} holds a node reference without level/first/upto/low/high") from None


Entry = Claim | NodeRef


@dataclass(frozen=True)
class Checkpoint:
    """Claims ``0..upto-1`` of ``partition`` folded: the offsets they cover and the tree of their details."""

    partition: int
    upto: int
    covered: tuple[Interval, ...]
    levels: tuple[tuple[Entry, ...], ...]

    @property
    def file(self) -> str:
        return f"checkpoint-{self.upto:010d}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "upto": self.upto,
            "fanout": FANOUT,
            "covered": [list(i) for i in self.covered],
            "levels": [[_entry_json(e) for e in level] for level in self.levels],
        }

    @classmethod
    def parse(cls, partition: int, data: bytes, name: str) -> Checkpoint:
        item = load(data, name)
        try:
            if int(item["partition"]) != partition or int(item["fanout"]) != FANOUT:
                raise LakeError(f"ledger file {name} is for partition {item['partition']}, fanout {item['fanout']}")
            levels = tuple(
                tuple(_entry(partition, e, k, name) for e in level) for k, level in enumerate(item["levels"])
            )
            covered = tuple((int(s), int(e)) for s, e in item["covered"])
            return cls(partition, int(item["upto"]), covered, levels)
        except (KeyError, TypeError, ValueError):
            raise LakeError(f"ledger file {name} lacks partition/upto/fanout/covered/levels") from None


def _entry_json(entry: Entry) -> dict[str, Any]:
    return entry.to_json() if isinstance(entry, NodeRef) else entry.detail_json()


def _entry(partition: int, item: Any, level: int, name: str) -> Entry:
    return Claim.from_detail(partition, item, name) if level == 0 else NodeRef.from_json(item, name)


def _ref(level: int, chunk: Sequence[Entry]) -> NodeRef:
    """The reference of a new level-``level`` node holding ``chunk`` (entries of the level below)."""
    if level == 1:
        claims = [e for e in chunk if isinstance(e, Claim)]
        return NodeRef(1, claims[0].seq, claims[-1].seq + 1, min(c.start for c in claims), max(c.end for c in claims))
    refs = [e for e in chunk if isinstance(e, NodeRef)]
    return NodeRef(level, refs[0].first, refs[-1].upto, min(r.low for r in refs), max(r.high for r in refs))


def node_bytes(partition: int, ref: NodeRef, chunk: Sequence[Entry]) -> bytes:
    """A node file's content (canonical JSON)."""
    return encode({"partition": partition, **ref.to_json(), "entries": [_entry_json(e) for e in chunk]})


def fold(previous: Checkpoint | None, partition: int, claims: Sequence[Claim]) -> tuple[Checkpoint, dict[str, bytes]]:
    """The checkpoint that adds ``claims`` (committed, numbered on from ``previous.upto``) to ``previous``, and
    the new node files it refers to (name -> bytes): write those first, then the checkpoint."""
    upto = previous.upto if previous else 0
    seqs = [c.seq for c in claims]
    if seqs != list(range(upto, upto + len(claims))) or any(c.commit is None for c in claims):
        raise LakeError(f"only committed claims numbered from {upto} on fold into a checkpoint, got {seqs}")
    levels: list[list[Entry]] = [list(level) for level in previous.levels] if previous else [[]]
    levels[0].extend(claims)
    nodes: dict[str, bytes] = {}
    level = 0
    while level < len(levels):
        while len(levels[level]) >= FANOUT:
            chunk, levels[level] = levels[level][:FANOUT], levels[level][FANOUT:]
            ref = _ref(level + 1, chunk)
            nodes[ref.name] = node_bytes(partition, ref, chunk)
            if len(levels) == level + 1:
                levels.append([])
            levels[level + 1].append(ref)
        level += 1
    covered = merged([*(previous.covered if previous else ()), *((c.start, c.end) for c in claims)])
    return Checkpoint(partition, upto + len(claims), covered, tuple(tuple(level) for level in levels)), nodes


def node_entries(partition: int, ref: NodeRef, data: bytes) -> list[Entry]:
    """The entries of a node file, checked against its reference."""
    item = load(data, ref.name)
    try:
        if NodeRef.from_json(item, ref.name) != ref or int(item["partition"]) != partition:
            raise LakeError(f"ledger node {ref.name} does not hold what its checkpoint says")
        entries = [_entry(partition, e, ref.level - 1, ref.name) for e in item["entries"]]
    except (KeyError, TypeError, ValueError):
        raise LakeError(f"ledger node {ref.name} lacks its entries") from None
    return entries


def folded_claims(
    checkpoint: Checkpoint | None,
    read: Callable[[NodeRef], bytes],
    *,
    span: Interval | None = None,
    seq: int | None = None,
) -> list[Claim]:
    """The folded claims that overlap ``span`` (all with None), or the one numbered ``seq``, in claim order;
    ``read`` gives a node's bytes, and is called only for nodes that may hold what is asked for."""
    if checkpoint is None:
        return []

    def wanted(entry: Entry) -> bool:
        if isinstance(entry, NodeRef):
            hits_span = span is None or entry.overlaps(*span)
            return hits_span and (seq is None or entry.first <= seq < entry.upto)
        hits_span = span is None or entry.overlaps(*span)
        return hits_span and (seq is None or entry.seq == seq)

    found: list[Claim] = []
    pending = [e for level in checkpoint.levels for e in level if wanted(e)]
    while pending:
        entry = pending.pop()
        if isinstance(entry, Claim):
            found.append(entry)
        else:
            pending += [e for e in node_entries(checkpoint.partition, entry, read(entry)) if wanted(e)]
    return sorted(found, key=lambda c: c.seq)
