"""A Parquet lake's ledger history made synthetically through the store, and one run's bookkeeping without Spark.

What a partition's ledger holds after ``runs`` earlier one-offset runs is a
function of those claims alone (``core/lake_checkpoint.py``: folding them one
run at a time or at once writes the same files), so :func:`write_history`
writes it at once: the nodes and the checkpoint, each created exclusively
through the store, as compactions would have. :func:`bookkeeping_run` is the
ledger's share of a run (``spark/parquet_ingest.py`` less the Spark job: a
small staged object stands for each piece's rows). Used by
tests/spark/test_lake_history.py and bench/bench_lake_history.py.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from liftbridge_provider.core.lake import Claim, Commit, encode
from liftbridge_provider.core.lake_checkpoint import fold
from liftbridge_provider.core.lake_ledger import Ledger
from liftbridge_provider.core.ranges import OffsetRange

STAGED_BYTES = b"PAR1" + b"\0" * 256 + b"PAR1"  # stands for a staged Parquet object (never read back)


def write_history(store: Any, stream_folder: str, partition: int, runs: int, end: int, *, threads: int = 16) -> None:
    """Write the ledger ``runs`` earlier one-offset runs of ``partition`` left: offsets ``end - runs`` to
    ``end - 1``, every claim committed, published and folded (the objects themselves are not written: no run
    reads them unless its range overlaps them)."""
    first = end - runs
    claims = [
        Claim(i, partition, first + i, first + i + 1, f"h{i}", Commit("", 1, first + i, first + i, f"h{i}", 264))
        for i in range(runs)
    ]
    checkpoint, nodes = fold(None, partition, claims)
    folder = f"{stream_folder}/_ledger/partition={partition}"
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda item: store.create_exclusive(f"{folder}/{item[0]}", item[1]), nodes.items()))
    store.create_exclusive(f"{folder}/{checkpoint.file}", encode(checkpoint.to_json()))


def bookkeeping_run(store: Any, stream_folder: str, wanted: OffsetRange, pieces: int) -> float:
    """The ledger's work of one run of ``wanted`` in ``pieces`` pieces (claim, commit, publish, compact,
    settle), a small staged object per piece standing for Spark's; the seconds the ledger's work took (the
    staged objects' writes not counted)."""
    start, end, partition = wanted.start, wanted.end, wanted.partition
    run = f"bench-{start}"
    ledger = Ledger(store, stream_folder, partition, run)
    began = time.perf_counter()
    state = ledger.read()
    for claim in state.recent:
        if claim.committed:
            ledger.publish(claim)
    plan, _ = ledger.claim(wanted, size=-(-(end - start) // pieces), state=state)
    spent = time.perf_counter() - began
    commits = {}
    for claim in plan.write:
        staged = f"_staging/{run}/p={partition}/claim={claim.seq}/part-0.parquet"
        store.write(f"{stream_folder}/{staged}", STAGED_BYTES)  # a CountingStore passes it on uncounted
        rows = claim.end - claim.start
        commits[claim] = Commit(staged, rows, claim.start, claim.end - 1, run, len(STAGED_BYTES))
    began = time.perf_counter()
    winners, _ = ledger.commit_all(commits)
    for claim, commit in commits.items():
        assert winners[claim.seq] == commit
        ledger.publish(dataclasses.replace(claim, commit=commit), just_committed=True)
    state = ledger.compact(ledger.read())
    final = ledger.full_plan(state, wanted)
    assert final.settled, final
    return spent + time.perf_counter() - began
