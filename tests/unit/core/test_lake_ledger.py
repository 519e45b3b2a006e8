"""The claim ledger's checkpoints and compaction (core/lake_checkpoint.py, core/lake_ledger.py), over an in-memory
store with an atomic create-if-absent and delete.

Folding is deterministic (equal files however it was reached), a run's requests do not grow with history, the
races the rules exist for (a claim or a commit re-created after a compaction deleted it, two compactors) end
well, and a randomized interleaving of writers and compactors, killed before any operation, never shows a reader
a partial piece or an offset twice, and leaves a ledger the next run completes.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from liftbridge_provider.core.lake import Claim, Commit, LakeError, check_ledger, encode
from liftbridge_provider.core.lake_checkpoint import FANOUT, Checkpoint, NodeRef, fold, folded_claims
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange
from tests.unit.core.ledger_model import (
    LEDGER,
    STREAM,
    Scheduler,
    check_published,
    claims_of,
    compact_once,
    run_once,
)
from tests.unit.core.memory_store import MemoryStore


def done(seq: int, start: int, end: int) -> Claim:
    return Claim(seq, 0, start, end, "r", Commit(f"_staging/r/{seq}", end - start, start, end - 1, "r", 10))


def r(start: int, end: int) -> OffsetRange:
    return OffsetRange(0, start, end)


def history(count: int) -> list[Claim]:
    """``count`` one-offset runs, in offset order."""
    return [done(i, i, i + 1) for i in range(count)]


def test_folding_claims_one_at_a_time_or_all_at_once_writes_the_same_files() -> None:
    """The tree is a function of the claims alone: two compactors that started from different checkpoints write
    byte-identical nodes and checkpoints (so a lost race to create one finds the same bytes)."""
    claims = history(FANOUT * FANOUT + 3 * FANOUT + 5)
    whole, whole_nodes = fold(None, 0, claims)
    step, nodes = None, {}
    index = 0
    for size in [1, 7, 63, 64, 65, 200, 1]:
        step, made = fold(step, 0, claims[index : index + size])
        nodes.update(made)
        index += size
    step, made = fold(step, 0, claims[index:])
    nodes.update(made)
    assert step is not None
    assert encode(step.to_json()) == encode(whole.to_json())
    assert nodes == whole_nodes
    assert [len(level) for level in whole.levels] == [5, 3, 1], "a level-2 node, three level-1 nodes, 5 claims"
    assert whole.covered == ((0, len(claims)),)
    assert Checkpoint.parse(0, encode(whole.to_json()), "c") == whole


def test_a_lookup_reads_only_the_nodes_whose_offsets_it_overlaps() -> None:
    checkpoint, nodes = fold(None, 0, history(10 * FANOUT))
    reads: list[str] = []

    def read(ref: NodeRef) -> bytes:
        reads.append(ref.name)
        return nodes[ref.name]

    assert folded_claims(checkpoint, read, span=(10 * FANOUT, 10 * FANOUT + 5)) == []
    assert reads == [], "a range past the lake's offsets reads no node"
    found = folded_claims(checkpoint, read, span=(3 * FANOUT + 2, 3 * FANOUT + 4))
    assert [c.seq for c in found] == [3 * FANOUT + 2, 3 * FANOUT + 3]
    assert reads == [f"nodes/L1-{3 * FANOUT:010d}-{4 * FANOUT:010d}.json"]
    assert len(folded_claims(checkpoint, lambda ref: nodes[ref.name])) == 10 * FANOUT
    assert folded_claims(checkpoint, lambda ref: nodes[ref.name], seq=77)[0].seq == 77


def test_only_a_committed_prefix_numbered_on_folds() -> None:
    with pytest.raises(LakeError, match="only committed claims numbered from 0"):
        fold(None, 0, [done(1, 0, 1)])
    with pytest.raises(LakeError, match="only committed claims"):
        fold(None, 0, [Claim(0, 0, 0, 1, "r")])


def test_a_run_compacts_the_ledger_and_the_next_one_reads_one_checkpoint() -> None:
    store = MemoryStore()
    for start in range(0, 50, 10):
        plan = run_once(store, f"run{start}", r(start, start + 10), 4)
        assert plan.settled
    names = store.list_names(LEDGER)
    assert names == ["checkpoint-0000000015.json"], "claims folded and deleted: a LIST stays short"
    assert check_published(store.files) == list(range(50))
    claims = claims_of(store)
    check_ledger(claims)
    assert [(c.start, c.end) for c in claims][:3] == [(0, 4), (4, 8), (8, 10)]
    plan = run_once(store, "rerun", r(5, 25), 4)
    assert plan.settled
    assert plan.claim == ()
    assert [(c.start, c.end) for c in plan.held] == [(4, 8), (8, 10), (10, 14), (14, 18), (18, 20), (20, 24), (24, 28)]
    assert check_published(store.files) == list(range(50)), "a rerun of held offsets writes nothing"


def requests_of_a_run(store: MemoryStore, start: int) -> dict[str, int]:
    store.ops.clear()
    assert run_once(store, f"run-{start}", r(start, start + 10), 5).settled
    return dict(store.ops)


def test_a_runs_requests_do_not_grow_with_the_ledgers_age() -> None:
    """A run after 100,000 earlier runs of its partition makes the same requests as a run on a fresh lake: the
    history is one checkpoint and nodes no run reads unless its range overlaps them."""
    fresh = MemoryStore()
    first = requests_of_a_run(fresh, 0)
    again = requests_of_a_run(fresh, 10)
    old = MemoryStore()
    checkpoint, nodes = fold(None, 0, history(100_000))
    for name, data in nodes.items():
        old.files[f"{LEDGER}/{name}"] = data
    old.files[f"{LEDGER}/{checkpoint.file}"] = encode(checkpoint.to_json())
    aged = requests_of_a_run(old, 100_000)
    assert aged == again, "the same requests as the second run of a fresh lake"
    assert aged == {**first, "read": first.get("read", 0) + 2}, "the first run has no checkpoint to read (twice)"
    assert len(old.list_names(LEDGER)) == 2, "the checkpoint and the nodes folder"
    assert len(old.files[f"{LEDGER}/checkpoint-0000100002.json"]) < 64 * 1024


def test_a_claim_recreated_after_a_compaction_deleted_it_is_void() -> None:
    """A writer reads the ledger; meanwhile another run claims, commits, publishes and compacts claim 0, deleting
    its file. The writer's create of claim 0 then succeeds again: its listing after the create shows the
    checkpoint covering 0, so it deletes its claim and decides again, and claims nothing the lake holds."""
    store = MemoryStore()
    slow = Ledger(store, STREAM, 0, "slow")
    state = slow.read()
    assert run_once(store, "fast", r(0, 10), None).settled
    assert store.list_names(LEDGER) == ["checkpoint-0000000001.json"]
    plan, after = slow.claim(r(0, 15), state=state)
    assert [(c.seq, c.start, c.end) for c in plan.write] == [(1, 10, 15)]
    assert after.upto == 1
    assert "claim-0000000000.json" not in store.list_names(LEDGER), "the void claim is deleted"
    check_ledger(claims_of(store))


def test_a_commit_recreated_after_a_compaction_deleted_it_is_void_and_not_published() -> None:
    """Two runs write open claim 0; one commits, publishes and compacts it. The other's commit create then
    succeeds on the deleted name: void, deleted, and the winner is the folded commit; nothing is re-published."""
    store = MemoryStore()
    Ledger(store, STREAM, 0, "crashed").claim(r(0, 10))
    slow = Ledger(store, STREAM, 0, "slow")
    (open_claim,) = slow.read().recent
    assert run_once(store, "fast", r(0, 10), None).settled
    published = dict(store.files)
    mine = Commit("_staging/slow/0", 10, 0, 9, "slow", 20)
    winner = slow.commit(open_claim, mine)
    assert winner.run == "fast"
    assert "claim-0000000000.commit.json" not in store.list_names(LEDGER)
    assert {k: v for k, v in store.files.items() if "_ledger" not in k} == {
        k: v for k, v in published.items() if "_ledger" not in k
    }


def test_two_compactors_racing_write_the_same_files_and_neither_fails() -> None:
    store = MemoryStore()
    for start in range(0, 3 * FANOUT, 1):
        Ledger(store, STREAM, 0, f"w{start}").claim(r(start, start + 1))
    writer = Ledger(store, STREAM, 0, "w")
    state = writer.read()
    commits = {c: Commit("", 0, None, None, "w", 0) for c in state.recent}
    writer.commit_all(commits)
    first, second = Ledger(store, STREAM, 0, "a"), Ledger(store, STREAM, 0, "b")
    seen_by_second = second.read()
    first.compact(first.read())
    after = second.compact(seen_by_second)
    assert after.upto == 3 * FANOUT
    assert store.list_names(LEDGER) == ["checkpoint-0000000192.json", "nodes"]
    assert len(claims_of(store)) == 3 * FANOUT


@pytest.mark.parametrize(
    "point", ["ledger.compacting", "ledger.nodes_written", "ledger.checkpointed", "delete"], ids=str
)
def test_a_compaction_stopped_at_any_step_leaves_a_ledger_the_next_run_reads(point: str) -> None:
    class Stop(BaseException):
        pass

    store = MemoryStore()
    for start in range(FANOUT + 6):  # one claim more than a node holds, and a few
        Ledger(store, STREAM, 0, f"w{start}").claim(r(start, start + 1))
    writer = Ledger(store, STREAM, 0, "w")
    for claim in writer.read().recent:
        staged = f"_staging/w/{claim.seq}"
        store.files[f"{STREAM}/{staged}"] = f"{claim.start}\n".encode()
        writer.commit(claim, Commit(staged, 1, claim.start, claim.start, "w", len(f"{claim.start}\n")))

    def stop(name: str) -> None:
        if name == point:
            raise Stop(name)

    def stop_at_delete(kind: str, path: str) -> None:
        if kind == "delete":
            raise Stop(path)

    if point == "delete":
        store.before_op = stop_at_delete
    with pytest.raises(Stop):
        Ledger(store, STREAM, 0, "compactor", step=stop).compact()
    store.before_op = None
    plan = run_once(store, "next", r(0, FANOUT + 16), 5)
    assert plan.settled
    assert [(c.start, c.end) for c in plan.held][-3:] == [(FANOUT + 5, FANOUT + 6), (70, 75), (75, 80)]
    assert check_published(store.files) == list(range(FANOUT + 16))
    assert sorted(o for c in claims_of(store) for o in range(c.start, c.end)) == list(range(FANOUT + 16))
    assert store.list_names(LEDGER) == [f"checkpoint-{FANOUT + 8:010d}.json", "nodes"]


SEEDS = range(250)


@pytest.mark.parametrize("seed", SEEDS)
def test_writers_and_compactors_interleaved_at_random_and_killed_keep_each_offset_once(seed: int) -> None:
    """Three to five runs of random, overlapping ranges (some slow: others run between their steps) and two
    compactors, one store operation at a time in a seeded random order, each killed before any operation with
    some chance. After every operation a reader sees
    whole pieces and no offset twice, and every folded claim is published; at the end a clean run over all the
    offsets finishes whatever the dead left, and the lake holds each offset exactly once."""
    store = MemoryStore()
    rng = random.Random(seed)
    scheduler = Scheduler(store, seed, kill_rate=rng.choice([0.0, 0.01, 0.03]))
    ranges = []
    for index in range(rng.randint(3, 5)):
        start = rng.randrange(0, 40)
        ranges.append(r(start, start + rng.randint(1, 25)))
        size = rng.choice([None, 1, 3, 8])
        speed = rng.choice([1.0, 1.0, 0.1, 0.02])
        scheduler.add(f"run{index}", functools.partial(run_once, store, f"run{index}", ranges[-1], size), speed)
    for index in range(2):
        scheduler.add(f"compactor{index}", functools.partial(compact_once, store, f"compactor{index}", times=4))
    scheduler.run(lambda: check_published(store.files))
    low, high = min(w.start for w in ranges), max(w.end for w in ranges)
    final = run_once(store, "final", r(low, high), None)
    assert final.settled, final
    assert sorted(check_published(store.files)) == list(range(low, high))
    claims = claims_of(store)
    check_ledger(claims)
    assert all(c.committed for c in claims)
    assert [dataclasses.astuple(c)[2:4] for c in final.held] == sorted(
        (c.start, c.end) for c in claims if c.overlaps(low, high)
    )
