"""Errors raised by the development-server launcher."""

from __future__ import annotations


class DevServerError(RuntimeError):
    """A server could not be found, started, reached or stopped."""
