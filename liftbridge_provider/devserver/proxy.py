"""A TCP proxy on 127.0.0.1 in front of one broker, for faults a real network has.

Tests dial the proxy instead of the broker (``address_resolver`` maps the
broker's advertised address to the proxy) and then break the path on purpose:

- :meth:`FaultProxy.cut_next_response`: the next gRPC response is never
  delivered; the connection is reset the moment the server starts answering,
  so the request reached the server (and was applied) but the client sees
  UNAVAILABLE. This is "a retry after partial success" made deterministic.
- :meth:`FaultProxy.blackhole`: bytes stop flowing in both directions while the
  TCP connections stay open, like a host that vanished without a reset.
- :meth:`FaultProxy.hold_responses`: the server's bytes stop reaching the
  client while the client's still reach the server, so a request is applied
  and its answer never comes (until released): a call interrupted on the
  client's side after the server did its work.
- :meth:`FaultProxy.rename_in_requests`: a name in the client's bytes is
  replaced by another of the same length (a stream the server does not know)
  the next n times it is seen, so the real server answers NOT_FOUND for a
  stream that exists: a broker that has not applied the stream's creation yet.
- :meth:`FaultProxy.blackhole_when_client_sends`: the same, from the moment a
  client's bytes contain a marker for the n-th time (that read is not
  forwarded), so a path goes silent at an exact step of a protocol, say the
  PING of a NATS client's first flush after the PING of its handshake.

Bytes are forwarded unchanged; with ``http2`` (default) responses are watched
at HTTP/2 frame level (9-byte frame headers) only to find where a response
starts; ``http2=False`` forwards any other protocol (NATS) as it comes.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

from liftbridge_provider.devserver.config import LOOPBACK

_HEADERS_FRAME = 0x1
_FRAME_HEADER = 9


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (``host:port``) until :meth:`close`; ``http2``: the target
    speaks gRPC (needed by :meth:`cut_next_response`), else bytes are forwarded as they come."""

    def __init__(self, target: str, *, http2: bool = True) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._http2 = http2
        self._silencing_marker: bytes | None = None
        self._marker_reads_left = 0
        self._holding_marker: bytes | None = None  # a client read with it stops the server's bytes (forwarded)
        self._server_marker: bytes | None = None  # a server read with it silences both ways (not forwarded)
        self._rename: tuple[bytes, bytes] | None = None  # (old, new) in the client's reads, while renames are left
        self._renames_left = 0
        self.renamed = 0  # client reads renamed so far
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut_armed = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._answering = threading.Event()  # the server's bytes may reach the client
        self._answering.set()
        self.accepted = 0  # client connections accepted so far
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cuts = 0  # responses cut so far
        threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True).start()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def cut_next_response(self) -> None:
        """Reset the connection that carries the next gRPC response, before the client sees it."""
        self._cut_armed.set()

    def blackhole(self, on: bool = True) -> None:
        """Stop (or resume) forwarding bytes; connections stay open and silent."""
        if on:
            self._flowing.clear()
        else:
            self._flowing.set()

    def hold_responses(self, on: bool = True) -> None:
        """Stop (or resume) forwarding the server's bytes to the client; the client's still reach the server."""
        if on:
            self._answering.clear()
        else:
            self._answering.set()

    def hold_responses_when_client_sends(self, marker: bytes) -> None:
        """:meth:`hold_responses` from the first client read (on any connection) that contains ``marker``; that
        read still reaches the server. Once."""
        self._holding_marker = marker

    def blackhole_when_server_sends(self, marker: bytes) -> None:
        """:meth:`blackhole` right after the first server read (on any connection) that contains ``marker``: the
        client gets that read, then nothing more. Once."""
        self._server_marker = marker

    def blackhole_when_client_sends(self, marker: bytes, *, nth: int = 1) -> None:
        """:meth:`blackhole` from the ``nth`` client read (on any connection) that contains ``marker``, that read
        included; once."""
        self._marker_reads_left = nth
        self._silencing_marker = marker

    def rename_in_requests(self, old: bytes, new: bytes, *, times: int) -> None:
        """Replace ``old`` by ``new`` (the same length, so no frame or protobuf length changes) in the next
        ``times`` client reads (on any connection) that contain it: the server answers as for ``new``."""
        if len(old) != len(new):
            raise ValueError(f"a rename keeps the length: {old!r} and {new!r} differ")
        with self._lock:
            self._rename, self._renames_left = (old, new), times

    def _renamed(self, data: bytes) -> bytes:
        with self._lock:
            rename = self._rename
            if rename is None or self._renames_left <= 0 or rename[0] not in data:
                return data
            self._renames_left -= 1
            self.renamed += 1
        return data.replace(*rename)

    def close_connections(self) -> None:
        """Reset every connection open now (new ones are still accepted), as a dropped network path does."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _reset(sock)

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._answering.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _reset(sock)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                if self._closed.is_set():
                    return
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _marker_seen(self) -> None:
        with self._lock:
            self._marker_reads_left -= 1
            if self._marker_reads_left == 0:
                self._silencing_marker = None
                self._flowing.clear()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        pending = b""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if not from_server:
                    data = self._renamed(data)
                marker = self._silencing_marker
                if not from_server and marker is not None and marker in data:
                    self._marker_seen()
                holding = self._holding_marker
                if not from_server and holding is not None and holding in data:
                    self._holding_marker = None
                    self._answering.clear()
                silencing = self._server_marker
                silence_after = from_server and silencing is not None and silencing in data
                self._flowing.wait()
                if from_server:
                    self._answering.wait()
                if from_server and self._http2:
                    pending += data
                    frames, pending = _split_frames(pending)
                    if self._cut_armed.is_set() and any(_is_response_start(f) for f in frames):
                        self._cut_armed.clear()
                        self.cuts += 1
                        break
                    data = b"".join(frames)
                if data:
                    sink.sendall(data)
                if silence_after:
                    self._server_marker = None
                    self._flowing.clear()
        except OSError:
            pass
        _reset(source)
        _reset(sink)


def _split_frames(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Whole HTTP/2 frames from the start of ``buffer`` (after the preface), and the rest."""
    frames = []
    while len(buffer) >= _FRAME_HEADER:
        length = int.from_bytes(buffer[:3], "big")
        if len(buffer) < _FRAME_HEADER + length:
            break
        frames.append(buffer[: _FRAME_HEADER + length])
        buffer = buffer[_FRAME_HEADER + length :]
    return frames, buffer


def _is_response_start(frame: bytes) -> bool:
    """A HEADERS frame on a request stream (id > 0): the server starts answering a call."""
    frame_type = frame[3]
    stream_id = struct.unpack(">I", frame[5:9])[0] & 0x7FFFFFFF
    return frame_type == _HEADERS_FRAME and stream_id > 0


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to the peer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the other pump, blocked in recv on this socket
    with contextlib.suppress(OSError):
        sock.close()
