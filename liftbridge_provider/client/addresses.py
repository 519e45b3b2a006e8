"""Which address a call goes to (pure): any known broker, or a partition's leader or ISR member."""

from __future__ import annotations

import random

from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.client.options import ClientConfig, format_address


def dial_address(config: ClientConfig, host: str, port: int) -> str:
    """The address to dial for an advertised broker (through the address resolver, if any)."""
    if config.address_resolver is not None:
        return config.address_resolver(host, port)
    return format_address(host, port)


def broker_addresses(config: ClientConfig, snapshot: Metadata) -> list[str]:
    """Known brokers (from metadata) and the seeds, shuffled, without repeats."""
    known = [dial_address(config, b.host, b.port) for b in snapshot.brokers.values()]
    addresses = list(dict.fromkeys([*known, *config.brokers]))
    random.shuffle(addresses)
    return addresses


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
