"""A sync gRPC channel's connectivity state, as grpc's public ``Channel.subscribe`` reports it.

grpc's sync API has no call that reads a channel's state (``grpc.aio`` has
``get_state``; the sync channel only ``subscribe`` and ``unsubscribe``), so
:class:`ChannelState` subscribes once and keeps what grpc reports: the latest
state, for the pool's "is it connected now" on every publish; a count of
breaks (READY left for anything else); and a wait, with a bound, for a state
that settles a connection attempt (READY, TRANSIENT_FAILURE or SHUTDOWN). The
pool makes one at a channel's first ready() or connect().

Behind ``subscribe`` grpc runs one thread per channel that waits for the next
change (waking at each change and every 0.2 s) and hands each change to the
subscribers on a short-lived thread; a change shows here a fraction of a
millisecond after grpc's core saw it. That thread raises "Channel closed!"
(a traceback on stderr) when the channel is closed while it is not inside its
wait: before its first look at the channel, when a subscriber asked it to
connect (``try_to_connect=True``) and it has not acted on that yet, or in the
moment after a wake-up (long enough to be hit on a loaded machine: 1 close in
100 right after a connection, in tests). And closing a channel while that
thread waits blocks until its wait ends (up to 0.2 s). So:

- the one subscription asks to connect when it starts (grpc's thread acts on
  that before its first wait) and nothing asks later: a channel that lost its
  connection reconnects by itself (the pool's channels run the
  ``round_robin`` policy, see ``ClientConfig.channel_options``);
- a channel no call uses is closed by :func:`close_quietly`: it unsubscribes
  at once (grpc's thread ends at its next wake-up, without touching the
  channel again) and closes the channel :data:`QUIET_CLOSE` seconds later, on
  a timer thread of its own;
- a channel with calls running is closed at once by :meth:`ChannelState.close`
  (closing is what ends its calls), on a thread of its own
  (:func:`close_in_background`), after grpc's first report, at least
  :data:`SETTLE` seconds after its last one (grpc's thread is back in its
  wait by then) and after unsubscribing; only the moment after grpc's own
  wake-up every 0.2 s stays open there, so a client closed while its calls
  run may, very rarely, leave that traceback.
"""

from __future__ import annotations

import threading
import time

import grpc

from liftbridge_provider.client.plans import Connection

SETTLED = {
    grpc.ChannelConnectivity.READY: Connection.READY,
    grpc.ChannelConnectivity.TRANSIENT_FAILURE: Connection.REFUSED,
    grpc.ChannelConnectivity.SHUTDOWN: Connection.REFUSED,
}
"""States that end a wait for a connection, and what each means for the caller."""

FIRST_REPORT = 1.0
"""Seconds :meth:`ChannelState.close` waits at most for grpc's first report (it comes within a millisecond)."""

SETTLE = 0.05
"""Seconds :meth:`ChannelState.close` lets pass after grpc's last report before it closes the channel."""

QUIET_CLOSE = 0.5
"""Seconds between unsubscribing and closing in :func:`close_quietly`: grpc's thread wakes at least every 0.2 s
and ends at its first wake-up without a subscriber."""


class ChannelState:
    """The connectivity of one sync channel: its latest state, its breaks, a bounded wait for a settled state.

    Subscribes to ``channel`` at once, asking it to connect (``watch=False``: does not, and reads SHUTDOWN, for a
    channel closed already). :meth:`close` closes the channel.
    """

    def __init__(self, channel: grpc.Channel, *, watch: bool = True) -> None:
        self._grpc_channel = channel
        self._changed = threading.Condition()
        self._state: grpc.ChannelConnectivity | None = None  # None until grpc's first report
        self._reported = threading.Event()
        self._last_report = time.monotonic()
        self._closed = False
        self.breaks = 0
        """How many times the channel left READY (a connection that broke, or a channel closed while READY)."""
        if watch:
            channel.subscribe(self._report, try_to_connect=True)
        else:
            self._closed, self._state = True, grpc.ChannelConnectivity.SHUTDOWN

    @property
    def state(self) -> grpc.ChannelConnectivity | None:
        """The latest state grpc reported (None before its first report; SHUTDOWN once closed)."""
        return self._state

    @property
    def ready(self) -> bool:
        """Connected now, as far as grpc has reported."""
        return self._state is grpc.ChannelConnectivity.READY

    def wait_settled(self, timeout: float) -> Connection:
        """Wait at most ``timeout`` seconds for a settled state; READY, REFUSED (at once when the broker
        refuses, or when the channel is closed meanwhile) or SILENT (still connecting when the time is up)."""
        ends = time.monotonic() + max(timeout, 0.0)
        with self._changed:
            while (settled := _settled(self._state)) is None:
                left = ends - time.monotonic()
                if left <= 0:
                    return Connection.SILENT
                self._changed.wait(left)
            return settled

    def close(self) -> None:
        """Stop watching and close the channel at once (its calls end CANCELLED). Safe to call twice."""
        if self.stop(wait_first_report=True):
            self._grpc_channel.close()

    def stop(self, *, wait_first_report: bool = False) -> bool:
        """Stop watching: later waits end REFUSED at once, and a wait under way ends so now. False when it had
        stopped already. ``wait_first_report``: first wait for grpc's first report and for :data:`SETTLE`
        seconds after its last one (the channel is about to be closed at once)."""
        with self._changed:
            if self._closed:
                return False
            self._closed = True
        if wait_first_report:
            self._reported.wait(FIRST_REPORT)
            time.sleep(max(0.0, self._last_report + SETTLE - time.monotonic()))
        self._grpc_channel.unsubscribe(self._report)
        self._set(grpc.ChannelConnectivity.SHUTDOWN)
        return True

    @property
    def channel(self) -> grpc.Channel:
        """The channel watched."""
        return self._grpc_channel

    def _report(self, state: grpc.ChannelConnectivity) -> None:
        """grpc's callback (on its delivery thread): a new state. Must not raise (grpc would log it)."""
        self._last_report = time.monotonic()
        self._reported.set()
        with self._changed:
            if not self._closed:
                self._set(state)

    def _set(self, state: grpc.ChannelConnectivity) -> None:
        with self._changed:
            if self._state is grpc.ChannelConnectivity.READY and state is not grpc.ChannelConnectivity.READY:
                self.breaks += 1
            self._state = state
            self._changed.notify_all()


def _settled(state: grpc.ChannelConnectivity | None) -> Connection | None:
    return None if state is None else SETTLED.get(state)


def close_quietly(states: list[ChannelState]) -> None:
    """Close channels that no call uses: stop watching them now, close them :data:`QUIET_CLOSE` seconds later
    (on a timer thread that ends then), when grpc's threads behind their subscriptions have ended."""
    stopped = [state.channel for state in states if state.stop()]
    if stopped:
        closer = threading.Timer(QUIET_CLOSE, _close_all, args=(stopped,))
        closer.name = "liftbridge-channel-closer"
        closer.start()


def _close_all(channels: list[grpc.Channel]) -> None:
    for channel in channels:
        channel.close()


def close_in_background(states: list[ChannelState]) -> None:
    """Close channels at once, each by :meth:`ChannelState.close`, on a thread that ends then: closing a watched
    channel waits for grpc's thread (up to 0.2 s), which the caller need not."""
    if states:
        closer = threading.Thread(target=_close_each, args=(states,), name="liftbridge-channel-closer")
        closer.start()


def _close_each(states: list[ChannelState]) -> None:
    for state in states:
        state.close()
