"""A scripted HTTP/2 server of one connection for the data plane's driver tests (tests/unit/test_blocking_call.py):
h2's server side on a loopback socket, in a thread, doing what the test tells it; no Liftbridge.

It answers settings and PINGs as any HTTP/2 server does, records every event it receives, and runs the test's
actions (send headers, a message, trailers, a GOAWAY) in its thread. ``freeze()`` makes it a frozen broker: it
reads nothing and answers nothing, and its kernel still holds the connection open; ``thaw()`` undoes it.
``answer`` makes it a PublishAsync-like server: each request it reads whole is handed to ``answer``, whose
bytes (if any) go back as a response, and the flow-control windows are granted back as it reads.
"""

from __future__ import annotations

import queue
import socket
import ssl
import struct
import threading
from collections.abc import Callable

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, Event, RequestReceived, StreamEnded
from h2.exceptions import H2Error
from h2.settings import SettingCodes, Settings

STREAM = 1
Action = Callable[[H2Connection], bytes | None]
"""Run on the server's connection; bytes it returns are written raw after what it queued (frames h2 would not
send, such as a graceful GOAWAY followed by more of the call)."""


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


class Peer:
    """The server. ``address`` to dial; ``settings=False``: it accepts and never speaks HTTP/2 (a frozen node).
    Its actions run once the client's request came whole (``streaming=False``: Subscribe's server reads its
    one request first) or once the call's headers came (``streaming=True``: a stream the client keeps
    writing). ``window``: the flow-control window it opens to the client, bytes (h2's 65,535 by default).
    ``answer``: see the module docstring (implies ``streaming``)."""

    def __init__(
        self,
        *,
        tls: ssl.SSLContext | None = None,
        settings: bool = True,
        streaming: bool = False,
        window: int | None = None,
        answer: Callable[[bytes], bytes | None] | None = None,
    ) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._window = window
        self._answer = answer
        self._inbox = bytearray()  # the call's DATA not yet cut into requests (answer mode)
        self._answered_headers = False
        streaming = streaming or answer is not None
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._tls = tls
        self._settings = settings
        self._opening = RequestReceived if streaming else StreamEnded
        self._actions: queue.Queue[Action] = queue.Queue()
        self.events: list[Event] = []
        self.received = bytearray()  # every byte the client sent (after TLS)
        self.tls_failed: BaseException | None = None
        self._frozen = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="h2-peer", daemon=True)
        self._thread.start()

    def do(self, action: Action) -> None:
        """Run ``action`` on the server's connection (in its thread, once the call opened: see the class) and
        send what it queued."""
        self._actions.put(action)

    def respond(self, *messages: bytes, status: int | None = None, details: str = "") -> None:
        """Response headers, the messages (serialized payloads), and trailers with ``status`` when given."""

        def action(conn: H2Connection) -> bytes | None:
            conn.send_headers(STREAM, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            for message in messages:
                conn.send_data(STREAM, grpc_message(message))
            if status is not None:
                self.trailers(status, details)(conn)
            return None

        self.do(action)

    @staticmethod
    def trailers(status: int, details: str = "") -> Action:
        def action(conn: H2Connection) -> bytes | None:
            fields = [(b"grpc-status", str(status).encode())]
            if details:
                fields.append((b"grpc-message", details.encode()))
            conn.send_headers(STREAM, fields, end_stream=True)
            return None

        return action

    def freeze(self) -> None:
        """Read nothing and answer nothing from now on (SIGSTOP: the connection stays open)."""
        self._frozen.set()

    def thaw(self) -> None:
        """Read and answer again (SIGCONT)."""
        self._frozen.clear()

    def data(self) -> list[bytes]:
        """The DATA the client sent on its call, frame by frame."""
        return [e.data for e in self.events if isinstance(e, DataReceived) and e.stream_id == STREAM and e.data]

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            raw, _ = self._listener.accept()
        except OSError:
            return
        sock: socket.socket = raw
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self.tls_failed = exc
                raw.close()
                return
        conn = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        sock.settimeout(0.01)
        with sock:
            if self._settings:
                if self._window is not None:
                    conn.local_settings = Settings(
                        client=False, initial_values={SettingCodes.INITIAL_WINDOW_SIZE: self._window}
                    )
                conn.initiate_connection()
                if self._window is not None and self._window > 65_535:
                    conn.increment_flow_control_window(self._window - 65_535)
                sock.sendall(conn.data_to_send())
            while not self._stopped.is_set():
                if self._frozen.is_set():
                    self._stopped.wait(0.05)
                    continue
                opened = any(isinstance(event, self._opening) for event in self.events)
                while opened and not self._actions.empty():
                    raw_bytes = self._actions.get()(conn)
                    sock.sendall(conn.data_to_send() + (raw_bytes or b""))
                try:
                    data = sock.recv(65_536)
                except (TimeoutError, ssl.SSLWantReadError):
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.received += data
                if not self._settings:
                    continue  # a frozen node's kernel: it takes the bytes and answers nothing
                try:
                    events = conn.receive_data(data)
                except H2Error:  # after its own GOAWAY h2 takes nothing more: the bytes are still recorded
                    continue
                self.events.extend(events)
                if self._answer is not None:
                    self._answer_requests(conn, events)
                if not self._frozen.is_set():
                    sock.sendall(conn.data_to_send())

    def _answer_requests(self, conn: H2Connection, events: list[Event]) -> None:
        """Answer mode: grant back what was read, cut the call's DATA into requests and answer each one."""
        assert self._answer is not None
        for event in events:
            if not isinstance(event, DataReceived) or event.stream_id != STREAM:
                continue
            if event.flow_controlled_length:
                conn.acknowledge_received_data(event.flow_controlled_length, STREAM)
            self._inbox += event.data or b""
        while len(self._inbox) >= 5:
            size = struct.unpack_from(">I", self._inbox, 1)[0]
            if len(self._inbox) < 5 + size:
                break
            request = bytes(self._inbox[5 : 5 + size])
            del self._inbox[: 5 + size]
            response = self._answer(request)
            if response is None:
                continue
            if not self._answered_headers:
                conn.send_headers(STREAM, [(b":status", b"200"), (b"content-type", b"application/grpc")])
                self._answered_headers = True
            conn.send_data(STREAM, grpc_message(response))
