"""A batch's window against a simulated server that acks, refuses without storing (the metadata leader is being
replaced), stores but loses the ack, or drops messages, and where some messages taken are never written (flow
control), in random order over seeded runs. What must hold
whatever happens: no message is stored twice, the stored messages of each partition are in the batch's order,
every acked message was stored, every failure that says "not stored" was not, and the batch ends."""

from __future__ import annotations

import random

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import AckTimeoutError, LiftbridgeError, UnavailableError
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
    check_outcome(seed, window, stored, size)


def check_outcome(seed: int, window: PublishWindow, stored: dict[int, list[int]], size: int) -> None:
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


class DeadlineErrors:
    def deadline_in_flight(self, timeout: float) -> object:
        return lambda index: AckTimeoutError("no ack before the batch deadline", may_be_stored=True)

    def deadline_unsent(self, timeout: float) -> LiftbridgeError:
        return AckTimeoutError("not sent: the batch deadline passed first")


class PublisherDrive:
    """The window driven the way the HTTP/2 publisher drives it: it pumps only when responses come in, after an
    expiry and after a release; what it hands over is written only as the server reads (a server that stops
    reading holds it back for many pumps); a paused partition is refused while its metadata leader is being
    replaced and resumed by the first message after; the stream breaks now and then (the unwritten go back,
    those awaiting an ack are lost, a new stream pumps); the deadline ends the batch. Beyond the guarantees
    of :func:`run_batch`: the batch never sits idle with messages left to send and nothing to wait for."""

    def __init__(self, seed: int) -> None:
        self.seed, self.rng = seed, random.Random(seed)
        self.size, partitions = self.rng.randint(1, 30), self.rng.randint(1, 3)
        self.partition_of = [self.rng.randrange(partitions) for _ in range(self.size)]
        self.window = PublishWindow(self.size, window=self.rng.randint(1, 6), ack_wait=ACK_WAIT, expects_ack=True)
        self.stored: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self.handed: list[int] = []  # handed to the current stream, in order; the first `written` were written
        self.written = 0
        self.answers: list[tuple[str, int]] = []
        self.now, self.releases = 0.0, 0
        self.release_at: float | None = None
        self.leader_changing, self.reading = True, True
        self.paused = dict.fromkeys(range(partitions), True)

    def pump(self) -> None:
        while taken := self.window.take_many(self.now, self.rng.randint(1, 4)):
            self.handed.extend(taken)

    def server_reads(self, count: int) -> None:
        for index in self.handed[self.written : self.written + count]:
            partition = self.partition_of[index]
            if self.paused[partition] and self.leader_changing:
                self.answers.append(("refuse", index))
                continue
            self.paused[partition] = False
            fate = self.rng.choices(["ack", "lost ack", "dropped"], weights=[8, 1, 1])[0]
            if fate != "dropped":
                self.stored[partition].append(index)
            self.answers.append((fate, index))
        self.written = min(len(self.handed), self.written + count)

    def read_answers(self) -> None:
        answered = False
        while self.answers and self.rng.random() < 0.7:
            answered = True
            fate, index = self.answers.pop(0)
            if fate == "ack":
                self.window.on_ack(index, Ack(api.Ack(offset=0), self.partition_of[index]))
            elif fate == "refuse":
                self.window.hold(index, LiftbridgeError("failed to resume stream: no known metadata leader"))
        if answered:
            self.pump()

    def supervise(self) -> None:
        if self.window.expire(self.now, lambda index: AckTimeoutError("late", may_be_stored=True)):
            self.pump()
        if self.window.holding and not self.window.in_flight:
            if self.release_at is None:
                self.release_at, self.releases = self.now + 0.02 * (1 + self.releases), self.releases + 1
            elif self.now >= self.release_at:
                self.release_at = None
                self.window.release(self.now, lambda index: self.partition_of[index])
                self.pump()

    def break_stream(self) -> None:
        self.window.untake(self.handed[self.written :])
        self.window.lose_in_flight(lambda index: UnavailableError("lost", may_be_stored=True))
        self.handed, self.written, self.answers = [], 0, []
        self.pump()

    def run(self, deadline: float | None) -> None:
        rng, window = self.rng, self.window
        self.pump()
        for _ in range(20_000):
            self.now += rng.choice([0.0, 0.01, 0.05, 0.3])
            if rng.random() < 0.05:
                self.leader_changing = not self.leader_changing
            if rng.random() < 0.05:
                self.reading = not self.reading
            if self.reading and rng.random() < 0.7:
                self.server_reads(rng.randint(0, 6))
            self.read_answers()
            self.supervise()
            if deadline is not None and self.now >= deadline:
                window.untake(self.handed[self.written :])
                window.end_at_deadline(DeadlineErrors(), deadline)  # type: ignore[arg-type]
                break
            if window.done:
                break
            idle = not window.in_flight and not window.holding and not self.answers
            assert not (idle and self.written >= len(self.handed)), (
                f"seed {self.seed}: idle with {window.unsent} messages never sent and nothing to wait for"
            )
            if rng.random() < 0.03:
                self.break_stream()
        assert window.done, f"seed {self.seed}: the batch never ended"
        check_outcome(self.seed, window, self.stored, self.size)


@pytest.mark.parametrize("block", range(10))
def test_a_window_driven_as_the_publisher_drives_it_never_stalls(block: int) -> None:
    """The batch sat idle until its deadline (forever without one) when every resend in line had timed out
    unwritten and the stream broke: about 14 runs in 10,000 found it."""
    for seed in range(block * 500, block * 500 + 500):
        PublisherDrive(seed).run(None)
        PublisherDrive(seed).run(3.0)
