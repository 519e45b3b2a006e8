"""A complete Python client for Liftbridge; imports neither Airflow nor Spark.

from liftbridge_provider.client import LiftbridgeClient, StartPosition, StopPosition

with LiftbridgeClient("127.0.0.1:9292") as client:
    client.create_stream("orders", "orders", partitions=3)
    client.publish_batch("orders", [b"a", b"b"], partitioner=partition_by_key)
    for message in client.read_range("orders", 0, start=0, end=2):
        print(message.offset, message.value)
"""

from liftbridge_provider.client.activity import ACTIVITY_STREAM, ActivityEvent, decode_activity
from liftbridge_provider.client.aio import AsyncLiftbridgeClient
from liftbridge_provider.client.aio_consumer import AsyncConsumer
from liftbridge_provider.client.client import LiftbridgeClient
from liftbridge_provider.client.consumer import Consumer, ConsumerError
from liftbridge_provider.client.cursor_advance import CursorMove, CursorStep
from liftbridge_provider.client.errors import (
    AckTimeoutError,
    BeyondHighWatermarkError,
    ClientClosedError,
    CursorMovedError,
    CursorsDisabledError,
    EncryptionError,
    EnvelopeError,
    IncorrectOffsetError,
    LiftbridgeTimeoutError,
    MessageTooLargeError,
    NoMetadataLeaderError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    PermissionDeniedError,
    ReadonlyPartitionError,
    StreamExistsError,
    UnavailableError,
)
from liftbridge_provider.client.messages import Ack, AckPolicy, Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import BrokerInfo, Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.options import ClientConfig, NatsConfig, TLSConfig
from liftbridge_provider.client.partitioners import Partitioner, partition_by_key, partition_by_round_robin
from liftbridge_provider.client.publish.batch_result import BatchPublishError, BatchResult, PublishFailure
from liftbridge_provider.client.publish.prepare import PublishMessage
from liftbridge_provider.client.requests import ALL_BROKERS
from liftbridge_provider.client.subscription import Subscription
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError, NoSuchPartitionError
from liftbridge_provider.core.stream_options import StreamOptions

__all__ = [
    "ACTIVITY_STREAM",
    "ALL_BROKERS",
    "Ack",
    "AckPolicy",
    "AckTimeoutError",
    "ActivityEvent",
    "AsyncConsumer",
    "AsyncLiftbridgeClient",
    "BatchPublishError",
    "BatchResult",
    "BeyondHighWatermarkError",
    "BrokerInfo",
    "ClientClosedError",
    "ClientConfig",
    "Consumer",
    "ConsumerError",
    "CursorMove",
    "CursorMovedError",
    "CursorStep",
    "CursorsDisabledError",
    "EncryptionError",
    "EnvelopeError",
    "IncorrectOffsetError",
    "InvalidArgumentError",
    "LiftbridgeClient",
    "LiftbridgeError",
    "LiftbridgeTimeoutError",
    "Message",
    "MessageTooLargeError",
    "Metadata",
    "NatsConfig",
    "NoMetadataLeaderError",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "NotLeaderError",
    "PartitionInfo",
    "PartitionPausedError",
    "Partitioner",
    "PermissionDeniedError",
    "PublishFailure",
    "PublishMessage",
    "ReadonlyPartitionError",
    "StartPosition",
    "StopPosition",
    "StreamExistsError",
    "StreamInfo",
    "StreamOptions",
    "Subscription",
    "TLSConfig",
    "UnavailableError",
    "decode_activity",
    "partition_by_key",
    "partition_by_round_robin",
]
