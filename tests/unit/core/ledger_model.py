"""A model of the Parquet job's runs over an in-memory store, for the ledger's randomized interleaving tests.

:func:`run_once` is what ``spark/parquet_ingest.py`` does for one partition,
with a staged object that holds its offsets (one line each) instead of a
Spark task's Parquet file. :class:`Scheduler` runs writers and compactors in
threads, one store operation at a time in an order a seeded random generator
picks, and kills an actor before any operation (nothing of it runs after).
:func:`check_published` is what a reader may see at any moment.
"""

from __future__ import annotations

import dataclasses
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from liftbridge_provider.core.lake import Claim, Commit, WritePlan, checkpoint_upto
from liftbridge_provider.core.lake_checkpoint import Checkpoint, folded_claims
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange
from tests.unit.core.memory_store import MemoryStore

STREAM = "lake/stream=s"
LEDGER = f"{STREAM}/_ledger/partition=0"
PUBLISHED = re.compile(r"^lake/stream=s/partition=0/range=(\d+)-(\d+)/part-(\d{10})\.parquet$")


def offsets_of(data: bytes) -> list[int]:
    return [int(line) for line in data.decode().split()]


def run_once(store: MemoryStore, run: str, wanted: OffsetRange, size: int | None) -> WritePlan:
    """One run of the job for one partition: publish what a crash left, claim, stage, commit, publish,
    compact, settle; the final plan (settled unless a racing run still writes an overlapping piece)."""
    ledger = Ledger(store, STREAM, 0, run)
    state = ledger.read()
    for claim in state.recent:
        if claim.committed:
            ledger.publish(claim)
    plan, _ = ledger.claim(wanted, size=size, state=state)
    commits = {}
    for claim in plan.write:
        staged = f"_staging/{run}/p=0/claim={claim.seq}/part-0.parquet"
        data = "".join(f"{o}\n" for o in range(claim.start, claim.end)).encode()
        store.create_exclusive(f"{STREAM}/{staged}", data)  # Spark's task writes the staged object
        commits[claim] = Commit(staged, claim.end - claim.start, claim.start, claim.end - 1, run, len(data))
    winners, _ = ledger.commit_all(commits)
    for claim, commit in commits.items():
        if winners[claim.seq] == commit:
            ledger.publish(dataclasses.replace(claim, commit=commit), just_committed=True)
        else:
            folder, _, name = f"{STREAM}/{commit.staging}".rpartition("/")
            store.delete_files(folder, [name])
    state = ledger.read()
    for claim in state.recent:
        if claim.committed and claim.overlaps(wanted.start, wanted.end):
            ledger.publish(claim)
    state = ledger.compact(state)
    return ledger.full_plan(state, wanted)


def compact_once(store: MemoryStore, run: str, times: int = 1) -> None:
    """Compactions alone (the end of runs whose ranges touched nothing new), ``times`` one after the other."""
    for _ in range(times):
        Ledger(store, STREAM, 0, run).compact()


def check_published(files: dict[str, bytes]) -> list[int]:
    """What a reader sees, checked: every published object whole (its range's offsets, once), no offset in two
    objects, and every claim the newest checkpoint folded published with its committed size (rule 2). Returns
    the published offsets."""
    seen: list[int] = []
    for path, data in files.items():
        match = PUBLISHED.match(path)
        if match:
            start, end = int(match[1]), int(match[2])
            assert offsets_of(data) == list(range(start, end)), f"{path} is not its whole piece"
            seen += offsets_of(data)
    assert len(seen) == len(set(seen)), f"offsets published twice: {sorted(o for o in seen if seen.count(o) > 1)}"
    names = [p.rsplit("/", 1)[1] for p in files if p.startswith(LEDGER + "/") and p.count("/") == LEDGER.count("/") + 1]
    upto = max((u for u in map(checkpoint_upto, names) if u is not None), default=0)
    if upto:
        name = f"checkpoint-{upto:010d}.json"
        checkpoint = Checkpoint.parse(0, files[f"{LEDGER}/{name}"], name)
        for claim in folded_claims(checkpoint, lambda ref: files[f"{LEDGER}/{ref.name}"]):
            assert claim.commit is not None
            if claim.commit.rows:
                published = files.get(f"{STREAM}/{claim.object}")
                assert published is not None, f"folded claim {claim.seq} unpublished"
                assert len(published) == claim.commit.size, f"folded claim {claim.seq} published with another size"
    return seen


class Killed(BaseException):
    """An actor killed before a store operation (raised in its thread)."""


@dataclass
class Actor:
    name: str
    work: Callable[[], object]
    speed: float = 1.0
    killed: bool = False
    done: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = field(default=None, repr=False)


class Scheduler:
    """Runs actors one store operation at a time, in a seeded random order weighed by their speeds, killing some
    before an operation (``kill_rate``)."""

    def __init__(self, store: MemoryStore, seed: int, kill_rate: float) -> None:
        self.store = store
        self.random = random.Random(seed)
        self.kill_rate = kill_rate
        self.actors: list[Actor] = []
        self.turn: str | None = None
        self.cond = threading.Condition()
        self.local = threading.local()
        self.steps = 0
        store.before_op = self._pause

    def add(self, name: str, work: Callable[[], object], speed: float = 1.0) -> None:
        """An actor; ``speed`` weighs how often it is picked (a slow writer: some runs go by between its steps)."""
        self.actors.append(Actor(name, work, speed))

    def _wait(self, actor: Actor) -> None:
        with self.cond:
            while self.turn != actor.name:
                self.cond.wait()
        if actor.killed:
            raise Killed(actor.name)

    def _yield(self) -> None:
        with self.cond:
            self.turn = None
            self.cond.notify_all()

    def _pause(self, kind: str, path: str) -> None:
        actor: Actor | None = getattr(self.local, "actor", None)
        if actor is None:
            return  # the scheduler's own checks
        self._yield()
        self._wait(actor)

    def _body(self, actor: Actor) -> None:
        self.local.actor = actor
        try:
            self._wait(actor)
            actor.work()
        except Killed:
            pass
        except BaseException as exc:  # a failure of the code under test: reported by run()
            actor.error = exc
        finally:
            actor.done = True
            self._yield()

    def _hand_over(self, actor: Actor) -> None:
        """Let ``actor`` run to its next operation (or its end)."""
        with self.cond:
            self.turn = actor.name
            self.cond.notify_all()
            while self.turn is not None:
                self.cond.wait()

    def run(self, check: Callable[[], object]) -> None:
        """Every actor to its end or its death, ``check()`` after each operation."""
        for actor in self.actors:
            actor.thread = threading.Thread(target=self._body, args=(actor,), daemon=True)
            actor.thread.start()
        while alive := [a for a in self.actors if not a.done]:
            actor = self.random.choices(alive, weights=[a.speed for a in alive])[0]
            if self.random.random() < self.kill_rate:
                actor.killed = True
            self._hand_over(actor)
            self.steps += 1
            self.store.before_op = None
            try:
                check()
            finally:
                self.store.before_op = self._pause
        for actor in self.actors:
            assert actor.thread is not None
            actor.thread.join()
            if actor.error is not None:
                raise AssertionError(f"{actor.name} failed") from actor.error
        self.store.before_op = None


def claims_of(store: MemoryStore) -> list[Claim]:
    return Ledger(store, STREAM, 0, "reader").claims()
