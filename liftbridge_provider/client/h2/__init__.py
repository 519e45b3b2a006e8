"""The data plane: every streaming call of the client (``publish_batch``'s PublishAsync, Subscribe) is one
sans-I/O gRPC call on h2 with one set of rules (keepalive PINGs, a deadline on every exit path, a bounded
number of messages in flight, no private grpc name).

- ``call_state.py``: :class:`CallState`, the call without I/O (h2 for HTTP/2, the gRPC call on top);
- ``inbound.py``: the bytes read taken apart before h2 (the call's DATA cut into messages in place, GOAWAY);
- ``grpc_status.py``: gRPC's status of an HTTP/2 end, and how a call ended;
- ``aio_transport.py``: the asyncio driver (``publish_batch``, the asyncio client's subscriptions);
- ``blocking.py``: the synchronous driver on the calling thread (the sync client's subscriptions and reads),
  ``tls_pipe.py`` its TLS.

This package imports nothing at import time, so importing one driver does not pull in the other.
"""
