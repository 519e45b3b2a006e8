"""A seed's plan: the list of steps, drawn from ``random.Random(seed)`` alone (pure).

The plan never depends on what happens when it runs, so a seed replays the
same steps. Steps name their targets symbolically ("the leader of partition 1
of stream plain"); the runner resolves them at run time. A small model keeps
the plan sensible: at most one node is down or frozen at a time, every kill
is followed by a restart and every freeze by a thaw within a few steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tests.chaos.delta import MODES as DELTA_MODES
from tests.chaos.streams import SHAPES, StreamShape

# Where a ``crash`` step's driver dies (tests/chaos/crash.py): the ingest job's fault points, in the order a run
# meets them, and inside the first publish's rename (after the copy, before the delete).
MID_RENAME = "mid-rename"
CRASH_JOB_POINTS = (
    "ledger.claimed",  # one claim of a partition written
    "ingest.claimed",  # every range claimed, nothing read
    "ingest.staged",  # Spark wrote the pieces to the run's staging folder
    "ledger.committed",  # a partition's commit record written
    "ingest.decided",  # a partition's commits decided, nothing published
    "ingest.published",  # one piece published
    "ledger.compacting",  # a partition's compaction began
    "ledger.nodes_written",  # a compaction's new summary written, the old files not deleted
    "ledger.checkpointed",
)
CRASH_POINTS = (*CRASH_JOB_POINTS, MID_RENAME)
FAULT_KINDS = ("kill_leader", "freeze", "readonly", "pause")
WEIGHTS: dict[str, int] = {
    "publish": 30,
    "run": 24,
    "wait": 5,
    "kill_leader": 5,
    "freeze": 5,
    "readonly": 4,
    "pause": 4,
    "fail_commit": 3,
    "clear": 3,
    "concurrent": 3,
    "delta": 8,
    "crash": 8,
}


@dataclass(frozen=True)
class Step:
    """One step. Fields unused by a kind keep their defaults."""

    kind: str
    stream: str = ""
    partition: int | None = None
    count: int = 0
    mode: str = ""
    run: int = 0
    flag: bool = False
    seconds: float = 0.0

    def __str__(self) -> str:
        parts = [self.kind]
        if self.stream:
            parts.append(self.stream if self.partition is None else f"{self.stream}/{self.partition}")
        if self.kind == "publish":
            parts.append(f"{self.count}x {self.mode}{' keyed' if self.flag else ''}")
        elif self.kind in ("run", "fail_commit", "clear"):
            parts.append(f"run {self.run}")
        elif self.kind == "crash":
            parts.append(f"run {self.run} at {self.mode}{', then its retry' if self.flag else ''}")
        elif self.kind == "concurrent":
            parts.append(f"runs {self.run},{self.run + 1}")
        elif self.kind == "delta":
            parts.append(self.mode)
        elif self.kind == "freeze":
            parts.append("leader" if self.flag else "follower")
        elif self.kind == "readonly":
            parts.append("readonly" if self.flag else "writable")
        elif self.kind == "wait":
            parts.append(f"{self.seconds:g}s")
        return " ".join(parts)


@dataclass
class Plan:
    """The streams of a seed and its steps."""

    seed: int
    shapes: tuple[StreamShape, ...]
    steps: list[Step] = field(default_factory=list)


@dataclass
class _Model:
    """What the planner tracks to keep the plan sensible (no server state)."""

    runs: dict[str, int]
    killed_for: int = 0  # steps until the forced restart (0: nothing killed)
    frozen_for: int = 0  # steps until the forced thaw (0: nothing frozen)
    readonly: set[tuple[str, int]] = field(default_factory=set)

    @property
    def impaired(self) -> bool:
        return self.killed_for > 0 or self.frozen_for > 0


def make_plan(seed: int, steps: int, *, streams: int = 3) -> Plan:
    """The plan of ``seed``: ``streams`` of the shapes and ``steps`` steps (restarts and thaws included)."""
    rng = random.Random(seed)
    shapes = tuple(sorted(rng.sample(SHAPES, min(streams, len(SHAPES))), key=SHAPES.index))
    model = _Model(runs=dict.fromkeys((s.name for s in shapes), 0))
    plan = Plan(seed, shapes)
    while len(plan.steps) < steps:
        forced = _forced_recovery(model)
        plan.steps.append(forced or _draw(rng, shapes, model))
    return plan


def _forced_recovery(model: _Model) -> Step | None:
    """The restart or thaw that is due now, if any."""
    if model.killed_for == 1:
        model.killed_for = 0
        return Step("restart")
    if model.frozen_for == 1:
        model.frozen_for = 0
        return Step("thaw")
    model.killed_for = max(0, model.killed_for - 1)
    model.frozen_for = max(0, model.frozen_for - 1)
    return None


def _draw(rng: random.Random, shapes: tuple[StreamShape, ...], model: _Model) -> Step:
    kinds = [k for k in WEIGHTS if not (k in ("kill_leader", "freeze") and model.impaired)]
    kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
    shape = rng.choice(shapes)
    partition = rng.randrange(shape.partitions)
    if kind == "publish":
        keyed = shape.keys > 0 or rng.random() < 0.3
        mode = rng.choice(("sync", "batch", "batch"))
        count = rng.randint(1, 12) if mode == "sync" else rng.randint(10, 120)
        return Step("publish", shape.name, None if keyed else partition, count, mode, flag=keyed)
    if kind == "kill_leader":
        model.killed_for = rng.randint(2, 4)
        return Step("kill_leader", shape.name, partition)
    if kind == "freeze":
        model.frozen_for = rng.randint(2, 3)
        return Step("freeze", shape.name, partition, flag=rng.random() < 0.6)
    if kind == "readonly":
        readonly = (shape.name, partition) not in model.readonly
        (model.readonly.add if readonly else model.readonly.discard)((shape.name, partition))
        return Step("readonly", shape.name, partition, flag=readonly)
    if kind == "pause":
        return Step("pause", shape.name, None if rng.random() < 0.5 else partition)
    if kind == "wait":
        return Step("wait", seconds=rng.choice((1.0, 2.0, 3.0)))
    if kind == "delta":
        return Step("delta", shape.name, mode=rng.choice(DELTA_MODES))
    if kind == "concurrent":
        first = model.runs[shape.name] + 1
        model.runs[shape.name] += 2
        return Step("concurrent", shape.name, run=first)
    if kind == "run" and (model.runs[shape.name] == 0 or rng.random() < 0.2):
        model.runs[shape.name] += 1  # a new scheduled run (the previous one may be unfinished)
    # A fail_commit, clear or crash on a stream with no run yet starts run 1: count it, so that a later
    # concurrent step takes two runs no step has started (seed 54 ran an already frozen run 1 beside a new one).
    model.runs[shape.name] = max(1, model.runs[shape.name])
    if kind == "crash":  # the run's ingest task dies at a point; flag: its retry follows at once
        point = rng.choice(CRASH_POINTS)
        return Step("crash", shape.name, run=model.runs[shape.name], mode=point, flag=rng.random() < 0.5)
    return Step(kind, shape.name, run=model.runs[shape.name])
