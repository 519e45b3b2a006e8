"""Client CPU of the HTTP/2 call state alone (client/h2/call_state.py's CallState): no server, no socket.

    .venv/bin/python bench/bench_call_state.py

A scripted server's bytes are fed to the call, as the Liftbridge server sends them:

- ``sync publish``: one request queued and written, then one read holding the server's connection
  WINDOW_UPDATE, its BDP PING and the ack's DATA frame, then the PING's acknowledgement written (what one
  ``publish`` costs the call state);
- ``batch, per message``: 100 requests queued and written at once, 100 acks read (a DATA frame each, as
  the server sends them) in one read, then the window updates for them; divided by 100.

Best of 3 repeats, microseconds. A benchmark of the pure part only: the socket, the server and the
caller's own code are not in it (bench_publish_cpu.py has the whole path).
"""

from __future__ import annotations

import struct
import timeit

from h2.config import H2Configuration
from h2.connection import H2Connection

from liftbridge_provider.client.h2.call_state import STREAM, CallState

ACK = struct.pack(">BI", 0, 60) + b"a" * 60  # a PublishResponse's size, with its gRPC prefix
REQUEST = b"r" * 300  # a PublishRequest of a 256-byte value


def frame(kind: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream.to_bytes(4, "big") + payload


def window_update(stream: int, increment: int) -> bytes:
    return frame(0x8, stream, struct.pack(">I", increment))


def open_call() -> CallState:
    """A call past its opening: h2's server side has read it, and the call the server's settings and headers."""
    call = CallState(authority="a:1", path="/proto.API/PublishAsync", tls=False, max_response_bytes=1 << 20)
    server = H2Connection(H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    server.receive_data(call.outgoing())
    server.send_headers(STREAM, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    call.receive(server.data_to_send())
    call.outgoing()
    return call


def main() -> None:
    call = open_call()
    answer = window_update(0, len(REQUEST) + 5) + frame(0x6, 0, b"12345678") + frame(0x0, STREAM, ACK)
    answer += window_update(STREAM, len(REQUEST) + 5)  # the stream's credit back (the server's is larger)

    def sync_publish() -> None:
        call.queue([REQUEST])
        assert call.outgoing()
        call.receive(answer)
        call.outgoing()

    count = 20_000
    best = min(timeit.repeat(sync_publish, number=count, repeat=3)) / count
    print(f"sync publish            {best * 1e6:7.2f} us")
    call = open_call()
    acks = frame(0x0, STREAM, ACK) * 100
    credit = window_update(0, 100 * (len(REQUEST) + 5)) + window_update(STREAM, 100 * (len(REQUEST) + 5))
    requests = [REQUEST] * 100

    def batch() -> None:
        call.queue(requests)
        call.outgoing()
        call.receive(acks)
        call.receive(credit)

    rounds = 300
    best = min(timeit.repeat(batch, number=rounds, repeat=3)) / rounds / 100
    print(f"batch, per message      {best * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
