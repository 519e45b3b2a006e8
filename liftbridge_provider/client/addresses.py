"""Which address a call goes to (pure): any known broker, or a partition's leader or ISR member."""

from __future__ import annotations

import random
import time

from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.client.options import ClientConfig, format_address


def dial_address(config: ClientConfig, host: str, port: int) -> str:
    """The address to dial for an advertised broker (through the address resolver, if any)."""
    if config.address_resolver is not None:
        return config.address_resolver(host, port)
    return format_address(host, port)


CONNECT_SECONDS: dict[str, float] = {}
"""Seconds the first connection to each address took in this process (``broker_selection="latency"``)."""

HUNG_FOR = 30.0  # seconds a broker that let an attempt run out goes last
HUNG_UNTIL: dict[str, float] = {}
"""Until when (``time.monotonic()``) each broker that hung an attempt in this process goes last."""


def note_hung(address: str) -> None:
    """``address`` let an attempt run out (a frozen node answers nothing): try it last for :data:`HUNG_FOR` s."""
    HUNG_UNTIL[address] = time.monotonic() + HUNG_FOR


def broker_addresses(config: ClientConfig, snapshot: Metadata) -> list[str]:
    """Known brokers (from metadata) and the seeds, without repeats, in the order ``config.broker_selection``
    picks: ``random`` (shuffled), ``workload`` (fewest partitions held plus led, as metadata counts them), or
    ``latency`` (quickest first connection; brokers not connected yet first, so each gets measured). A broker
    that hung an attempt in the last :data:`HUNG_FOR` s goes last whatever the selection."""
    known = {
        dial_address(config, b.host, b.port): b.partition_count + b.leader_count for b in snapshot.brokers.values()
    }
    addresses = list(dict.fromkeys([*known, *config.brokers]))
    random.shuffle(addresses)  # ties stay random
    if config.broker_selection == "workload":
        addresses.sort(key=lambda a: known.get(a, 0))
    elif config.broker_selection == "latency":
        addresses.sort(key=lambda a: CONNECT_SECONDS.get(a, -1.0))
    now = time.monotonic()
    addresses.sort(key=lambda a: HUNG_UNTIL.get(a, 0.0) > now)  # stable: the selection's order otherwise
    return addresses


def leader_first(addresses: list[str], leader: str | None) -> list[str]:
    """``addresses`` with the partition leader's first (its broker stores the messages without a NATS hop
    to another node, and a frozen follower is not picked before it); unchanged when no leader is known."""
    if leader is None:
        return addresses
    return [leader, *(a for a in addresses if a != leader)]


def replica_address(
    config: ClientConfig, snapshot: Metadata, stream: str, partition: int, any_isr_replica: bool
) -> str | None:
    """Dial address of the partition leader (or a random ISR member), or None if none is known right now.

    Raises NoSuchStreamError / NoSuchPartitionError if the snapshot does not know the partition.
    """
    info = snapshot.partition(stream, partition)
    candidates = list(info.isr) if any_isr_replica else [info.leader] if info.leader else []
    random.shuffle(candidates)
    for broker_id in candidates:
        broker = snapshot.brokers.get(broker_id)
        if broker is not None:
            return dial_address(config, broker.host, broker.port)
    return None
