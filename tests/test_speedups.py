"""The compiled bulk handlers (``client/_speedups.c``) do exactly what their pure-Python twins do, for any bytes: the
same bytes and numbers appended to the rows' columns, the same callback arguments (types and contents), the same
position returned, the same errors raised (decisions 0029 and 0033).

Both are fed the same wire bytes: generated runs of deliveries and of Direct Get replies (with and without headers,
pin ids, redeliveries, statuses, other subscriptions' messages, empty and 1 MB payloads, many subjects), every prefix
of a run (what a handler sees when a run is split across two reads), hostile bytes (sizes that lie, truncated lines,
huge numbers, garbage) and, as a small fuzzer with a fixed seed, valid runs with random bytes changed.

The compiled handlers get the bytes in a buffer that ends where a page no read may touch begins (``guarded``): a read
one byte past the end faults at once, where a bytearray would hide it (it keeps a NUL after its bytes, inside the
block it allocated, so not even ASan sees that read). ``bench/sanitize.py`` runs this file under ASan and UBSan, and
``bench/fuzz.py`` runs ``outcome`` on what a coverage-guided fuzzer makes.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import mmap
import random
import sys
import weakref
from array import array
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import spark_jetstream.client
from spark_jetstream.client import protocol
from spark_jetstream.client.protocol import PURE, BulkParsers, FastParser, wire
from spark_jetstream.read.rows import RowBuffer

COMPILED, WHY = protocol.compiled_parsers()
needs_compiled = pytest.mark.skipif(COMPILED is None, reason=f"no compiled bulk handlers here: {WHY}")

SID, OTHER_SID = 5, 55  # the other subscription's id starts with this one's digits
INBOX = b"_INBOX.reader"
STAMP = 1_764_200_000_000_000_000
TIME = b"2026-11-27T10:00:00.123456789Z"
PIN = b"NATS/1.0\r\nNats-Pin-Id: 8Jc2kWq9ZxT1bVn3mLp0aa\r\n\r\n"
OWN_HEADERS = [None, PIN, b"NATS/1.0\r\nKey: a\r\nKey: b\r\nEmpty:\r\n\r\n", b"NATS/1.0\r\n\r\n"]
STATUSES = [
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0\r\n\r\n",
    b"NATS/1.0 409 Batch Completed\r\n\r\n",
    b"NATS/1.0 404 No Messages\r\n\r\n",
    b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 10\r\nNats-Pending-Bytes: 0\r\n\r\n",
    b"NATS/1.0 204 EOB\r\n\r\n",
    b"NATS/1.0 503\r\n\r\n",
]
SUBJECTS = [b"%d.ev.k%d" % (i % 8, i) for i in range(1024)] + ["ü.🚀.x".encode(), b"a", b"s" * 300, b"q'\"~!@#"]
PAYLOADS = [
    b"",
    b"x",
    b"\r\n",
    b"\r\n\r\n",
    bytes(range(256)),
    b"MSG 1.a 5 $JS.ACK.S.C.1.2.3.4.0 1\r\nx\r\n",  # a delivery of this subscription, inside a payload
    b"p" * 100,
]

Kind = str  # "deliveries" or "direct": which handler of a ``BulkParsers``


def handler_maker(parsers: BulkParsers, kind: Kind) -> Callable[..., protocol.BulkHandler]:
    if kind == "deliveries":
        return parsers.deliveries_handler
    return lambda sid, target, keep: parsers.direct_replies_handler(sid, b"S", target, keep)


GUARDS = sys.platform.startswith("linux")
"""Whether ``guarded`` guards (``mprotect`` through ctypes, checked on Linux only)."""


class _Guarded:
    """Anonymous memory whose last page is made unreadable (``PROT_NONE``): bytes copied right before it end where a
    read past them faults (SIGSEGV; under ASan, its report)."""

    def __init__(self, size: int) -> None:
        self.end = max(1, -(-size // mmap.PAGESIZE)) * mmap.PAGESIZE
        self.memory = mmap.mmap(-1, self.end + mmap.PAGESIZE)
        anchor = ctypes.c_char.from_buffer(self.memory)
        address = ctypes.addressof(anchor)
        del anchor  # an exported buffer would keep the map from ever closing
        mprotect = ctypes.CDLL(None, use_errno=True).mprotect
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.guard = address + self.end
        if mprotect(self.guard, mmap.PAGESIZE, 0) != 0:  # PROT_NONE
            raise OSError(ctypes.get_errno(), "mprotect")
        self.view = memoryview(self.memory)

    def holding(self, data: bytes) -> memoryview:
        start = self.end - len(data)
        self.view[start : self.end] = data
        return self.view[start : self.end]


_guarded: list[_Guarded] = []


def guarded(data: bytes) -> memoryview:
    """``data`` in memory a read may not go past: a writable memoryview of format ``B`` (its slices' ``obj`` is the
    map), valid until the next call. Where pages cannot be protected (not Linux), a bytearray's view."""
    if not GUARDS:
        return memoryview(bytearray(data))
    if not _guarded or _guarded[0].end < len(data):
        _guarded[:] = [_Guarded(len(data))]
    return _guarded[0].holding(data)


def target(kind: Kind, keep_headers: bool) -> SimpleNamespace:
    """What a handler appends to: ``rows`` as a reader's (Direct Get's times are text), one row in it already (so the
    ends a run appends are past it)."""
    rows = RowBuffer(text_times=kind == "direct", keep_headers=keep_headers)
    rows.add(b"0.before", b"earlier", 1, TIME if kind == "direct" else STAMP, b"NATS/1.0\r\nX: y\r\n\r\n")
    return SimpleNamespace(rows=rows)


def columns(rows: RowBuffer) -> tuple:
    """The contents of the rows' column buffers, their types checked (what Arrow builds the columns over)."""
    texts = [(rows.subjects, rows.subject_ends), (rows.payload, rows.offsets)]
    texts += [
        (values, ends) for values, ends in ((rows.headers, rows.header_ends), (rows.times, rows.time_ends)) if ends
    ]
    for values, ends in texts:
        assert type(values) is bytearray and type(ends) is array and ends.typecode == "i", (values, ends)
        assert ends[0] == 0 and ends[-1] == len(values) and len(ends) == len(rows.seqs) + 1
    numbers = [rows.seqs] if rows.time_ends is not None else [rows.seqs, rows.times]
    assert all(type(values) is array and values.typecode == "q" for values in numbers)
    return tuple((bytes(values), ends.tolist()) for values, ends in texts) + tuple(n.tolist() for n in numbers)  # type: ignore[union-attr]


def outcome(
    parsers: BulkParsers, kind: Kind, data: bytes, pos: int, keep_headers: bool, sid: int = SID, guard: bool = True
) -> tuple:
    """What one implementation's handler does with ``data`` at ``pos``: each callback call's arguments (the rows'
    contents then, types and contents of the others), what it returned or raised, and the rows' contents at the end.
    A compiled handler gets the bytes in ``guarded`` memory (with ``guard``); the pure one, which needs a bytearray's
    methods, in a bytearray, as the connection's parser hands them."""
    buf: bytearray | memoryview = bytearray(data) if parsers is PURE or not guard else guarded(data)
    into = target(kind, keep_headers)
    calls: list[list[Any]] = []

    def callback(rows: RowBuffer, *args: object) -> None:
        assert rows is into.rows
        calls.append([columns(rows), *((type(arg).__name__, arg) for arg in args)])

    handler = handler_maker(parsers, kind)(sid, into, callback)
    with memoryview(buf) as view:
        try:
            result: tuple = ("returned", handler(buf, view, pos))
        except Exception as exc:  # compared, not hidden: both must raise the same
            result = ("raised", type(exc), str(exc))
    return calls, result, columns(into.rows)


def assert_alike(kind: Kind, data: bytes, positions: list[int] | None = None) -> list[tuple]:
    """Both implementations at each of ``positions`` (every line start by default), keeping headers and not."""
    assert COMPILED is not None
    if positions is None:
        positions = line_starts(data)
    seen = []
    for keep_headers in (False, True):
        for pos in positions:
            pure = outcome(PURE, kind, data, pos, keep_headers)
            compiled = outcome(COMPILED, kind, data, pos, keep_headers)
            if compiled != pure:
                pytest.fail(
                    f"{kind} differ at {pos} (keep_headers={keep_headers}) of {data[:300]!r}...: "
                    f"pure {_short(pure)}, compiled {_short(compiled)}"
                )
            seen.append(pure)
    return seen


def _short(found: tuple) -> str:
    text = repr(found)
    return text if len(text) < 2000 else text[:2000] + "..."


def line_starts(data: bytes) -> list[int]:
    """0 and every position after a CRLF: where a message's line may start."""
    starts, at = [0], data.find(b"\r\n")
    while at >= 0:
        starts.append(at + 2)
        at = data.find(b"\r\n", at + 2)
    return starts


# -- generated wire bytes ---------------------------------------------------------------------------------------------


def ack_reply(rng: random.Random, seq: int, delivered: int, pending: int) -> bytes:
    """A delivery's reply subject, in one of its three forms (7, 9 or 10 tokens after ``$JS.ACK.``)."""
    numbers = b"%d.%d.%d.%d.%d" % (delivered, seq, seq + 7, STAMP + seq, pending)
    form = rng.randrange(3)
    if form == 0:
        return b"$JS.ACK.STREAM.member-0." + numbers
    prefix = b"$JS.ACK.hub.ACCHASH.STREAM.member-0."
    return prefix + numbers + (b".rAnD0m" if form == 2 else b"")


def deliveries(rng: random.Random, count: int, payload: bytes | None = None) -> list[bytes]:
    """``count`` messages on the pull inbox: deliveries (pin ids, other headers, redeliveries, pending counts),
    statuses, and another subscription's messages between them."""
    messages, seq = [], 0
    for _ in range(count):
        draw = rng.random()
        if draw < 0.08:
            messages.append(wire(SID, INBOX, b"", b"", rng.choice(STATUSES)))
            continue
        if draw < 0.12:
            messages.append(wire(OTHER_SID, b"other.sub", b"", b"x", rng.choice([None, PIN])))
            continue
        if draw < 0.2 and seq > 1:
            delivered, number = rng.randrange(2, 5), rng.randrange(1, seq)  # a redelivery
        else:
            seq += 1
            delivered, number = 1, seq
        data = payload if payload is not None else rng.choice(PAYLOADS)
        pending = rng.choice([0, 1, 7, 10**6])
        reply = ack_reply(rng, number, delivered, pending)
        messages.append(wire(SID, rng.choice(SUBJECTS), reply, data, rng.choice(OWN_HEADERS)))
    return messages


def direct_reply(
    seq: int,
    payload: bytes,
    own: bytes | None = None,
    pending: int | None = 0,
    last: int | None = None,
    subject: bytes = b"1.ev.k1",
    sid: int = SID,
    stream: bytes = b"S",
) -> bytes:
    """A Direct Get reply of ``stream`` as nats-server 2.11-2.15 writes it: the message's own headers, then the
    server's."""
    server = b"Nats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\n" % (
        stream,
        subject,
        seq,
        TIME,
    )
    if pending is not None:
        server += b"Nats-Num-Pending: %d\r\n" % pending
    if last is not None:
        server += b"Nats-Last-Sequence: %d\r\n" % last
    block = (own or b"NATS/1.0\r\n\r\n")[:-2] + server + b"\r\n"
    return wire(sid, INBOX, b"", payload, block)


def direct_replies(rng: random.Random, count: int, payload: bytes | None = None) -> list[bytes]:
    """``count`` messages on a Direct Get inbox: replies (own headers, with and without pending and last seq),
    statuses, and another subscription's replies and a mirror's (stream ``M``) between them."""
    messages = []
    for seq in range(1, count + 1):
        draw = rng.random()
        if draw < 0.08:
            messages.append(wire(SID, INBOX, b"", b"", rng.choice(STATUSES)))
            continue
        sid = OTHER_SID if draw < 0.12 else SID
        data = payload if payload is not None else rng.choice(PAYLOADS)
        own = rng.choice([*OWN_HEADERS, b"NATS/1.0\r\nNats-Stream: fake\r\nNats-Sequence: 999\r\n\r\n"])
        pending = rng.choice([None, 0, count - seq])
        last = rng.choice([None, None, seq + 100])
        stream = b"M" if rng.random() < 0.04 else b"S"
        messages.append(direct_reply(seq, data, own, pending, last, rng.choice(SUBJECTS), sid, stream))
    return messages


GENERATORS = {"deliveries": deliveries, "direct": direct_replies}
KINDS = list(GENERATORS)


# -- the differential tests -----------------------------------------------------------------------------------------


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(6))
def test_generated_runs_are_handed_over_alike_from_every_message(kind, seed):
    data = b"".join(GENERATORS[kind](random.Random(seed), 80))
    seen = assert_alike(kind, data)
    assert any(calls for calls, *_ in seen), "some runs were taken"


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_every_split_point_of_a_run_across_two_reads(kind):
    """The handler sees every prefix of a run (what one read held); and the connection's parser, fed the run in
    two reads split at every point, hands the same things to the bulk and the per-message handlers."""
    data = b"".join(GENERATORS[kind](random.Random(42), 14))
    for end in range(len(data) + 1):
        assert_alike(kind, data[:end], [0])
    assert COMPILED is not None
    for split in range(len(data) + 1):
        assert parsed(COMPILED, kind, [data[:split], data[split:]]) == parsed(PURE, kind, [data[:split], data[split:]])


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_one_megabyte_payloads_and_their_split_points(kind):
    rng = random.Random(7)
    big = bytes(rng.randrange(256) for _ in range(4096)) * 256  # 1 MiB
    data = b"".join([*GENERATORS[kind](rng, 2, big), *GENERATORS[kind](rng, 3)])
    ends = {*range(0, 200), *range(len(data) - 300, len(data) + 1), *(rng.randrange(len(data)) for _ in range(20))}
    first = data.find(b"\r\n", len(data) // 2)  # the line after the first big one
    ends |= set(range(first - 40, first + 40))
    for end in sorted(ends):
        assert_alike(kind, data[:end], [0])
    assert_alike(kind, data)


@needs_compiled
def test_empty_payloads_many_subjects_and_pin_ids_in_one_run():
    rng = random.Random(3)
    data = b"".join(
        wire(
            SID,
            subject,
            ack_reply(rng, seq, 1, len(SUBJECTS) - seq),
            b"" if seq % 2 else b"x",
            PIN if seq % 3 else None,
        )
        for seq, subject in enumerate(SUBJECTS, 1)
    )
    seen = assert_alike("deliveries", data, [0])
    calls, (_, end), rows = seen[0]
    assert end == len(data) and len(calls) == 1 and rows[-2] == [1, *range(1, len(SUBJECTS) + 1)]


DELIVERY = b"MSG 1.a 5 $JS.ACK.S.C.1.10.11.1764200000000000000.0 5\r\nhello\r\n"
HEADED = b"HMSG 1.b 5 $JS.ACK.S.C.1.12.13.1764200000000000001.3 %d %d\r\n%shello\r\n" % (len(PIN), len(PIN) + 5, PIN)
LONG = b"9" * 5000  # longer than int() converts by default (sys.get_int_max_str_digits(): 4300)
HOSTILE_DELIVERIES = [
    DELIVERY.replace(b" 5\r\n", b" 3\r\n"),  # a size that lies (short)
    DELIVERY.replace(b" 5\r\n", b" 9\r\n"),  # a size that lies (long: the next line taken as payload)
    DELIVERY.replace(b" 5\r\n", b" 99999999999999999999999\r\n"),  # a size past the buffer, past 64 bits
    DELIVERY.replace(b" 5\r\n", b" 00000000000000000000005\r\n"),  # 23 digits, of value 5
    DELIVERY.replace(b" 5\r\n", b" %b\r\n" % LONG),  # a size int() refuses to convert
    DELIVERY.replace(b".1.10.", b".1.%b." % LONG),  # a seq int() refuses to convert
    DELIVERY.replace(b".1.10.", b".1.123456789012345678901234567890."),  # a seq past 64 bits
    DELIVERY.replace(b".1764200000000000000.", b".000000000000000000000000001."),
    DELIVERY.replace(b".0 5", b".00 5"),  # pending "00": not the server's "nothing pending"
    DELIVERY.replace(b" 5\r\n", b" 2 5\r\n"),  # MSG with a header size
    HEADED.replace(b" %d %d\r\n" % (len(PIN), len(PIN) + 5), b" %d\r\n" % (len(PIN) + 5)),  # HMSG without one
    HEADED.replace(b" %d %d\r\n" % (len(PIN), len(PIN) + 5), b" 99 5\r\n"),  # header size past the size
    HEADED.replace(b" %d %d\r\n" % (len(PIN), len(PIN) + 5), b" %b 5\r\n" % LONG),
    HEADED.replace(b" %d %d\r\n" % (len(PIN), len(PIN) + 5), b" 3 %d\r\n" % (len(PIN) + 5)),  # header size lies
    DELIVERY.replace(b"S.C.1.", b"S.C.x."),  # a number that is not one
    DELIVERY.replace(b"S.C.1.", b"S..1."),  # an empty token
    DELIVERY.replace(b"S.C.1.", b"S.C.X.1."),  # 8 tokens
    DELIVERY.replace(b"S.C.1.", b"A.B.C.D.S.C.1."),  # 11 tokens
    DELIVERY.replace(b"S.C.1.", b"A.B.S.C.1.").replace(b".0 5", b".0.r.s 5"),  # 11 again, the random token's way
    DELIVERY.replace(b"S.C.1.", b"\x00\xff.\t.1."),  # odd bytes in tokens
    DELIVERY.replace(b"1.a 5", b"1.a  5"),  # two spaces
    DELIVERY.replace(b"1.a 5", b"1.a 05"),  # the sid with a leading zero
    DELIVERY.replace(b"1.a 5", b"1.a 55"),  # another sid starting with this one's digits
    DELIVERY.replace(b"MSG 1.a", b"MSG \r.a"),  # a lone CR in the subject
    DELIVERY.replace(b" 5\r\n", b" 5\n"),  # LF without CR
    DELIVERY.replace(b" 5\r\n", b" 5\r"),  # a line cut after CR
    DELIVERY.replace(b"MSG", b"HHMSG"),
    DELIVERY.replace(b"MSG", b"msg"),
    DELIVERY.replace(b"hello\r\n", b"helloXY"),  # no CRLF after the payload: taken by its size, as the parser does
    DELIVERY[:-1],
    DELIVERY[:20],
    b"garbage\r\n" + DELIVERY,
    DELIVERY + b"garbage in between\r\n" + DELIVERY + b"\x00\x01\x02" + HEADED,
    DELIVERY + b"PING\r\n" + HEADED,
    DELIVERY * 3 + b"MSG 1.a 5 $JS.ACK.S.C.1.10.11.1764200000000000000.0 5\r\nhe",
    b"MSG 1.a 5 $JS.ACK." + b"a." * 5000 + b"0 5\r\nhello\r\n",  # a long reply subject
    b"MSG " + b"s" * 100_000 + b" 5 $JS.ACK.S.C.1.10.11.12.0 5\r\nhello\r\n",  # a long subject
    b"HMSG",
    b"",
]


@needs_compiled
@pytest.mark.parametrize("data", HOSTILE_DELIVERIES, ids=range(len(HOSTILE_DELIVERIES)))
def test_hostile_deliveries_are_handled_alike(data):
    assert_alike("deliveries", data)
    assert_alike("deliveries", DELIVERY + data + DELIVERY)


REPLY = direct_reply(3, b"hello", pending=7)
REPLY_BLOCK = b"NATS/1.0\r\n" + REPLY.split(b"\r\nNATS/1.0\r\n", 1)[1].split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
BLOCK = len(REPLY_BLOCK)
TRUE_SIZES = b" %d %d\r\n" % (BLOCK, BLOCK + 5)
assert TRUE_SIZES in REPLY


def edited(old: bytes, new: bytes, payload: bytes = b"hello") -> bytes:
    """``REPLY`` with its header block edited, its sizes true."""
    assert old in REPLY_BLOCK
    return wire(SID, INBOX, b"", payload, REPLY_BLOCK.replace(old, new))


HOSTILE_REPLIES = [
    REPLY.replace(TRUE_SIZES, b" %d %d\r\n" % (BLOCK, BLOCK + 3)),  # a size that lies (short)
    REPLY.replace(TRUE_SIZES, b" %d %d\r\n" % (BLOCK, BLOCK + 9)),  # (long)
    REPLY.replace(TRUE_SIZES, b" %d %d\r\n" % (BLOCK - 4, BLOCK + 1)),  # a header size shorter than the block
    REPLY.replace(TRUE_SIZES, b" %d %d\r\n" % (BLOCK + 4, BLOCK + 5)),  # longer than it
    REPLY.replace(TRUE_SIZES, b" %d %d\r\n" % (BLOCK + 10_000, BLOCK + 5)),  # past the buffer
    REPLY.replace(TRUE_SIZES, b" %d %d\r\n" % (BLOCK, BLOCK - 1)),  # a size below the header size
    REPLY.replace(TRUE_SIZES, b" %d 99999999999999999999999\r\n" % BLOCK),
    REPLY.replace(TRUE_SIZES, b" 99999999999999999999999 %d\r\n" % (BLOCK + 5)),
    REPLY.replace(TRUE_SIZES, b" 0000000000000000000000%d %d\r\n" % (BLOCK, BLOCK + 5)),  # 25 digits, true
    REPLY.replace(TRUE_SIZES, b" %b %d\r\n" % (LONG, BLOCK + 5)),  # a header size int() refuses to convert
    REPLY.replace(TRUE_SIZES, b" %d %b\r\n" % (BLOCK, LONG)),  # a size int() refuses to convert
    edited(b"Nats-Sequence: 3", b"Nats-Sequence: %b" % LONG),  # a seq int() refuses (after the run)
    edited(b"Nats-Sequence: 3", b"Nats-Sequence: 123456789012345678901234567890"),
    edited(b"Nats-Sequence: 3", b"Nats-Sequence: 0000000000000000000000000003"),
    edited(b"Nats-Sequence: 3", b"Nats-Sequence: x"),
    edited(b"Nats-Sequence: 3", b"Nats-Sequence: "),
    edited(b"Nats-Num-Pending: 7", b"Nats-Num-Pending: x"),
    edited(b"Nats-Num-Pending: 7", b"Nats-Num-Pending: 0000000000000000000000000007"),
    edited(b"Nats-Num-Pending: 7\r\n", b"Nats-Num-Pending: 7\r\nNats-Last-Sequence: 9\r\n"),
    edited(b"Nats-Num-Pending: 7\r\n", b"Nats-Last-Sequence: 9\r\n"),
    edited(b"Nats-Num-Pending: 7\r\n", b"Nats-Last-Sequence: 9\r\nNats-Num-Pending: 7\r\n"),  # out of order
    edited(b"Nats-Num-Pending: 7\r\n", b"Nats-Last-Sequence: x\r\n"),
    edited(b"Nats-Num-Pending: 7\r\n", b""),
    edited(b"Nats-Subject: 1.ev.k1", b"Nats-Subject: "),
    edited(b"Nats-Subject: 1.ev.k1", "Nats-Subject: ü 🚀 \x00".encode()),
    edited(b"Nats-Time-Stamp: ", b"Nats-Time-Stamp:"),
    edited(b"Nats-Stream: S", b"Nats-Stream: "),
    edited(b"Nats-Stream: S", b"Nats-Stream: M"),  # a mirror's reply
    edited(b"Nats-Stream: S", b"Nats-Stream: SS"),
    edited(b"Nats-Stream: S\r\n", b"Nats-Stream: \r\nNats-Stream: S\r\n"),
    edited(b"Nats-Stream: S\r\n", b"Nats-Stream: S\n"),
    edited(b"Nats-Stream: S\r\n", b"Nats-Stream: S\r"),
    edited(b"NATS/1.0\r\n", b"NATS/1.0 200\r\n"),
    edited(b"Nats-Num-Pending: 7\r\n", b"Nats-Num-Pending: 7\r\nX-After: 1\r\n"),  # a header after the server's
    edited(b"\r\n\r\n", b"\r\n\r\nNats-Stream: S\r\nNats-Subject: 9\r\nNats-Sequence: 9\r\nNats-Time-Stamp: t\r\n\r\n"),
    REPLY.replace(
        b"\r\n\r\nhello",
        b"\r\nX: 1\r\n\r\nNats-Stream: S\r\nNats-Subject: 9\r\nNats-Sequence: 9\r\nNats-Time-Stamp: t\r\n\r\nhello",
    ),  # the server's headers only after the block's end
    REPLY.replace(b"HMSG", b"MSG"),
    REPLY.replace(b" 5 ", b" 55 "),
    REPLY.replace(b" 5 ", b" 05 "),
    REPLY.replace(b"HMSG " + INBOX, b"HMSG " + INBOX + b" reply"),  # a reply subject: not a Direct Get reply
    direct_reply(4, b"x\r\n" + REPLY),  # a reply inside a payload
    direct_reply(5, b"y", own=b"NATS/1.0\r\n\r\nNats-Stream: S\r\n\r\n"),  # a blank line inside its own headers
    direct_reply(6, b"z", own=b"NATS/1.0\r\nA\rB: c\r\n\r\n"),  # a lone CR in its own headers
    direct_reply(
        7, b"w", own=b"NATS/1.0\r\nNats-Stream: S\r\nNats-Subject: 9\r\nNats-Sequence: 9\r\nNats-Time-Stamp: t\r\n\r\n"
    ),  # the server's headers as its own
    REPLY.replace(b"hello\r\n", b"helloXY"),
    REPLY[:-1],
    REPLY[:40],
    b"garbage\r\n" + REPLY,
    REPLY + b"garbage in between\r\n" + REPLY + b"\x00" + REPLY,
    REPLY + b"HMSG " + INBOX + b" 5 9 9\r\nNATS/1.0\r\n" + b"line\r\n" * 2000,  # the server's headers never come
    b"",
]


@needs_compiled
@pytest.mark.parametrize("data", HOSTILE_REPLIES, ids=range(len(HOSTILE_REPLIES)))
def test_hostile_direct_get_replies_are_handled_alike(data):
    assert_alike("direct", data)
    assert_alike("direct", REPLY + data + REPLY)


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_valid_runs_with_random_bytes_changed_are_handled_alike(kind):
    """A small fuzzer with a fixed seed: valid runs with a few bytes replaced, inserted, removed or repeated (the
    bytes the scanners look for most likely), compared from every line start."""
    rng = random.Random(2028)
    tricky = b" .\r\n0123456789HMSG$JSACK:-N\x00\xff"
    for _ in range(1500):
        data = bytearray(b"".join(GENERATORS[kind](rng, rng.randrange(1, 6))))
        for _ in range(rng.randrange(1, 5)):
            at = rng.randrange(len(data))
            change = rng.randrange(4)
            if change == 0:
                data[at] = rng.choice(tricky)
            elif change == 1:
                data[at:at] = bytes(rng.choice(tricky) for _ in range(rng.randrange(1, 4)))
            elif change == 2:
                del data[at : at + rng.randrange(1, 8)]
            else:
                data[at:at] = data[at : at + rng.randrange(1, 30)]
        assert_alike(kind, bytes(data))


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_a_number_that_does_not_fit_in_64_bits_ends_the_run_before_its_message(kind):
    """Seqs (and deliveries' times) go into an ``array("q")``: one past it, or longer than int() converts, is left to
    the per-message path, where the reader reports a delivery it cannot read; leading zeros are read as int() reads
    them."""

    def message(seq: bytes, stamp: bytes = b"1764200000000000000") -> bytes:
        if kind == "deliveries":
            return DELIVERY.replace(b".1.10.", b".1.%b." % seq).replace(b".1764200000000000000.", b".%b." % stamp)
        return edited(b"Nats-Sequence: 3", b"Nats-Sequence: %b" % seq)

    fits = message(b"9223372036854775806") + message(b"00000000000000000000009223372036854775807")
    for past in (b"9223372036854775808", b"123456789012345678901234567890", LONG):
        (calls, result, rows), *_ = assert_alike(kind, fits + message(past) + fits, [0])
        assert result == ("returned", len(fits)) and len(calls) == 1
        assert rows[-1 if kind == "direct" else -2] == [1, 2**63 - 2, 2**63 - 1]
    if kind == "deliveries":
        (calls, result, rows), *_ = assert_alike(kind, message(b"5", b"9223372036854775808"), [0])
        assert calls == [] and result == ("returned", 0)


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_a_seq_not_above_the_one_before_starts_a_run_of_its_own(kind):
    """Each run ascends (a redelivery, an old request's late reply starts the next run): the readers keep what is new
    in a run with a bisect."""
    seqs = (3, 5, 8, 5, 6, 2, 2, 9)
    if kind == "deliveries":
        data = b"".join(DELIVERY.replace(b".1.10.", b".1.%d." % seq) for seq in seqs)
    else:
        data = b"".join(direct_reply(seq, b"hello", pending=7) for seq in seqs)
    assert COMPILED is not None
    seen, rest = parsed(COMPILED, kind, [data])
    assert (seen, rest) == parsed(PURE, kind, [data])
    assert [len(run[1][-1 if kind == "direct" else -2]) - 1 for run in seen] == [3, 5, 6, 8]  # rows after each run
    assert seen[-1][1][-1 if kind == "direct" else -2] == [1, 3, 5, 8, 5, 6, 2, 2, 9]


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_a_callbacks_error_comes_through_alike(kind):
    data = DELIVERY if kind == "deliveries" else REPLY

    def failing(*args: object) -> None:
        raise KeyError("the callback's")

    for parsers in (PURE, COMPILED):
        assert parsers is not None
        buf = bytearray(data)
        with pytest.raises(KeyError, match="the callback's"):
            handler_maker(parsers, kind)(SID, target(kind, True), failing)(buf, memoryview(buf), 0)


@needs_compiled
def test_a_position_past_the_buffer_takes_nothing_and_a_negative_one_is_refused():
    assert_alike("deliveries", DELIVERY, [len(DELIVERY), len(DELIVERY) + 10])
    assert_alike("direct", REPLY, [len(REPLY), len(REPLY) + 10])
    assert COMPILED is not None
    buf = bytearray(DELIVERY)
    with pytest.raises(ValueError, match="must not be negative"):  # outside the seam's contract (the pure one wraps)
        COMPILED.deliveries_handler(SID, target("deliveries", False), print)(buf, memoryview(buf), -1)


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_rows_of_another_shape_are_refused(kind):
    """The compiled handlers append to bytearrays through the buffer protocol: anything else is a TypeError."""
    assert COMPILED is not None
    into = target(kind, True)
    into.rows.payload = b"immutable"  # type: ignore[assignment]
    buf = bytearray(DELIVERY if kind == "deliveries" else REPLY)
    with pytest.raises(TypeError, match="appends payload to a bytearray"):
        handler_maker(COMPILED, kind)(SID, into, print)(buf, memoryview(buf), 0)


@pytest.mark.skipif(not GUARDS, reason="guarded memory is made on Linux only")
def test_the_compiled_handlers_bytes_end_where_a_page_no_read_may_touch_begins():
    """What makes a read one byte past the end fault in the differential tests (a bytearray would hide it)."""
    for data in (b"", b"x", DELIVERY, b"y" * (3 * mmap.PAGESIZE + 5)):
        view = guarded(data)
        memory = _guarded[0]
        assert view.tobytes() == data and view.obj is memory.memory
        if data:
            start = ctypes.c_char.from_buffer(view)
            assert ctypes.addressof(start) + len(data) == memory.guard
            del start
        with open("/proc/self/maps") as maps:
            ranges = [line.split() for line in maps]
        permissions = [fields[1] for fields in ranges if _within(memory.guard, fields[0])]
        assert [flags[:3] for flags in permissions] == ["---"], permissions  # mapped, not readable nor writable


def _within(address: int, span: str) -> bool:
    low, high = (int(bound, 16) for bound in span.split("-"))
    return low <= address < high


@needs_compiled
@pytest.mark.parametrize("kind", KINDS)
def test_a_compiled_handler_and_its_callback_are_collected_in_a_cycle(kind):
    assert COMPILED is not None

    class Reader:
        def callback(self, *args: object) -> None:
            pass

    reader = Reader()
    reader.rows = RowBuffer(text_times=kind == "direct")  # type: ignore[attr-defined]
    reader.handler = handler_maker(COMPILED, kind)(SID, reader, reader.callback)  # type: ignore[attr-defined]
    gone = weakref.ref(reader)
    del reader
    gc.collect()
    assert gone() is None


# -- through the connection's parser ---------------------------------------------------------------------------------


class Client:
    """What ``FastParser`` talks to: the subscription's bulk handler of one implementation, its per-message handler,
    and another subscription, each recording what it got."""

    def __init__(self, parsers: BulkParsers, kind: Kind) -> None:
        self.seen: list[tuple] = []
        self.raw_handlers = {SID: self.raw}
        self.bulk_handlers = {SID: handler_maker(parsers, kind)(SID, target(kind, True), self.run)}

    def run(self, rows: RowBuffer, *args: object) -> None:
        self.seen.append(("run", columns(rows), *args))

    def raw(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.seen.append(("message", subject, reply, data, headers))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.seen.append(("other", sid, subject, reply, data, headers))


def parsed(parsers: BulkParsers, kind: Kind, chunks: list[bytes]) -> tuple[list[tuple], bytes]:
    """What the connection's parser hands over from ``chunks`` (one read each), and what it keeps for the next."""
    client = Client(parsers, kind)
    parser = FastParser(client)
    for chunk in chunks:
        step = parser.parse(chunk)
        with pytest.raises(StopIteration):  # nothing here waits: the messages are the bulk and raw handlers'
            step.send(None)
    return client.seen, bytes(parser.buf)


# -- which one is used -------------------------------------------------------------------------------------------


def test_the_variable_keeps_the_compiled_handlers_out_and_a_failed_import_leaves_the_pure_ones(monkeypatch):
    monkeypatch.setenv(protocol.NO_EXTENSIONS, "1")
    assert protocol._choose() == (PURE, "SPARK_JETSTREAM_NO_EXTENSIONS is set")
    monkeypatch.setenv(protocol.NO_EXTENSIONS, "0")
    assert protocol._choose()[0] == (COMPILED or PURE)
    monkeypatch.delenv(protocol.NO_EXTENSIONS)
    monkeypatch.setitem(sys.modules, "spark_jetstream.client._speedups", None)  # as where none was built
    monkeypatch.delattr(spark_jetstream.client, "_speedups", raising=False)
    parsers, why = protocol._choose()
    assert parsers == PURE and why.startswith("the compiled ones did not import")


def test_the_log_says_once_which_handlers_parse(monkeypatch, caplog):
    protocol._announce.cache_clear()
    caplog.set_level(logging.INFO, logger=protocol.__name__)
    for _ in range(3):
        protocol.deliveries_handler(SID, target("deliveries", False), print)
        protocol.direct_replies_handler(SID, b"S", target("direct", False), print)
    said = [record.getMessage() for record in caplog.records if "bulk handlers" in record.getMessage()]
    assert said == [
        f"spark-jetstream parses messages with its {protocol.BULK.name} bulk handlers"
        + (f" ({protocol._WHY})" if protocol._WHY else "")
    ]


def test_the_compiled_handlers_import_where_they_were_built():
    """A built extension that does not import (a wrong ABI, a missing symbol) would silently leave the pure path."""
    built = list(Path(protocol.__file__).parent.glob("_speedups*.so")) + list(
        Path(protocol.__file__).parent.glob("_speedups*.pyd")
    )
    if not built:
        pytest.skip("no compiled bulk handlers were built here")
    assert COMPILED is not None, WHY
