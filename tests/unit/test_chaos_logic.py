"""The chaos harness's pure parts: the seeded plan, the oracle, the call timer (no server)."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Mapping
from typing import Any

import pytest

from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from tests.chaos.delta import MODES as DELTA_MODES
from tests.chaos.delta import draw_documents
from tests.chaos.ledger import Ledger, Sent
from tests.chaos.oracle import (
    LakeRow,
    Snapshot,
    StoredMessage,
    Verdict,
    check_cursor_moves,
    check_delta,
    check_high_watermarks,
    check_lake,
    check_stream,
)
from tests.chaos.plan import CRASH_POINTS, make_plan
from tests.chaos.store import SeedStore, local_store, store_of
from tests.chaos.streams import SHAPES, shape_named
from tests.chaos.timing import CallTimer

PLAIN = shape_named("plain")
COMPACT = shape_named("compact")
COUNT = shape_named("count")


def kinds(verdict: Verdict) -> list[str]:
    return [f.kind for f in verdict.findings]


def ledger_with(stream: str, partition: int, acked: Mapping[int, tuple[bytes | None, bytes]]) -> Ledger:
    ledger = Ledger()
    for offset, (key, value) in acked.items():
        sent = Sent(stream, key, value)
        ledger.record_sent(sent)
        ledger.record_ack(sent, partition, offset)
    return ledger


def snapshot(stream: str, messages: Mapping[int, tuple[bytes | None, bytes]], high_watermark: int) -> Snapshot:
    stored = {o: StoredMessage(k, v) for o, (k, v) in messages.items()}
    return Snapshot(stream, 0, high_watermark, stored, step=1)


def row(stream: str, offset: int, value: bytes, start: int, end: int) -> LakeRow:
    return LakeRow(stream, 0, offset, None, value, f"partition=0/range={start}-{end}", start, end)


# -- the plan ----------------------------------------------------------------------


def test_a_seed_always_gives_the_same_plan_and_seeds_differ() -> None:
    assert make_plan(7, 40).steps == make_plan(7, 40).steps
    assert make_plan(7, 40).shapes == make_plan(7, 40).shapes
    assert make_plan(7, 40).steps != make_plan(8, 40).steps


@pytest.mark.parametrize("seed", range(30))
def test_every_kill_is_restarted_every_freeze_thawed_and_one_node_at_a_time(seed: int) -> None:
    steps = make_plan(seed, 60).steps
    down: str | None = None
    since = 0
    for index, step in enumerate(steps):
        if step.kind in ("kill_leader", "freeze"):
            assert down is None, f"seed {seed} step {index}: {step} while {down} is pending"
            down, since = step.kind, index
        elif step.kind in ("restart", "thaw"):
            assert down == {"restart": "kill_leader", "thaw": "freeze"}[step.kind]
            assert index - since <= 4
            down = None


@pytest.mark.parametrize("seed", [54, *range(30)])
def test_concurrent_runs_are_two_runs_no_earlier_step_started(seed: int) -> None:
    """A concurrent step stands for two new DAG runs freezing at the same time. A run that a fail_commit or
    clear step started earlier has frozen already, so running it "concurrently" with a new one makes two
    runs of different ranges from one cursor, which the commit refuses by design (one writer per cursor):
    seed 54 drew fail_commit on run 1 and then "concurrent runs 1,2"."""
    started: dict[str, set[int]] = {}
    for index, step in enumerate(make_plan(seed, 60).steps):
        runs = started.setdefault(step.stream, set())
        if step.kind == "concurrent":
            assert not {step.run, step.run + 1} & runs, f"seed {seed} step {index}: {step} after runs {runs}"
            runs.update((step.run, step.run + 1))
        elif step.kind in ("run", "fail_commit", "clear", "crash"):
            runs.add(step.run)


def test_plans_cover_every_step_kind_and_stream_shape() -> None:
    plans = [make_plan(seed, 40) for seed in range(40)]
    seen_kinds = {s.kind for p in plans for s in p.steps}
    assert seen_kinds >= {"publish", "run", "kill_leader", "restart", "freeze", "thaw", "readonly", "pause"}
    assert seen_kinds >= {"wait", "fail_commit", "clear", "concurrent", "delta", "crash"}
    assert {s.name for p in plans for s in p.shapes} == {s.name for s in SHAPES}


def test_crash_steps_die_at_every_point_of_an_ingest_with_and_without_the_next_run() -> None:
    crashes = [s for seed in range(200) for s in make_plan(seed, 24).steps if s.kind == "crash"]
    assert {s.mode for s in crashes} == set(CRASH_POINTS)
    assert {s.flag for s in crashes} == {True, False}


def test_even_seeds_keep_their_lakes_on_s3_unless_one_store_is_asked_for() -> None:
    assert [store_of(seed, "seed") for seed in (1, 2, 3, 4)] == ["local", "s3", "local", "s3"]
    assert {store_of(seed, "local") for seed in range(4)} == {"local"}
    assert {store_of(seed, "s3") for seed in range(4)} == {"s3"}
    with pytest.raises(ValueError, match="'gcs'"):
        store_of(1, "gcs")


def test_the_seed_store_names_what_the_job_and_pyarrow_see() -> None:
    store = SeedStore("s3", "bucket")
    assert store.uri("lake") == "s3a://bucket/lake"
    assert store.delta_uri("delta") == "s3://bucket/delta"
    assert store.fs_path("s3a://bucket/lake/stream=a/x.parquet") == "bucket/lake/stream=a/x.parquet"
    local = SeedStore("local", "/tmp/seed")
    assert local.uri("lake") == "/tmp/seed/lake"
    assert local.fs_path("file:/tmp/seed/lake/a") == "/tmp/seed/lake/a"


# -- the stream against the ledger -------------------------------------------------------


def test_a_stream_holding_exactly_the_acked_messages_is_clean() -> None:
    ledger = ledger_with("plain", 0, {0: (None, b"a"), 1: (None, b"b")})
    verdict = Verdict()
    check_stream(PLAIN, snapshot("plain", {0: (None, b"a"), 1: (None, b"b")}, 1), ledger, verdict, final=True)
    assert verdict.findings == []


def test_an_acked_offset_gone_from_a_plain_stream_is_lost() -> None:
    ledger = ledger_with("plain", 0, {0: (None, b"a"), 1: (None, b"b")})
    verdict = Verdict()
    check_stream(PLAIN, snapshot("plain", {1: (None, b"b")}, 1), ledger, verdict, final=False)
    assert kinds(verdict) == ["lost"]
    assert "offsets 0 " in verdict.findings[0].message


def test_compaction_explains_a_gap_only_when_the_key_survives_later() -> None:
    acked = {0: (b"k1", b"a"), 1: (b"k2", b"b"), 2: (b"k1", b"c")}
    ledger = ledger_with("compact", 0, acked)
    verdict = Verdict()
    check_stream(COMPACT, snapshot("compact", {2: (b"k1", b"c")}, 2), ledger, verdict, final=False)
    assert kinds(verdict) == ["lost"], "k2 has no later message: its removal is unexplained"
    assert verdict.removed == {("compact", 0, 0): "compaction (key b'k1' survives at offset 2)"}


def test_on_one_replica_an_acked_later_key_above_the_high_watermark_explains_compaction() -> None:
    """Chaos seed 79: a single replica restarted at an old high watermark had compacted with the later,
    now invisible messages; they explain the gap (with three replicas they would not)."""
    acked = {0: (b"k1", b"a"), 1: (b"k2", b"b"), 2: (b"k1", b"c")}
    ledger = ledger_with("compact", 0, acked)
    verdict = Verdict()
    check_stream(COMPACT, snapshot("compact", {}, 1), ledger, verdict, final=False)
    assert kinds(verdict) == ["lost"], "k2 has no later acked message: its removal is unexplained"
    assert verdict.removed == {("compact", 0, 0): "compaction (key b'k1' survives at offset 2)"}
    replicated = dataclasses.replace(COMPACT, replication=3)
    verdict = Verdict()
    check_stream(replicated, snapshot("compact", {}, 1), ledger, verdict, final=False)
    assert "offsets 0-1 " in verdict.findings[0].message


def test_retention_explains_only_offsets_below_the_oldest_retained() -> None:
    ledger = ledger_with("count", 0, {0: (None, b"a"), 1: (None, b"b"), 2: (None, b"c"), 3: (None, b"d")})
    verdict = Verdict()
    check_stream(COUNT, snapshot("count", {2: (None, b"c")}, 3), ledger, verdict, final=False)
    assert set(verdict.removed) == {("count", 0, 0), ("count", 0, 1)}
    assert kinds(verdict) == ["lost"]  # offset 3 is above the oldest one held: retention cannot explain it


def test_unknown_and_twice_stored_values_are_found() -> None:
    ledger = ledger_with("plain", 0, {0: (None, b"a")})
    verdict = Verdict()
    check_stream(
        PLAIN, snapshot("plain", {0: (None, b"a"), 1: (None, b"a"), 2: (None, b"zz")}, 2), ledger, verdict, final=False
    )
    assert sorted(kinds(verdict)) == ["phantom", "phantom", "stored-twice"]


def test_a_message_stored_without_ack_is_accepted() -> None:
    ledger = Ledger()
    sent = Sent("plain", None, b"maybe")
    ledger.record_sent(sent)
    ledger.record_maybe(sent)
    verdict = Verdict()
    check_stream(PLAIN, snapshot("plain", {0: (None, b"maybe")}, 0), ledger, verdict, final=True)
    assert verdict.findings == []


def test_acked_offsets_beyond_the_high_watermark_fail_only_at_the_end() -> None:
    ledger = ledger_with("plain", 0, {0: (None, b"a")})
    during, final = Verdict(), Verdict()
    check_stream(PLAIN, snapshot("plain", {}, -1), ledger, during, final=False)
    check_stream(PLAIN, snapshot("plain", {}, -1), ledger, final, final=True)
    assert kinds(during) == []
    assert kinds(final) == ["invisible"]


# -- the lake ------------------------------------------------------------------------


def lake_verdict(
    rows: list[LakeRow],
    stream_messages: Mapping[int, tuple[bytes | None, bytes]],
    cursor: int,
    *,
    final: bool = False,
    shape: str = "plain",
) -> Verdict:
    ledger = ledger_with(shape, 0, stream_messages)
    verdict = Verdict()
    snapshots = {(shape, 0): snapshot(shape, stream_messages, max(stream_messages, default=-1))}
    check_lake(
        rows,
        shapes={s.name: s for s in SHAPES},
        snapshots=snapshots,
        ledger=ledger,
        cursors={(shape, 0): cursor},
        verdict=verdict,
        final=final,
    )
    return verdict


def test_overlapping_range_folders_are_duplicates() -> None:
    messages = {o: (None, bytes([97 + o])) for o in range(4)}
    rows = [row("plain", o, messages[o][1], 0, 2) for o in range(2)]
    rows += [row("plain", o, messages[o][1], 0, 4) for o in range(4)]
    verdict = lake_verdict(rows, messages, cursor=3)
    assert kinds(verdict) == ["duplicate"]
    assert "range=0-2" in verdict.findings[0].message
    assert "range=0-4" in verdict.findings[0].message


def test_rows_outside_their_folder_and_wrong_values_are_found() -> None:
    messages = {0: (None, b"a"), 1: (None, b"b"), 2: (None, b"c")}
    rows = [row("plain", 0, b"a", 0, 2), row("plain", 1, b"x", 0, 2), row("plain", 2, b"c", 0, 2)]
    assert sorted(kinds(lake_verdict(rows, messages, cursor=1))) == ["lake-mismatch", "outside-range"]


def test_a_committed_offset_the_stream_holds_must_be_in_the_lake() -> None:
    messages = {0: (None, b"a"), 1: (None, b"b"), 2: (None, b"c")}
    rows = [row("plain", 0, b"a", 0, 3), row("plain", 2, b"c", 0, 3)]
    verdict = lake_verdict(rows, messages, cursor=2)
    assert kinds(verdict) == ["gap"]
    assert "offsets 1 " in verdict.findings[0].message
    assert kinds(lake_verdict(rows, messages, cursor=0)) == [], "offsets beyond the cursor may be missing"


def test_a_snapshot_kept_from_an_earlier_step_proves_no_gap_where_retention_acts() -> None:
    """Seed 125: a node was down, the oracle could not confirm what retention left and kept an old snapshot;
    the freeze had (rightly) found every offset removed and the commit moved the cursor past them."""
    messages = {o: (None, bytes([97 + o])) for o in range(3)}
    ledger = ledger_with("count", 0, messages)
    kept = snapshot("count", messages, 2)  # read at step 1

    def gaps(step: int, *, final: bool = False, shape: str = "count") -> list[str]:
        verdict = Verdict()
        check_lake(
            [],
            shapes={s.name: s for s in SHAPES},
            snapshots={(shape, 0): kept if shape == "count" else snapshot(shape, messages, 2)},
            ledger=ledger if shape == "count" else ledger_with(shape, 0, messages),
            cursors={(shape, 0): 2},
            verdict=verdict,
            final=final,
            step=step,
        )
        return kinds(verdict)

    assert gaps(1) == ["gap"], "a fresh snapshot still proves a gap"
    assert gaps(5) == [], "an old one, where retention acts, does not"
    assert gaps(5, final=True) == ["gap"], "the final check always counts"


def test_a_superseded_message_missing_from_the_lake_of_a_compacted_stream_is_no_gap() -> None:
    messages = {0: (b"k", b"a"), 1: (b"k", b"b")}
    assert kinds(lake_verdict([row("compact", 1, b"b", 0, 2)], messages, cursor=1, shape="compact")) == []


def test_rows_beyond_the_cursor_fail_only_at_the_end() -> None:
    messages = {0: (None, b"a"), 1: (None, b"b")}
    rows = [row("plain", 0, b"a", 0, 2), row("plain", 1, b"b", 0, 2)]
    assert kinds(lake_verdict(rows, messages, cursor=0)) == []
    assert kinds(lake_verdict(rows, messages, cursor=0, final=True)) == ["uncommitted"]


def test_rows_above_a_single_replicas_restored_high_watermark_beyond_the_cursor_are_a_note() -> None:
    """Seed 4: a run ingested compact/0 offsets 0-2, its commit failed, then the single replica was killed and
    came back with its old checkpointed high watermark (-1), so no later run could freeze those offsets and
    commit them. At RF 1 that is not promised (a note); rows beyond the cursor below the final high watermark,
    or on a guaranteed stream, stay findings."""
    messages = {0: (b"k", b"a"), 1: (b"j", b"b"), 2: (b"i", b"c")}
    rows = [row("compact", o, messages[o][1], 0, 3) for o in range(3)]
    ledger = ledger_with("compact", 0, messages)

    def verdict_at(high_watermark: int, shape: str = "compact") -> Verdict:
        verdict = Verdict()
        check_lake(
            [row(shape, r.offset, r.value, 0, 3) for r in rows],
            shapes={s.name: s for s in SHAPES},
            snapshots={(shape, 0): snapshot(shape, {} if high_watermark < 0 else messages, high_watermark)},
            ledger=ledger if shape == "compact" else ledger_with(shape, 0, messages),
            cursors={(shape, 0): -1},
            verdict=verdict,
            final=True,
        )
        return verdict

    hidden = verdict_at(-1)
    assert kinds(hidden) == []
    assert any("uncommitted, not promised at RF 1" in n for n in hidden.notes), hidden.notes
    assert kinds(verdict_at(2)) == ["uncommitted"], "the stream shows them: the drain could have committed them"
    assert kinds(verdict_at(-1, shape="plain")) == ["uncommitted"], "RF 3 promises it"


def test_a_cursor_moving_back_is_found() -> None:
    verdict = Verdict()
    check_cursor_moves({("plain", 0): 10, ("plain", 1): 3}, {("plain", 0): 7, ("plain", 1): 5}, verdict)
    assert kinds(verdict) == ["cursor-back"]
    assert "from 10 to 7" in verdict.findings[0].message


def test_a_high_watermark_moving_back_is_noted_a_lagging_new_leader_is_no_loss() -> None:
    shapes = {s.name: s for s in SHAPES}
    verdict = Verdict()
    for stream in ("plain", "age"):
        before = {(stream, 0): snapshot(stream, {0: (None, b"a")}, 6)}
        after = {(stream, 0): snapshot(stream, {}, -1)}
        check_high_watermarks(shapes, before, after, verdict)
        check_high_watermarks(shapes, after, before, verdict)
    assert kinds(verdict) == []
    assert len(verdict.notes) == 2
    assert "plain/0 moved back from 6" in verdict.notes[0]
    assert "age/0" in verdict.notes[1]


def test_the_ledger_tells_of_an_offset_acked_twice() -> None:
    ledger = Ledger()
    first, second = Sent("age", None, b"a"), Sent("age", None, b"b")
    assert ledger.record_ack(first, 0, 0) is None
    assert ledger.record_ack(second, 0, 0) == first


# -- the call timer ----------------------------------------------------------------------


def test_the_timer_tells_on_time_late_and_hung_calls_apart() -> None:
    timer = CallTimer(grace=0.2, observe=0.3)
    on_time = timer.call("fast one", 1.0, lambda: 42)
    late = timer.call("late one", 0.1, lambda: time.sleep(0.4))
    hung = timer.call("hung one", 0.1, lambda: time.sleep(3))
    failed = timer.call("failed one", 1.0, lambda: 1 / 0)
    assert (on_time.ok, on_time.value, on_time.late) == (True, 42, False)
    assert (late.late, late.hung, late.error) == (True, False, None)
    assert (hung.late, hung.hung) == (True, True)
    assert hung.seconds < 1.5
    assert isinstance(failed.error, ZeroDivisionError)
    assert not failed.late
    assert [o.name for o in timer.late] == ["late one", "hung one"]
    assert set(timer.seconds_by_kind) == {"fast", "late", "hung", "failed"}


def test_a_server_that_died_on_its_own_makes_the_cluster_impaired_and_is_restarted_like_a_killed_one() -> None:
    """CI seed 1 (2026-11-23): a Liftbridge node died of SIGBUS in its index write (a server defect) and the
    harness judged the calls that then failed as failures on a healthy cluster."""
    from types import SimpleNamespace  # noqa: PLC0415

    from tests.chaos.world import Timeouts, World  # noqa: PLC0415

    def node(server_id: str, running: bool) -> SimpleNamespace:
        return SimpleNamespace(server_id=server_id, process=SimpleNamespace(running=running))

    cluster = SimpleNamespace(nodes=[node("n1", False), node("n2", True)], frozen=[])
    required = [f.name for f in dataclasses.fields(World) if f.default is f.default_factory is dataclasses.MISSING]
    fields: dict[str, Any] = dict.fromkeys(required)
    fields.update(cluster=cluster, timeouts=Timeouts(), seed=1)
    world = World(**fields)
    world.calm_since = time.monotonic() - 60
    assert world.impaired == "n1 killed"
    assert (world.killed, world.crashed) == (["n1"], ["n1"])
    assert world.impaired == "n1 killed"
    assert world.crashed == ["n1"], "a crash is noticed once"


def _bare_world(cluster: Any) -> Any:
    from tests.chaos.world import Timeouts, World  # noqa: PLC0415

    required = [f.name for f in dataclasses.fields(World) if f.default is f.default_factory is dataclasses.MISSING]
    fields: dict[str, Any] = dict.fromkeys(required)
    fields.update(cluster=cluster, timeouts=Timeouts(), seed=1)
    return World(**fields)


class _CrashingCluster:
    """n1 was killed; while it rejoins, n3 crashes (seed 185), so n1's readiness wait fails once."""

    def __init__(self) -> None:
        from types import SimpleNamespace  # noqa: PLC0415

        ids = ("n1", "n2", "n3")
        self.nodes = [SimpleNamespace(server_id=s, process=SimpleNamespace(running=s != "n1")) for s in ids]
        self.frozen: list[str] = []
        self.crashed_once = False

    def node(self, server_id: str) -> Any:
        return next(n for n in self.nodes if n.server_id == server_id)

    def restart(self, server_id: str, timeout: float) -> None:
        self.node(server_id).process.running = True
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        if not self.crashed_once:
            self.crashed_once = True
            self.node("n3").process.running = False
        down = [n.server_id for n in self.nodes if not n.process.running]
        if down:
            raise RuntimeError(f"node {down[0]} exited (status 2)")


def test_a_node_that_crashes_while_another_rejoins_is_restarted_too_and_is_no_finding() -> None:
    """Seed 185 (8dbbf17): n3 panicked (a v1.9.0 server bug) during n1's restart; the step failed as
    "n1 did not rejoin" although the harness notes such a crash and restarts the node."""
    from tests.chaos.faults import restart  # noqa: PLC0415
    from tests.chaos.plan import Step  # noqa: PLC0415

    cluster = _CrashingCluster()
    world = _bare_world(cluster)
    world.killed.append("n1")
    report = restart(world, Step("restart"), 12)
    assert report.findings == []
    assert world.killed == []
    assert world.crashed == ["n3"], "the crash is left for the step's note"
    assert "restarted n3" in report.summary
    assert "restarted n1" in report.summary


def test_a_node_that_never_rejoins_is_still_a_finding() -> None:
    from tests.chaos.faults import restart  # noqa: PLC0415
    from tests.chaos.plan import Step  # noqa: PLC0415

    cluster = _CrashingCluster()
    cluster.crashed_once = True

    def never(timeout: float) -> None:
        raise RuntimeError("Liftbridge not ready after 150s")

    cluster.wait_ready = never  # type: ignore[method-assign]
    world = _bare_world(cluster)
    world.killed.append("n1")
    report = restart(world, Step("restart"), 3)
    assert [f.kind for f in report.findings] == ["restart"]
    assert world.killed == ["n1"]


@pytest.mark.parametrize(
    ("replication", "moved_back", "error", "finding"),
    [
        (1, True, "AirflowSensorTimeout: Sensor has timed out", False),
        (1, False, "AirflowSensorTimeout: Sensor has timed out", True),
        (3, True, "AirflowSensorTimeout: Sensor has timed out", True),
        (1, True, "UnavailableError: no broker", True),
        (1, False, "BeyondHighWatermarkError: offset 9 is beyond", False),
    ],
)
def test_an_rf1_wait_that_times_out_after_its_high_watermark_moved_back_is_not_promised(
    replication: int, moved_back: bool, error: str, finding: bool
) -> None:
    """Seed 155 (8dbbf17): a paused RF 1 partition whose leader was SIGKILLed right after a publish came back
    with high watermark -1 until the next write; the offset sensor timed out on a healthy cluster."""
    from types import SimpleNamespace  # noqa: PLC0415

    from tests.chaos.judging import StepReport, judge  # noqa: PLC0415
    from tests.chaos.timing import Outcome  # noqa: PLC0415

    world = _bare_world(SimpleNamespace(nodes=[], frozen=[]))
    world.calm_since = time.monotonic() - 60  # healthy
    if moved_back:
        world.hw_back[("age", 1)] = 144
    report = StepReport("wait chaos__age__1 FAILED")
    outcome: Outcome[Any] = Outcome("wait chaos__age__1", 31, 20.0, error=RuntimeError(error))
    judge(world, report, outcome, batch_task="wait", replication=replication, stream="age")
    assert bool(report.findings) is finding
    assert ("not promised at RF 1" in report.summary) is not finding


def test_two_nodes_down_both_rejoin_although_the_first_wait_fails_on_the_second() -> None:
    """Review of the seed-185 fix: with n1 killed and n3 crashed earlier, n1's readiness wait fails at once
    ("n3 exited") because n3 is not started yet; n3 then rejoins, and n1 must be waited for again."""
    from tests.chaos.faults import restart  # noqa: PLC0415
    from tests.chaos.plan import Step  # noqa: PLC0415

    cluster = _CrashingCluster()
    cluster.crashed_once = True
    cluster.node("n3").process.running = False
    world = _bare_world(cluster)
    world.killed += ["n1", "n3"]
    report = restart(world, Step("restart"), 5)
    assert report.findings == []
    assert world.killed == []


def test_a_moved_back_high_watermark_is_remembered_per_partition_until_it_is_back() -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from tests.chaos.observe import _track_moved_back  # noqa: PLC0415

    world = _bare_world(SimpleNamespace(nodes=[], frozen=[]))
    world.snapshots = {("age", 1): Snapshot("age", 1, -1, {}, 19), ("age", 0): Snapshot("age", 0, 9, {}, 19)}
    _track_moved_back(world, {("age", 1): 144})
    assert world.hw_back == {("age", 1): 144}
    world.snapshots[("age", 1)] = Snapshot("age", 1, 100, {}, 20)
    _track_moved_back(world, {})
    assert world.hw_back == {("age", 1): 144}, "not back yet"
    world.snapshots[("age", 1)] = Snapshot("age", 1, 150, {}, 21)
    _track_moved_back(world, {})
    assert world.hw_back == {}


def test_a_run_whose_task_failed_stops_even_when_the_failure_is_excused() -> None:
    """Seed 82 hung for 14 minutes on c28e17d: a cleared re-run of an RF 1 stream retried its wait task
    without end, because the excuse appended to the step's summary hid the "FAILED" the loop looked for."""
    from types import SimpleNamespace  # noqa: PLC0415

    from tests.chaos.runs import _run_to_end  # noqa: PLC0415
    from tests.chaos.timing import Outcome  # noqa: PLC0415

    world = _bare_world(SimpleNamespace(nodes=[], frozen=[]))
    world.calm_since = time.monotonic() - 60
    world.hw_back[("compact", 1)] = 83
    calls: list[str] = []

    def run_task(run: Any) -> Outcome[Any]:
        calls.append(run.next_task)
        assert len(calls) < 5, "the run keeps retrying a failed task"
        return Outcome("wait chaos__compact__1", 31, 20.0, error=RuntimeError("AirflowSensorTimeout: timed out"))

    world.batch = SimpleNamespace(run_task=run_task)
    run = SimpleNamespace(done=False, next_task="wait", shape=SimpleNamespace(replication=1, name="compact"))
    reports = _run_to_end(world, run)  # type: ignore[arg-type]
    assert calls == ["wait"]
    assert [r.findings for r in reports] == [[]]
    assert "not promised at RF 1" in reports[0].summary


def test_a_call_that_began_while_the_cluster_settled_is_excused_even_if_it_ended_after() -> None:
    """Seed 92 (c9e2651): a publish_batch began 3 s after a node frozen for 39 s was thawed (the settle time
    is 6 s) and failed 3 s later, every ack missing; the harness judged the cluster at the call's end,
    healthy by then, and reported a failure on a healthy cluster."""
    from types import SimpleNamespace  # noqa: PLC0415

    from tests.chaos.judging import StepReport, judge  # noqa: PLC0415
    from tests.chaos.timing import Outcome  # noqa: PLC0415

    world = _bare_world(SimpleNamespace(nodes=[], frozen=[]))
    settle = world.timeouts.settle
    world.calm_since = time.monotonic() - settle - 1  # healthy now, for 1 s
    failure = RuntimeError("BatchPublishError: 69 of 69 messages failed: #0: no ack within 3s")
    began_settling: Outcome[Any] = Outcome("publish_batch pausing", 10, 4.0, error=failure)
    report = StepReport("publish pausing 69x batch keyed")
    judge(world, report, began_settling)
    assert report.findings == []

    began_healthy: Outcome[Any] = Outcome("publish_batch pausing", 10, 0.5, error=failure)
    report = StepReport("publish pausing 69x batch keyed")
    judge(world, report, began_healthy)
    assert [f.kind for f in report.findings] == ["failed-healthy"]


def test_a_message_that_may_be_stored_can_compact_older_ones_before_a_read_reaches_it() -> None:
    """CI seed 1 on 09ac378: a sync publish to the frozen RF 1 leader of compact/0 timed out ("may be
    stored"); at the thaw the leader stored it above the high watermark the oracle had just read, and its
    cleaner removed the older offsets of the same keys; the read up to that high watermark saw neither,
    and the oracle called the older offsets lost. Mid-run, a later message that may be stored explains the
    gap; the final check (after the drain, everything stored is below the high watermark) does not."""
    ledger = ledger_with("compact", 0, {0: (b"k1", b"a"), 1: (b"k2", b"b")})
    ledger.record_maybe(Sent("compact", b"k1", b"maybe"))
    during = Verdict()
    check_stream(COMPACT, snapshot("compact", {1: (b"k2", b"b")}, 1), ledger, during, final=False)
    assert kinds(during) == []
    assert "may be stored" in during.removed[("compact", 0, 0)]
    final = Verdict()
    check_stream(COMPACT, snapshot("compact", {1: (b"k2", b"b")}, 1), ledger, final, final=True)
    assert kinds(final) == ["lost"]


def test_acks_an_auto_pause_dropped_are_excused_only_on_a_stream_that_auto_pauses() -> None:
    """Seed 5 (8fa8221): 7 s after a restart, past the settle time, a publish_batch with ack ALL to the
    auto-pausing stream got no ack at all (the partition paused 2 s after the batch with the acks pending;
    the server drops pending acks when a partition pauses and commits the messages later without one:
    tests/server/test_client_faults.py::test_acks_an_auto_pause_dropped_are_reported_as_may_be_stored).
    The harness reported a failure on a healthy cluster. Ack timeouts after the stream's auto-pause time are
    the server's; any other failure, or the same on a stream that never pauses, stays a finding."""
    from types import SimpleNamespace  # noqa: PLC0415

    from liftbridge_provider.client import (  # noqa: PLC0415
        AckTimeoutError,
        BatchResult,
        LiftbridgeError,
        UnavailableError,
    )
    from liftbridge_provider.client.publish.batch_result import BatchPublishError, Failures  # noqa: PLC0415
    from tests.chaos.judging import StepReport, judge  # noqa: PLC0415
    from tests.chaos.timing import Outcome  # noqa: PLC0415

    world = _bare_world(SimpleNamespace(nodes=[], frozen=[]))
    world.calm_since = time.monotonic() - 60
    world.shapes = {shape.name: shape for shape in SHAPES}

    def batch_error(error: LiftbridgeError) -> BatchPublishError:
        return BatchPublishError(BatchResult([None, None], Failures({0: error, 1: error}, size=2)))

    def findings(stream: str, error: BaseException, seconds: float = 3.0) -> list[str]:
        report = StepReport(f"publish {stream} 2x batch")
        judge(world, report, Outcome(f"publish_batch {stream}", 10, seconds, error=error), stream=stream)
        return [f.kind for f in report.findings]

    no_ack = AckTimeoutError("no ack within 3s", stream="pausing", partition=1, may_be_stored=True)
    assert findings("pausing", batch_error(no_ack)) == []
    assert findings("pausing", no_ack, seconds=5.0) == [], "a sync publish's ack timeout too"
    assert findings("plain", batch_error(no_ack)) == ["failed-healthy"], "plain never pauses"
    assert findings("pausing", batch_error(no_ack), seconds=1.0) == ["failed-healthy"], "before a pause"
    refused = UnavailableError("no leader", stream="pausing", partition=1)
    assert findings("pausing", batch_error(refused)) == ["failed-healthy"], "not an ack timeout"


# -- the Delta table -----------------------------------------------------------------


def delta_row(stream: str, offset: int, value: bytes) -> LakeRow:
    return LakeRow(stream, 0, offset, None, value, "delta", 0, 2**63 - 1)


def delta_verdict(rows: list[LakeRow], landed: list[tuple[int, int]], shape: Any = PLAIN, step: int = 1) -> Verdict:
    acked = {o: (None, f"v{o}".encode()) for o in range(10)}
    verdict = Verdict()
    check_delta(
        rows,
        landed=[RangesDocument(shape.name, (OffsetRange(0, s, e),)) for s, e in landed],
        shapes={shape.name: shape},
        snapshots={(shape.name, 0): snapshot(shape.name, acked, 9)},
        ledger=ledger_with(shape.name, 0, acked),
        verdict=verdict,
        step=step,
    )
    return verdict


def test_a_delta_table_holding_its_landed_ranges_once_is_clean() -> None:
    rows = [delta_row("plain", o, f"v{o}".encode()) for o in range(8)]
    assert kinds(delta_verdict(rows, [(0, 5), (3, 8)])) == []


def test_an_offset_twice_in_the_delta_table_is_a_duplicate_and_a_wrong_value_a_mismatch() -> None:
    rows = [delta_row("plain", o, f"v{o}".encode()) for o in range(5)]
    rows += [delta_row("plain", 2, b"v2"), delta_row("plain", 7, b"nope")]
    assert kinds(delta_verdict(rows, [(0, 5)])) == ["delta-duplicate", "delta-mismatch"]


def test_a_landed_range_the_table_lacks_is_lost_unless_compaction_or_a_stale_retention_snapshot_explains_it() -> None:
    rows = [delta_row("plain", o, f"v{o}".encode()) for o in range(5)]
    assert kinds(delta_verdict(rows, [(0, 8)])) == ["delta-lost"]
    assert kinds(delta_verdict(rows, [(0, 5)])) == [], "offsets outside every landed range may be missing"
    count_rows = [delta_row("count", o, f"v{o}".encode()) for o in range(5)]
    assert kinds(delta_verdict(count_rows, [(0, 8)], COUNT, step=2)) == [], "the snapshot is from step 1"
    assert kinds(delta_verdict(count_rows, [(0, 8)], COUNT, step=1)) == ["delta-lost"]


def test_delta_steps_draw_documents_from_the_frozen_ones_and_every_mode_appears() -> None:
    frozen = [RangesDocument("plain", (OffsetRange(0, s, s + 10),)) for s in range(0, 50, 10)]
    rng = random.Random(3)
    for mode in DELTA_MODES:
        chosen = draw_documents(rng, frozen, mode)
        assert chosen
        assert all(d in frozen for d in chosen)
        assert len(chosen) == {"concurrent": 2, "retry": 1, "crash": 1}.get(mode, len(chosen))
    assert draw_documents(rng, [], "order") == []
    modes = {s.mode for seed in range(40) for s in make_plan(seed, 40).steps if s.kind == "delta"}
    assert modes == set(DELTA_MODES)


def test_the_seed_stores_copy_leaves_source_and_target_as_a_crash_mid_rename_does(tmp_path: Any) -> None:
    """The mid-rename crash copies the staged object to its final key, in a folder no one made yet, and keeps
    the source (seed 101 failed in the harness when the local copy had no folder to go to)."""
    store = local_store(tmp_path)
    staged = tmp_path / "lake" / "_staging" / "piece.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    final = tmp_path / "lake" / "stream=s" / "partition=0" / "range=0-5" / "piece.parquet"
    store.copy(f"file:{staged}", f"file:{final}")
    assert (staged.read_bytes(), final.read_bytes()) == (b"rows", b"rows")
