"""Wire bytes for the column builders' tests, and the differential check of the two builders.

Used by tests/unit/test_wire_columns.py and test_wire_differential.py, and by the coverage-guided
fuzzer (tools/fuzz_wire_columns.py), which hands :func:`check` the bytes it makes up.

:func:`check` reads one byte string twice. First as one serialized ``Message`` added to a fresh
builder. Then as a script: byte 0 picks ``max_rows`` (1-8), byte 1 ``max_bytes``, then steps follow,
each a byte ``n``: 0xff followed by two bytes is ``window(BOUNDS[a], BOUNDS[b])``, any other ``n``
is ``add`` of the next ``n`` bytes (a FULL answer is followed by ``finish`` and the same ``add``, as
the Subscribe reader does). Both builders must give the same answers, rows, last offsets, errors and
buffers at every step.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from liftbridge_provider.client.columns import END, FULL, LAST

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
BOUNDS: tuple[int, ...] = (INT64_MIN - 1, INT64_MIN, INT64_MIN + 1, -1, 0, 1, 2, 3, 5, 100, 2**62, INT64_MAX - 1)
BOUNDS += (INT64_MAX, INT64_MAX + 1)
"""Window bounds a script can set: small offsets, the int64 limits and one past each."""
WINDOW_STEP = 0xFF


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are sent as 10-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return tag(number, 0) + varint(value)
    return tag(number, 2) + varint(len(value)) + value


def entry(name: bytes | None, value: bytes | None) -> bytes:
    body = (field(1, name) if name is not None else b"") + (field(2, value) if value is not None else b"")
    return field(9, body)


def group(number: int, body: bytes = b"") -> bytes:
    """A group (wire types 3 and 4 around ``body``): no field of Message is one, so it is an unknown field."""
    return tag(number, 3) + body + tag(number, 4)


Observation = tuple[object, ...]


def _call(action: Callable[[], object]) -> object:
    """What an action gave: its value, or the type of the error it raised (with the message's start for
    malformed bytes: both builders name them alike, then each says what was wrong in its own words)."""
    try:
        return action()
    except ValueError as exc:
        return ("ValueError", str(exc).split(":")[0])
    except (TypeError, OverflowError) as exc:
        return (type(exc).__name__,)


def _add(made: columns.ColumnBuilder, data: bytes, seen: list[Observation]) -> None:
    status = _call(lambda: made.add(data))
    seen.append(("add", status, made.rows, made.last_offset))
    if status == FULL:
        seen.append(("finish", made.finish()))
        seen.append(("add again", _call(lambda: made.add(data)), made.rows, made.last_offset))


def steps(data: bytes) -> tuple[int, int, list[tuple[int, int] | bytes]]:
    """The script in ``data``: max_rows, max_bytes and the steps (a window's bounds, or bytes to add)."""
    if len(data) < 2:
        return 1, 1, []
    max_rows, max_bytes = 1 + data[0] % 8, 1 << 20 if data[1] == 0xFF else 1 + data[1] * 4
    out: list[tuple[int, int] | bytes] = []
    at = 2
    while at < len(data):
        n = data[at]
        if n == WINDOW_STEP and at + 2 < len(data):
            out.append((BOUNDS[data[at + 1] % len(BOUNDS)], BOUNDS[data[at + 2] % len(BOUNDS)]))
            at += 3
        else:
            out.append(data[at + 1 : at + 1 + n])
            at += 1 + n
    return max_rows, max_bytes, out


def _take_all(
    made: columns.ColumnBuilder, buffer: bytes | bytearray, spans: list[int], seen: list[Observation]
) -> None:
    """The messages of ``spans`` handed to ``take`` as the data plane hands them (finish at FULL, go on after
    LAST and END), every answer seen; an error ends the group (where it stopped is the builder's state)."""
    index = 0
    while index < len(spans):
        answer = _call(functools.partial(made.take, buffer, spans, index))
        seen.append(("take", answer, made.rows, made.last_offset))
        if not isinstance(answer, tuple) or len(answer) != 2 or not isinstance(answer[1], int):
            return
        status, index = answer
        if status == FULL:
            seen.append(("finish", made.finish()))
        elif status in (LAST, END):
            index += 2


def observe(builder: type[columns.ColumnBuilder], data: bytes) -> list[Observation]:
    """Everything a builder answers to ``data`` read as one message, then as a script (each message added
    alone, then the same messages as spans of one buffer handed to ``take``, as the data plane cuts them)."""
    seen: list[Observation] = []
    made = builder(max_rows=1000, max_bytes=1 << 20)
    _add(made, data, seen)
    seen.append(("finish", made.finish()))
    max_rows, max_bytes, script = steps(data)
    made = builder(max_rows=max_rows, max_bytes=max_bytes)
    for step in script:
        if isinstance(step, bytes):
            _add(made, step, seen)
        else:
            low, high = step
            seen.append(("window", _call(functools.partial(made.window, low, high))))
    seen.append(("finish", made.finish(), made.rows, made.last_offset))
    made = builder(max_rows=max_rows, max_bytes=max_bytes)
    group: list[bytes] = []
    steps_then_end: list[tuple[int, int] | bytes | None] = [*script, None]
    for number, item in enumerate(steps_then_end):
        if isinstance(item, bytes):
            group.append(item)
            continue
        if group:  # one buffer: a few bytes of something else first, then the messages back to back
            joined = b"\x00\x05" + b"".join(group)
            buffer = bytearray(joined) if number % 2 else joined
            spans, at = [], 2
            for message in group:
                spans += [at, at + len(message)]
                at += len(message)
            _take_all(made, buffer, spans, seen)
            group = []
        if item is not None:
            low, high = item
            seen.append(("window", _call(functools.partial(made.window, low, high))))
    seen.append(("finish", made.finish(), made.rows, made.last_offset))
    return seen


def check(data: bytes) -> None:
    """Both builders answer ``data`` alike (AssertionError naming the first difference otherwise)."""
    compiled = columns.COMPILED_BUILDER
    assert compiled is not None, "the compiled builder is not built"
    python, native = observe(columns.PYTHON_BUILDER, data), observe(compiled, data)
    for step, (expected, got) in enumerate(zip(python, native, strict=True)):
        assert expected == got, f"input {data!r}, step {step}: pure Python {expected!r}, compiled {got!r}"


def sample_messages(chance: random.Random, count: int) -> list[bytes]:
    """Messages serialized by protobuf, with every field set now and then."""
    out = []
    for _ in range(count):
        message = api.Message(
            offset=chance.choice([0, 1, 7, -1, INT64_MAX, INT64_MIN, chance.randrange(-(2**63), 2**63)]),
            key=chance.randbytes(chance.randrange(0, 4)),
            value=chance.randbytes(chance.randrange(0, 12)),
            timestamp=chance.choice([0, -1_999, 1_999, chance.randrange(-(2**63), 2**63)]),
            stream=chance.choice(["", "s"]),
            partition=chance.choice([0, 3, -1]),
            subject=chance.choice(["", "a.b", "naïve", "日本"]),
            replySubject=chance.choice(["", "r"]),
            ackInbox=chance.choice(["", "i"]),
            correlationId=chance.choice(["", "c"]),
            ackPolicy=chance.choice([api.LEADER, api.ALL, api.NONE]),
        )
        for _ in range(chance.randrange(0, 4)):
            message.headers[chance.choice(["", "a", "b", "é", "z"])] = chance.randbytes(chance.randrange(0, 3))
        out.append(message.SerializeToString())
    return out


def mutate(chance: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """``data`` with a few random edits: bytes flipped, set, inserted or cut, or a splice from ``pool``."""
    out = bytearray(data)
    for _ in range(chance.randrange(1, 4)):
        kind = chance.randrange(5)
        at = chance.randrange(len(out) + 1)
        if kind == 0 and out and at < len(out):
            out[at] ^= 1 << chance.randrange(8)
        elif kind == 1 and out and at < len(out):
            out[at] = chance.choice([0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x1B, 0x1C, 0x4A, chance.randrange(256)])
        elif kind == 2:
            out[at:at] = chance.randbytes(chance.randrange(1, 4))
        elif kind == 3:
            del out[at : at + chance.randrange(1, 4)]
        else:
            other = chance.choice(pool)
            cut = chance.randrange(len(other) + 1)
            out[at:] = other[cut:]
    return bytes(out)


def script(chance: random.Random, messages: list[bytes]) -> bytes:
    """A script of a few messages (each at most 254 bytes) and windows, for :func:`check`."""
    out = bytearray([chance.randrange(256), chance.choice([0, 3, 12, 40, 0xFF])])
    for _ in range(chance.randrange(1, 6)):
        if chance.random() < 0.2:
            out += bytes([WINDOW_STEP, chance.randrange(len(BOUNDS)), chance.randrange(len(BOUNDS))])
        else:
            message = chance.choice(messages)[:254]
            out += bytes([len(message)]) + message
    return bytes(out)


def inputs(seed: int, count: int) -> Iterator[bytes]:
    """``count`` inputs for :func:`check`: random bytes, mutated messages and scripts, the same for a seed."""
    chance = random.Random(seed)
    messages = sample_messages(chance, 64)
    for _ in range(count):
        kind = chance.randrange(4)
        if kind == 0:
            yield chance.randbytes(chance.randrange(0, 24))
        elif kind == 1:
            yield mutate(chance, chance.choice(messages), messages)
        elif kind == 2:
            yield script(chance, messages)
        else:
            yield script(chance, [mutate(chance, m, messages) for m in chance.sample(messages, 3)])
