"""The publish step: sync ``publish`` one message at a time, or ``publish_batch``; every ack goes to the ledger."""

from __future__ import annotations

import random
from typing import Any

from liftbridge_provider.client import BatchResult, PublishMessage, ReadonlyPartitionError, partition_by_key
from tests.chaos.judging import StepReport, judge, publish_errors
from tests.chaos.ledger import Sent
from tests.chaos.oracle import Finding
from tests.chaos.plan import Step
from tests.chaos.timing import Outcome
from tests.chaos.world import World


def _messages(world: World, step: Step, index: int) -> list[Sent]:
    shape = world.shapes[step.stream]
    rng = random.Random(f"{world.seed}/{index}")
    keys = shape.keys or 10
    return [
        Sent(
            step.stream,
            f"k{rng.randrange(keys)}".encode() if step.flag else None,
            f"s{world.seed}/{index}/{i}".encode(),
        )
        for i in range(step.count)
    ]


def publish(world: World, step: Step, index: int) -> StepReport:
    messages = _messages(world, step, index)
    for message in messages:
        world.ledger.record_sent(message)
    if step.mode == "sync":
        acked, problem = _publish_sync(world, step, messages)
    else:
        acked, problem = _publish_batch(world, step, messages)
    summary = f"{acked}/{len(messages)} acked" + (f"; {problem.describe()}" if problem else "")
    report = StepReport(summary)
    report.findings += [Finding("offset-reused", reused) for reused in world.reused]
    world.reused.clear()
    if problem is not None and problem.error is not None and not _readonly_only(world, step, problem.error):
        judge(world, report, problem, stream=step.stream)
    return report


def _readonly_only(world: World, step: Step, error: BaseException) -> bool:
    """Whether every failure of a publish is "readonly partition" on a partition made readonly by a step."""
    return all(
        isinstance(e, ReadonlyPartitionError) and (step.stream, e.partition) in world.readonly
        for e in publish_errors(error)
    )


def _record_ack(world: World, message: Sent, partition: int, offset: int) -> None:
    earlier = world.ledger.record_ack(message, partition, offset)
    if earlier is not None:
        world.reused.append(
            f"{message.stream}/{partition} offset {offset} acked for {earlier.value!r}, "
            f"then again for {message.value!r}"
        )


def _publish_sync(world: World, step: Step, messages: list[Sent]) -> tuple[int, Outcome[Any] | None]:
    shape, t = world.shapes[step.stream], world.timeouts
    acked = 0
    for message in messages:

        def send(message: Sent = message) -> Any:
            return world.client.publish(
                step.stream,
                message.value,
                key=message.key,
                partition=None if step.flag else step.partition,
                partitioner=partition_by_key if step.flag else None,
                ack_policy=shape.ack_policy,
                timeout=t.publish,
            )

        outcome = world.timer.call(f"publish {step.stream}", t.publish, send)
        if not outcome.ok:
            if outcome.hung or getattr(outcome.error, "may_be_stored", False):
                world.ledger.record_maybe(message)
            return acked, outcome  # the rest is not sent
        ack = outcome.value
        assert ack is not None, f"no ack with ack policy {shape.ack_policy}"
        _record_ack(world, message, ack.partition, ack.offset)
        acked += 1
    return acked, None


def _publish_batch(world: World, step: Step, messages: list[Sent]) -> tuple[int, Outcome[Any] | None]:
    shape, t = world.shapes[step.stream], world.timeouts
    batch = [PublishMessage(m.value, key=m.key, partition=None if step.flag else step.partition) for m in messages]

    def send() -> BatchResult:
        return world.client.publish_batch(
            step.stream,
            batch,
            partitioner=partition_by_key if step.flag else None,
            ack_policy=shape.ack_policy,
            ack_wait=t.ack_wait,
            timeout=t.batch,
        )

    outcome = world.timer.call(f"publish_batch {step.stream}", t.batch, send)
    result = outcome.value if outcome.ok else getattr(outcome.error, "result", None)
    if not isinstance(result, BatchResult):
        for message in messages:  # nothing known about any message
            if outcome.hung or getattr(outcome.error, "may_be_stored", True):
                world.ledger.record_maybe(message)
        return 0, outcome
    acked = 0
    for message, ack in zip(messages, result.acks, strict=True):
        if ack is not None:
            _record_ack(world, message, ack.partition, ack.offset)
            acked += 1
    for failure in result.failures:
        if failure.error.may_be_stored:
            world.ledger.record_maybe(messages[failure.index])
    return acked, None if outcome.ok else outcome
