"""One partition's claim ledger driven through a LedgerStore: read, claim, commit, publish, compact.

The decisions are ``lake.py``'s and ``lake_checkpoint.py``'s; this module
orders the store's operations so that every guarantee holds under concurrent
runs and a crash after any operation. The rules:

1. Claims, commits, nodes and checkpoints are created exclusively
   (create-if-absent, the object appearing whole or not at all). Nodes and
   checkpoints are deterministic: a second compactor creates the same bytes.
2. ``checkpoint-<U>`` is created only after every claim below ``U`` is
   committed and its object published (checked, or published by the
   compactor itself), and after every node it names exists.
3. Files of claims below ``U`` are deleted only after ``checkpoint-<U>``
   exists; a checkpoint only after a newer one exists. So "some checkpoint
   covers claim k" never turns false again.
4. Readers take the newest checkpoint and ignore claim and commit files below
   its ``upto``.
5. A writer acts on a claim or commit it created only after a listing made
   after that create shows no checkpoint covering it. (A compaction deletes
   the files of claim k once folded; a slow writer's exclusive create of
   claim k or of its commit then succeeds again. That new file is void: a
   checkpoint covers k, and by rule 3 it existed before the create, so the
   listing sees it. The writer deletes its void file and decides again.)
6. A reader trusts the claim and commit files it read only when a listing
   made after its reads shows the same newest checkpoint: a name that a
   compaction deleted and a slow writer re-created (void) in between would
   otherwise be read as the file it listed. A checkpoint alone needs no such
   check: one re-created holds the same bytes (rule 1).

A crash anywhere leaves either open claims (any later run overlapping them
writes them), committed claims not yet published (every run publishes those
of its partitions first), nodes without a checkpoint (created again, equal),
or files below the newest checkpoint (ignored, deleted by the next compaction).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from liftbridge_provider.core.lake import (
    CHECKPOINT_FILE,
    CLAIM_FILE,
    COMMIT_FILE,
    Claim,
    Commit,
    LakeError,
    LedgerStore,
    MissingFileError,
    UnreadableClaimError,
    WritePlan,
    checkpoint_upto,
    encode,
    ledger_seq,
    load,
    parse_claims,
    plan_write,
)
from liftbridge_provider.core.lake_checkpoint import Checkpoint, NodeRef, fold, folded_claims
from liftbridge_provider.core.ranges import OffsetRange

READ_ATTEMPTS = 100
"""Listings a read may take when compactions keep deleting what it just listed, before it fails."""


def ledger_names(names: Sequence[str]) -> frozenset[str]:
    """The names of a listing that are the ledger's own (claims, commits, checkpoints)."""
    return frozenset(n for n in names if CLAIM_FILE.match(n) or COMMIT_FILE.match(n) or CHECKPOINT_FILE.match(n))


def _number(name: str) -> int:
    """A ledger name's claim number (claims, commits) or upto (checkpoints)."""
    seq = ledger_seq(name)
    return seq if seq is not None else (checkpoint_upto(name) or 0)


def newest_upto(names: Sequence[str] | frozenset[str]) -> int:
    """The ``upto`` of the newest checkpoint among ``names`` (0: none)."""
    return max((u for u in map(checkpoint_upto, names) if u is not None), default=0)


@dataclass(frozen=True)
class LedgerState:
    """What one read found: the newest checkpoint, the claims above it, and the listing it came from."""

    partition: int
    checkpoint: Checkpoint | None
    recent: tuple[Claim, ...]
    names: frozenset[str]

    @property
    def upto(self) -> int:
        return self.checkpoint.upto if self.checkpoint else 0

    @property
    def next_seq(self) -> int:
        return self.upto + len(self.recent)

    def plan(self, offset_range: OffsetRange, size: int | None = None, folded: Sequence[Claim] = ()) -> WritePlan:
        covered = self.checkpoint.covered if self.checkpoint else ()
        return plan_write(self.recent, offset_range, first=self.upto, covered=covered, folded=folded, size=size)


class Ledger:
    """The claims of one partition of one stream's folder, read and extended through a LedgerStore.

    :param stream_folder: ``OUTPUT/stream=<s>``.
    :param run: this writer's id (any unique string without ``/``).
    :param settle_timeout: seconds to wait for a ledger file that exists but is
        not complete yet (a store whose create is not atomic with its content)
        before failing (default 30).
    :param step: called with a step's name after each step a crash test may
        stop at (``ledger.claimed``, ``ledger.committed``, ``ledger.compacting``,
        ``ledger.nodes_written``, ``ledger.checkpointed``); the Spark job passes
        its fault points.
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
        step: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.stream_folder = stream_folder.rstrip("/")
        self.folder = f"{self.stream_folder}/_ledger/partition={partition}"
        self.partition = partition
        self.run = run
        self.settle_timeout = settle_timeout
        self._sleep = sleep
        self._step = step or (lambda _: None)
        self.published: set[int] = set()  # claims whose object this ledger published or found published

    # -- reading ----------------------------------------------------------------------------------

    def read(self) -> LedgerState:
        """The newest checkpoint and every claim above it: one listing and a read per file it needs."""
        waited, attempts = 0.0, 0
        while True:
            names = self.store.list_names(self.folder)
            try:
                state = self._read_listed(names)
                if not state.recent or newest_upto(self.store.list_names(self.folder)) == state.upto:
                    return state  # rule 6: no compaction since the listing, so no file read was re-created
            except MissingFileError:
                pass  # a compaction deleted a listed file: list again
            except UnreadableClaimError as exc:
                if waited >= self.settle_timeout:
                    raise LakeError(
                        f"{exc} after {waited:.0f}s in {self.folder}: a writer stopped while creating it; "
                        "if no ingest is running, delete that file"
                    ) from exc
                self._sleep(0.2)
                waited += 0.2
                continue
            attempts += 1
            if attempts >= READ_ATTEMPTS:
                raise LakeError(f"{self.folder} kept changing under {attempts} reads (compactions at once)")

    def _read_listed(self, listing: Sequence[str]) -> LedgerState:
        names = ledger_names(listing)
        upto = newest_upto(names)
        checkpoint = None
        if upto:
            name = f"checkpoint-{upto:010d}.json"
            checkpoint = Checkpoint.parse(self.partition, self.store.read(f"{self.folder}/{name}"), name)
        wanted = sorted(n for n in names if (seq := ledger_seq(n)) is not None and seq >= upto)
        files = {n: self.store.read(f"{self.folder}/{n}") for n in wanted}
        recent = parse_claims(self.partition, files, first=upto)
        return LedgerState(self.partition, checkpoint, tuple(recent), names)

    def read_node(self, ref: NodeRef) -> bytes:
        return self.store.read(f"{self.folder}/{ref.name}")

    def folded(self, state: LedgerState, start: int, end: int) -> list[Claim]:
        """The folded claims that overlap ``[start, end)`` (reads only the nodes whose span overlaps it)."""
        return folded_claims(state.checkpoint, self.read_node, span=(start, end))

    def claims(self) -> list[Claim]:
        """Every claim of the partition, folded ones included (reads every node: for readers and tests)."""
        state = self.read()
        return [*folded_claims(state.checkpoint, self.read_node), *state.recent]

    def full_plan(self, state: LedgerState, offset_range: OffsetRange) -> WritePlan:
        """``state``'s plan for ``offset_range`` with the folded pieces it overlaps among ``held``."""
        return state.plan(offset_range, folded=self.folded(state, offset_range.start, offset_range.end))

    # -- claiming ---------------------------------------------------------------------------------

    def claim(
        self, offset_range: OffsetRange, *, size: int | None = None, state: LedgerState | None = None
    ) -> tuple[WritePlan, LedgerState]:
        """Claim every part of ``offset_range`` that no claim covers, in pieces of at most ``size`` offsets;
        returns the plan that remains to write (the open pieces overlapping it) and the state it came from.

        After each claim it creates, it lists the ledger (rule 5): unchanged but
        for its claim, it goes on from what it knows; else it reads again and
        decides again (its claim void when a checkpoint covers it: deleted).
        """
        state = state or self.read()
        for _ in range(1000):
            plan = state.plan(offset_range, size)
            if not plan.claim:
                return plan, state
            piece = plan.claim[0]
            claim = Claim(state.next_seq, self.partition, piece.start, piece.end, self.run)
            if not self.store.create_exclusive(f"{self.folder}/{claim.file}", encode(claim.to_json())):
                state = self.read()
                continue
            self._step("ledger.claimed")
            listing = self.store.list_names(self.folder)
            if ledger_names(listing) == state.names | {claim.file}:
                state = replace(state, recent=(*state.recent, claim), names=state.names | {claim.file})
                continue
            if newest_upto(listing) > claim.seq:  # void: a compaction had deleted a folded claim of this number
                self.store.delete_files(self.folder, [claim.file])
            state = self.read()
        raise LakeError(f"could not claim {offset_range} in {self.folder} after 1000 attempts")

    # -- committing -------------------------------------------------------------------------------

    def commit(self, claim: Claim, commit: Commit) -> Commit:
        """Record ``commit`` as the claim's rows unless another writer committed first; returns the winner."""
        return self.commit_all({claim: commit})[0][claim.seq]

    def commit_all(
        self, commits: Mapping[Claim, Commit], *, known: LedgerState | None = None
    ) -> tuple[dict[int, Commit], LedgerState | None]:
        """Commit each claim's staged piece unless another writer did first; each claim's winning commit, and
        the ledger's state after, when ``known`` (the state the claims came from) still holds.

        One listing after the creates (rule 5): a commit this writer created
        for a claim a checkpoint covers is void, deleted, and the folded
        commit is the winner. When that listing shows exactly ``known``'s
        files and the commits made here, nothing else changed (rule 6: no new
        checkpoint), so the state after is known without reading it again.
        """
        winners: dict[int, Commit] = {}
        mine = []
        for claim, commit in commits.items():
            if self.store.create_exclusive(f"{self.folder}/{claim.commit_file}", encode(commit.to_json())):
                winners[claim.seq] = commit
                mine.append(claim)
            else:
                winners[claim.seq] = self._winner(claim)
        if not mine:
            return winners, None
        self._step("ledger.committed")
        listing = self.store.list_names(self.folder)
        upto = newest_upto(listing)
        void = [c for c in mine if c.seq < upto]
        if void:
            self.store.delete_files(self.folder, [c.commit_file for c in void])
            for claim in void:
                winners[claim.seq] = self._folded_commit(claim)
        created = {c.commit_file for c in mine}
        if known is None or void or ledger_names(listing) != known.names | created:
            return winners, None
        recent = tuple(replace(c, commit=winners[c.seq]) if c.commit_file in created else c for c in known.recent)
        return winners, replace(known, recent=recent, names=known.names | created)

    def _winner(self, claim: Claim) -> Commit:
        name = claim.commit_file
        try:
            return Commit.from_json(load(self.store.read(f"{self.folder}/{name}"), name), name)
        except MissingFileError:  # committed, folded and deleted since the create failed
            return self._folded_commit(claim)

    def _folded_commit(self, claim: Claim) -> Commit:
        found = folded_claims(self.read().checkpoint, self.read_node, seq=claim.seq)
        if not found or found[0].commit is None:
            raise LakeError(f"claim {claim.seq} of {self.folder} is neither committed nor folded")
        return found[0].commit

    # -- publishing -------------------------------------------------------------------------------

    def publish(self, claim: Claim, *, just_committed: bool = False) -> None:
        """Make a committed claim's object visible at its final key, unless it is there already (idempotent).

        The final object is checked by its size: the commit's, since an object
        appears whole. ``just_committed``: this writer's own commit, whose
        object nobody published yet as a rule, so the move is tried first.
        Raises LakeError when neither it nor the staged object exists (the
        lake lost those offsets) or when it has another size.
        """
        commit = claim.commit
        assert commit is not None, "only committed claims are published"
        if claim.seq in self.published or claim.published_path is None:
            return
        final = f"{self.stream_folder}/{claim.published_path}"
        size = None if just_committed else self.store.object_size(final)
        if size is None:
            if self.store.rename(f"{self.stream_folder}/{commit.staging}", final):
                self.published.add(claim.seq)
                return
            size = self.store.object_size(final)
        if size is None:
            raise LakeError(
                f"claim {claim.seq} of partition {claim.partition} is committed, but neither {final} nor its "
                f"staged copy {self.stream_folder}/{commit.staging} exists: the lake lost offsets "
                f"[{claim.start}, {claim.end})"
            )
        if not commit.legacy and size != commit.size:
            raise LakeError(f"{final} holds {size} bytes, its commit says {commit.size}: not the committed piece")
        self.published.add(claim.seq)

    # -- compacting -------------------------------------------------------------------------------

    def compact(self, state: LedgerState | None = None) -> LedgerState:
        """Fold the committed claims at the bottom of ``state`` (read now when None) into a new checkpoint,
        after publishing each (rule 2), then delete the files it makes stale (rule 3); the state after."""
        state = state or self.read()
        count = next((i for i, c in enumerate(state.recent) if not c.committed), len(state.recent))
        if count == 0:
            return state
        prefix = state.recent[:count]
        for claim in prefix:
            self.publish(claim)
        self._step("ledger.compacting")
        checkpoint, nodes = fold(state.checkpoint, self.partition, prefix)
        for name, data in nodes.items():
            self._create_immutable(name, data)
        self._step("ledger.nodes_written")
        self._create_immutable(checkpoint.file, encode(checkpoint.to_json()))
        self._step("ledger.checkpointed")
        stale = sorted(n for n in state.names if _number(n) < checkpoint.upto)  # names: claims, commits, checkpoints
        if stale:
            self.store.delete_files(self.folder, stale)
        names = (state.names - set(stale)) | {checkpoint.file}
        return LedgerState(self.partition, checkpoint, state.recent[count:], frozenset(names))

    def _create_immutable(self, name: str, data: bytes) -> None:
        """Create a node or checkpoint; one that exists must hold the same bytes (rule 1), unless it is a
        checkpoint deleted in between (a newer one exists)."""
        path = f"{self.folder}/{name}"
        if self.store.create_exclusive(path, data):
            return
        try:
            same = self.store.read(path) == data
        except MissingFileError:  # a checkpoint that a newer one replaced since (rule 3): nothing to check
            return
        if not same:
            raise LakeError(f"{path} exists with other content than this compaction computed: the ledger is corrupt")
