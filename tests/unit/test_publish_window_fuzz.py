"""A batch's window against a simulated server that acks, refuses without storing (the metadata leader is being
replaced), stores but loses the ack, or drops messages, and where some messages taken are never written (flow
control), in random order over seeded runs. What must hold
whatever happens: no message is stored twice, the stored messages of each partition are in the batch's order,
every acked message was stored, every failure that says "not stored" was not, and the batch ends."""

from __future__ import annotations

import random

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import AckTimeoutError, LiftbridgeError
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.publish.publish_window import PublishWindow

ACK_WAIT = 1.0


def run_batch(seed: int) -> None:
    rng = random.Random(seed)
    size, partitions = rng.randint(1, 40), rng.randint(1, 3)
    partition_of = [rng.randrange(partitions) for _ in range(size)]
    window = PublishWindow(size, window=rng.randint(1, 8), ack_wait=ACK_WAIT, expects_ack=True)
    stored: dict[int, list[int]] = {p: [] for p in range(partitions)}  # partition -> indices in stored order
    answers: list[tuple[str, int]] = []  # what the server will say, in order
    now, release_at = 0.0, None
    for _ in range(10_000):
        if window.done:
            break
        now += rng.choice([0.0, 0.01, 0.2])
        window.expire(now, lambda i: AckTimeoutError("late", may_be_stored=True))
        taken = list(window.take_many(now, rng.randint(1, 5)))
        if taken and rng.random() < 0.15:  # flow control held the tail back: never written, so never sent
            cut = rng.randrange(len(taken))
            window.untake(taken[cut:])
            taken = taken[:cut]
        for index in taken:
            fate = rng.choices(["ack", "refuse", "lost ack", "dropped"], weights=[6, 3, 1, 1])[0]
            if fate in ("ack", "lost ack"):
                stored[partition_of[index]].append(index)
            answers.append((fate, index))
        while answers and rng.random() < 0.7:  # the server answers in order, some now, some later
            fate, index = answers.pop(0)
            if fate == "ack":
                window.on_ack(index, Ack(api.Ack(offset=0), partition_of[index]))
            elif fate == "refuse":
                window.hold(index, LiftbridgeError("failed to resume stream: no known metadata leader"))
        if window.holding and not window.in_flight:
            if release_at is None:
                release_at = now + 0.05
            elif now >= release_at:
                release_at = None
                window.release(now, lambda i: partition_of[i])
    assert window.done, f"seed {seed}: the batch never ended"
    result = window.result()
    everything = [index for indices in stored.values() for index in indices]
    assert len(everything) == len(set(everything)), f"seed {seed}: stored twice: {stored}"
    for partition, indices in stored.items():
        assert indices == sorted(indices), f"seed {seed}: partition {partition} stored out of order: {indices}"
    for index, ack in enumerate(result.acks):
        if ack is not None:
            assert index in everything, f"seed {seed}: #{index} acked but never stored"
    for failure in result.failures:
        if not failure.may_be_stored:
            assert failure.index not in everything, f"seed {seed}: #{failure.index} said not stored, but is"
    assert len(result.failures) + sum(ack is not None for ack in result.acks) == size


@pytest.mark.parametrize("block", range(10))
def test_a_window_keeps_its_guarantees_whatever_the_server_answers(block: int) -> None:
    for seed in range(block * 100, block * 100 + 100):
        run_batch(seed)
