"""TLS for a socket the synchronous driver reads and writes itself: Python's ``ssl`` on memory BIOs.

:class:`TlsPipe` encrypts what the call writes and decrypts what the socket read, under the driver's lock,
while the socket itself stays a plain non-blocking one: one thread may wait in ``poll``/``recv`` while another
writes, and a cancel from any thread shuts the socket down. (An ``ssl.SSLSocket`` would be read and written by
OpenSSL from two threads at once, which OpenSSL does not allow on one connection.) The context is the
client's own (``TLSConfig.ssl_context(alpn=("h2",))``, as ``publish_batch``'s asyncio connection uses), so the
certificate checks, the client certificate and the server name are the same on every path.
"""

from __future__ import annotations

import ssl

CHUNK = 256 * 1024  # bytes asked of one decryption step (a TLS record holds at most 16 KiB)


class TlsPipe:
    """One TLS connection's state, without I/O.

    :param context: the client's TLS context, with ALPN ``h2``.
    :param server_hostname: the name checked against the broker's certificate (``TLSConfig.server_name``, else
        the host dialled).
    """

    def __init__(self, context: ssl.SSLContext, server_hostname: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=False, server_hostname=server_hostname)

    def handshake(self) -> bool:
        """Take the handshake a step further: True once it is done (then :meth:`output` may still hold its last
        bytes). Raises ``ssl.SSLError`` when it fails (a certificate that does not verify, a protocol not
        offered, ALPN without ``h2``)."""
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        protocol = self._tls.selected_alpn_protocol()
        if protocol not in (None, "h2"):
            raise ssl.SSLError(f"the broker chose the protocol {protocol!r} over TLS, not h2")
        return True

    def output(self) -> bytes:
        """Encrypted bytes to write (handshake messages, records, alerts)."""
        return self._outgoing.read()

    def wrap(self, plain: bytes) -> bytes:
        """``plain`` encrypted, with any other pending output before it."""
        if plain:
            self._tls.write(plain)
        return self._outgoing.read()

    def unwrap(self, raw: bytes) -> bytes:
        """The plaintext ``raw`` (bytes read from the socket; ``b""`` at its end) completes. Raises
        ``ssl.SSLError`` for bytes that are not the broker's TLS."""
        if raw:
            self._incoming.write(raw)
        else:
            self._incoming.write_eof()
        chunks = []
        while True:
            try:
                chunk = self._tls.read(CHUNK)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
