"""A file descriptor that wakes a thread waiting in ``poll()``: the synchronous driver's (:mod:`blocking`) way for
a writer to tell a reader that output waits for room in the socket, so that the reader waits for room too."""

from __future__ import annotations

import contextlib
import os


class Waker:
    """A file descriptor a writer makes readable to wake a thread waiting in ``poll()`` (an eventfd on Linux,
    else a pipe); the woken thread drains it."""

    def __init__(self) -> None:
        self._write_fd: int | None = None
        if hasattr(os, "eventfd"):
            self._read_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            self._read_fd, self._write_fd = os.pipe()
            os.set_blocking(self._read_fd, False)
            os.set_blocking(self._write_fd, False)
        self._closed = False

    def fileno(self) -> int:
        """The descriptor to register for reading."""
        return self._read_fd

    def wake(self) -> None:
        """Make the descriptor readable (any thread; nothing once closed: the number may be reused)."""
        if self._closed:
            return
        with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
            if self._write_fd is None:
                os.eventfd_write(self._read_fd, 1)
            else:  # pragma: no cover - not Linux
                os.write(self._write_fd, b"w")

    def drain(self) -> None:
        """Make it unreadable again (the woken thread)."""
        if self._closed:
            return
        with contextlib.suppress(OSError):
            os.read(self._read_fd, 8 if self._write_fd is None else 4096)

    def close(self) -> None:
        """Close it (the owner, under the lock its writers wake it under)."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                os.close(fd)
