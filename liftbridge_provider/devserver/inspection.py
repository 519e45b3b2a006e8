"""What a running dev cluster says about a stream, asked through the gRPC API (no client import)."""

from __future__ import annotations

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.devserver.errors import DevServerError

RPC_TIMEOUT = 5.0  # seconds; a broker whose peer died can take up to 3 s to answer FetchMetadata


def partition_leaders(
    address: str, stream: str, credentials: grpc.ChannelCredentials | None = None, timeout: float = RPC_TIMEOUT
) -> dict[int, str | None]:
    """``{partition: leader server id}`` of ``stream`` as the broker at ``address`` sees it (None: no leader).

    Raises DevServerError when the broker does not know the stream, grpc.RpcError when it does not answer.
    """
    channel = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    with channel:
        response: api.FetchMetadataResponse = api_grpc.APIStub(channel).FetchMetadata(
            api.FetchMetadataRequest(streams=[stream]), timeout=timeout
        )
    found = [s for s in response.streamMetadata if s.name == stream]
    if not found or found[0].error != api.StreamMetadata.OK:
        raise DevServerError(f"broker {address} knows no stream {stream!r}")
    return {int(p.id): p.leader or None for p in found[0].partitions.values()}
