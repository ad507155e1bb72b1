"""A leaner parser for the NATS wire protocol's message lines, in front of nats-py's.

nats-py's parser matches a regular expression per protocol line, copies the line out of its
buffer and awaits a coroutine per message; profiles of the pull reader and the writer (PubAcks)
put about half of the client's time there. This parser handles ``MSG`` and ``HMSG`` with plain
``find``/``split`` over one buffer pass and calls the raw handlers of the connector's
subscriptions directly. Every other line (``PING``, ``PONG``, ``+OK``, ``-ERR``, ``INFO``) is rare
and goes to nats-py's own parser, one line at a time; messages of ordinary nats-py subscriptions go to the client's
``_process_msg``.

A subscription may also have a *bulk handler* that takes its consecutive messages straight
from the read buffer and says where it stopped: the pull reader parses its deliveries in one
tight loop, the writer counts a whole run of PubAcks with one regex match (``run_pattern``).
What a bulk handler leaves (a status, an error) goes to the subscription's per-message handler.

The bulk handlers of the readers' hot paths (``deliveries_handler``, ``direct_replies_handler``) exist twice: in pure
Python here (the reference, always there) and compiled (``_speedups.c``, built at install where a C compiler is), which
is used when it imports and ``SPARK_JETSTREAM_NO_EXTENSIONS`` is not set (decision 0029). They append each run straight
to the buffers of the rows' columns (``Columns``), no object per message (decision 0033). Both append the same bytes,
hand their callbacks the same arguments and stop at the same place, for any bytes (``tests/test_speedups.py``).
"""

from __future__ import annotations

import logging
import os
import re
from array import array
from collections.abc import Callable
from functools import cache
from itertools import accumulate, islice
from typing import Any, NamedTuple, Protocol

from nats.errors import ProtocolError
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

log = logging.getLogger(__name__)

RawHandler = Callable[[bytes, bytes, bytes, bytes | None], None]
"""(subject, reply, payload, header block or None), called on the loop thread."""

BulkHandler = Callable[[bytearray, memoryview, int], int]
"""(buffer, a view of it, position of a ``MSG``/``HMSG`` line of its subscription) -> the position
after the whole messages it took from there (the same position: it took none)."""

_CRLF = b"\r\n"


def run_pattern(sid: int, payload: bytes) -> re.Pattern[bytes]:
    """One or more consecutive ``MSG`` of subscription ``sid`` (no reply) whose payload matches ``payload``.

    ``payload`` must not match a line break, so each match ends exactly at a message's end: a
    bulk handler can take a whole run of such messages with one ``match``.
    """
    return re.compile(rb"(?:MSG [^ \r\n]++ %d \d++\r\n(?:%b)\r\n)++" % (sid, payload))  # possessive: no backtracking


class FastParser(Parser):
    """``Parser`` whose hot path skips regexes and per-message awaits (see module doc).

    ``nc`` must have ``raw_handlers`` and ``bulk_handlers`` dicts (sid -> ``RawHandler`` /
    ``BulkHandler``).
    """

    def __init__(self, nc: Any = None) -> None:
        super().__init__(nc)
        self.lines = Parser(nc)  # nats-py's, for the other lines (``_control``)

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        handlers: dict[int, RawHandler] = self.nc.raw_handlers
        bulks: dict[int, BulkHandler] = self.nc.bulk_handlers
        pos, size = 0, len(buf)
        view = memoryview(buf)  # slices of a memoryview copy once, slices of a bytearray twice
        try:
            while pos < size:
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    return
                if buf.startswith(b"MSG ", pos):
                    headed = False
                elif buf.startswith(b"HMSG ", pos):
                    headed = True
                else:
                    line, pos = bytes(view[pos : eol + 2]), eol + 2
                    await self._control(line)
                    if self.buf is not buf:  # reset meanwhile (a reconnect): the rest is the old connection's
                        return
                    continue
                args = bytes(view[pos:eol]).split()
                fields = len(args) - headed  # MSG <subject> <sid> [reply] <size>; HMSG has <header size> too
                try:
                    if fields not in (4, 5):
                        raise ValueError
                    subject, sid, reply = args[1], int(args[2]), args[3] if fields == 5 else b""
                    header_size, total = (int(args[-2]), int(args[-1])) if headed else (0, int(args[-1]))
                    if not 0 <= header_size <= total:
                        raise ValueError
                except ValueError:
                    raise ProtocolError("nats: malformed MSG") from None
                if bulks and sid in bulks and (taken := bulks[sid](buf, view, pos)) != pos:
                    pos = taken
                    continue
                start = eol + 2
                end = start + total
                if end + 2 > size:
                    return  # the message is not all here yet: parse its line again next time
                if headed:
                    headers: bytes | None = bytes(view[start : start + header_size])
                    payload = bytes(view[start + header_size : end])
                else:
                    headers, payload = None, bytes(view[start:end])
                pos = end + 2
                handler = handlers.get(sid)
                if handler is not None:
                    handler(subject, reply, payload, headers)
                else:
                    await self.nc._process_msg(sid, subject, reply, payload, headers)
        finally:
            view.release()
            if pos:
                del buf[:pos]

    async def _control(self, line: bytes) -> None:
        """A line other than a message's (``PING``, ``PONG``, ``+OK``, ``-ERR``, ``INFO``), whole, handed to nats-py's
        parser alone: given the buffer, it would parse the messages after the line too, one await each."""
        lines = self.lines
        lines.reset()  # nothing left from a line whose handler raised
        await lines.parse(line)
        if lines.buf or lines.state != AWAITING_CONTROL_LINE:  # a line it does not know, or a message line it does
            raise ProtocolError("nats: unknown protocol")


def wire(sid: int, subject: bytes, reply: bytes, payload: bytes, headers: bytes | None) -> bytes:
    """One message as the server sends it (the parser benchmark and the tests make the server's bytes with it)."""
    reply_field = reply + b" " if reply else b""
    if headers is None:
        return b"MSG %b %d %b%d\r\n%b\r\n" % (subject, sid, reply_field, len(payload), payload)
    size = len(headers)
    return b"HMSG %b %d %b%d %d\r\n%b%b\r\n" % (subject, sid, reply_field, size, size + len(payload), headers, payload)


HEADER_START = b"NATS/1.0\r\n"
"""The first line of a header block without a status (what a publish with headers sends)."""

STATUS_PREFIX = b"NATS/1.0 "
"""How a status message's header block starts (``NATS/1.0 408 Request Timeout``); a plain block has no space."""

PIN_HEADER_NAME = "Nats-Pin-Id"
"""The header the server adds to a pinned delivery: the pin id the next pulls carry."""
PIN_HEADER = PIN_HEADER_NAME.encode() + b":"


def status_line(headers: bytes) -> str:
    """``b"NATS/1.0 408 Request Timeout\\r\\n..."`` -> ``"408 Request Timeout"``."""
    return headers[len(STATUS_PREFIX) :].split(_CRLF, 1)[0].decode(errors="replace")


def status_of(headers: bytes) -> tuple[int, str]:
    """``b"NATS/1.0 408 Request Timeout\\r\\n..."`` -> ``(408, "Request Timeout")``."""
    code, _, description = status_line(headers).partition(" ")
    return (int(code) if code.isdigit() else 0), description.strip()


def header_value(headers: bytes, name: bytes) -> str | None:
    """The value of the first header ``name`` (given with its colon) in a raw header block, or None."""
    start = headers.find(name)
    if start < 0:
        return None
    end = headers.find(_CRLF, start)
    return headers[start + len(name) : end].strip().decode()


def header_fields(block: bytes) -> list[tuple[str, str]]:
    """A raw header block -> its ``(key, value)`` lines in order, repeated keys kept (the status line is skipped)."""
    fields = []
    for line in block.decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep and key:
            fields.append((key, value.strip()))
    return fields


JS_ACK_PREFIX = b"$JS.ACK."
"""How a JetStream delivery's reply subject starts: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.
<pending>``, or the 11+ token form with domain and account hash after ``$JS.ACK.``."""


class Columns(Protocol):
    """Where a bulk handler appends the rows of a run: the buffers of a batch's columns (``read.rows.RowBuffer``),
    texts back to back in a ``bytearray`` with each one's end in an ``array("i")``, numbers in an ``array("q")``. A
    buffer whose ``header_ends`` is None keeps no header blocks; one whose ``time_ends`` is None keeps times as ns
    (deliveries), else as RFC 3339 text (Direct Get replies)."""

    subjects: bytearray
    subject_ends: array
    payload: bytearray
    offsets: array
    seqs: array
    times: array | bytearray
    time_ends: array | None
    headers: bytearray | None
    header_ends: array | None


class Target(Protocol):
    """What a bulk handler appends to: its ``rows``, read at each call (``read.rows.RowBatches``)."""

    rows: Columns


Deliver = Callable[[Columns, int, "bytes | None", int], None]
"""``deliver(rows, first, header, drained)`` after a run of deliveries was appended to ``rows`` from row ``first`` on,
seqs ascending: ``header`` the run's first header block (the pin id is in it; None: none had one), ``drained`` the
index in the run of the first the server counted nothing more pending after (the run's length: none)."""

Keep = Callable[[Columns, int, "bytes | None"], None]
"""``keep(rows, first, pending)`` after a run of Direct Get replies was appended to ``rows`` from row ``first`` on, seqs
ascending: ``pending`` the last one's ``Nats-Num-Pending`` (None: the server sent none)."""

TOO_LARGE = "a run would take a record batch's column past 2 GiB (its offsets are 32-bit)"
_MAX_SEQ = 2**63 - 1
"""The largest seq or time a run holds (an ``array("q")``): a delivery with a larger one ends the run before it."""

_TOKEN = rb"[^ .\r\n]++"


def _append(texts: list[tuple[bytearray, array, list]], numbers: list[tuple[array, list[int]]]) -> None:
    """A run's columns onto a ``Columns``: each text column's pieces back to back onto its values and each one's end
    onto its ends (none appended when an end is past what 32-bit ends hold), then the numbers."""
    counts = [len(ends) for _, ends, _ in texts]
    try:
        for values, ends, pieces in texts:
            ends.extend(islice(accumulate(map(len, pieces), initial=len(values)), 1, None))
    except OverflowError:  # an array("i") refuses an end past 2**31 - 1
        for (_, ends, _), count in zip(texts, counts, strict=True):
            del ends[count:]
        raise OverflowError(TOO_LARGE) from None
    for values, _, pieces in texts:
        values += b"".join(pieces)
    for values, items in numbers:
        values.extend(items)


def _delivery_patterns(sid: int) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """One delivery's protocol line to subscription ``sid``: subject, stream seq, stamp, pending, header size (HMSG
    only), size. Its reply is ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>`` (the first
    pattern: no backtracking, the usual form), or with domain and account hash first and maybe a random token last
    (the second)."""
    numbers = rb"\d++\.(\d++)\.\d++\.(\d++)\.(\d++)"
    sizes = rb" (?:(\d++) )?(\d++)\r\n"
    line = rb"H?MSG ([^ \r\n]++) %d \$JS\.ACK\." % sid
    names = rb"%b\." % _TOKEN
    return (
        re.compile(line + names * 2 + numbers + sizes),
        re.compile(line + names * 4 + numbers + rb"(?:\.%b)?" % _TOKEN + sizes),
    )


def deliveries_handler_py(sid: int, target: Target, deliver: Deliver) -> BulkHandler:
    """The bulk handler of a pull inbox: runs of JetStream deliveries parsed straight from the read buffer, one
    regex match each, appended to ``target.rows`` and handed to ``deliver`` as one run (the hot path of both
    consumer readers: decisions 0011 and 0033). It stops at anything that is not a delivery to subscription ``sid``
    (a status goes to the per-message handler), at a message not yet complete, and before a delivery whose seq is
    not above the one before it (a redelivery starts a run of its own: each run ascends) or whose seq or time does
    not fit in 64 bits. Header blocks are kept where the rows keep them. The pure-Python implementation:
    ``deliveries_handler`` is this or its compiled twin."""
    usual, other = (pattern.match for pattern in _delivery_patterns(sid))

    def take(buf: bytearray, view: memoryview, pos: int) -> int:
        size = len(buf)
        rows = target.rows
        keep_headers = rows.header_ends is not None
        subjects: list[bytes] = []
        payloads: list[memoryview] = []
        seqs: list[int] = []
        stamps: list[int] = []
        blocks: list[memoryview] = []
        header = None
        drained = -1
        prior = -1
        try:
            while (found := usual(buf, pos) or other(buf, pos)) is not None:
                subject, seq_text, stamp_text, pending, header_size, total = found.groups()
                start = found.end()
                end = start + int(total)
                headed = buf[pos] == 72  # HMSG
                if end + 2 > size or (header_size is None) == headed:
                    break  # not all here yet, or malformed (the parser reports it)
                payload_start = start + int(header_size) if headed else start
                seq, stamp = int(seq_text), int(stamp_text)
                if payload_start > end or not prior < seq <= _MAX_SEQ >= stamp:
                    break
                if headed and header is None:
                    header = bytes(view[start:payload_start])
                if keep_headers:
                    blocks.append(view[start:payload_start])
                subjects.append(subject)
                payloads.append(view[payload_start:end])
                seqs.append(seq)
                stamps.append(stamp)
                if pending == b"0" and drained < 0:
                    drained = len(seqs) - 1
                prior = seq
                pos = end + 2
        except ValueError:  # a number longer than int() converts: the run ends before its delivery
            pass
        if seqs:
            first = len(rows.seqs)
            texts = [(rows.subjects, rows.subject_ends, subjects), (rows.payload, rows.offsets, payloads)]
            if keep_headers:
                texts.append((rows.headers, rows.header_ends, blocks))  # type: ignore[arg-type]
            _append(texts, [(rows.seqs, seqs), (rows.times, stamps)])  # type: ignore[list-item]
            deliver(rows, first, header, drained if drained >= 0 else len(seqs))
        return pos

    return take


DIRECT_HEADERS = b"\r\nNats-Stream: "
"""Where the server's headers start in a Direct Get reply's header block: it appends them after the message's own."""

_DIRECT_REPLY = (
    rb"HMSG [^ \r\n]++ %d (\d++) (\d++)\r\n"  # <inbox> <sid> <header size> <size>
    rb"NATS/1\.0\r\n(?:[^\r\n]*+\r\n)*?"  # the message's own headers, if any (a status has a code: no match)
    rb"Nats-Stream: %s\r\nNats-Subject: ([^\r\n]++)\r\nNats-Sequence: (\d++)\r\n"
    rb"Nats-Time-Stamp: ([^\r\n]++)\r\n(?:Nats-Num-Pending: (\d++)\r\n)?(?:Nats-Last-Sequence: \d++\r\n)?\r\n"
)
"""One Direct Get reply to subscription ``%d`` from stream ``%s`` up to its payload, as nats-server 2.11-2.15 writes it:
the protocol line, then the server's headers after the message's own; the blank line that ends a header block can only
be its end. A reply it does not match exactly (one from a mirror: it names the mirror) goes to the per-message
handler."""


def direct_replies_handler_py(sid: int, stream: bytes, target: Target, keep: Keep) -> BulkHandler:
    """The bulk handler of a Direct Get inbox for ``stream``: runs of its replies parsed straight from the read
    buffer, one regex match each, appended to ``target.rows`` (times as the server's RFC 3339 text; where the rows
    keep header blocks, each reply's own) and handed to ``keep`` as one run (decisions 0011 and 0033). It stops at
    anything else (a status, a reply it does not recognise, another subscription's message), at a reply not yet
    complete, at one whose sizes disagree with its header block (the per-message path then has it, by its sizes), at
    one from another stream (a mirror answers its origin's Direct Gets with what it holds) and before one whose seq is
    not above the one before it or does not fit in 64 bits. The pure-Python implementation: ``direct_replies_handler``
    is this or its compiled twin."""
    match = re.compile(_DIRECT_REPLY % (sid, re.escape(stream))).match
    no_headers = len(HEADER_START)  # a block up to the server's headers this long: the message had none

    def take(buf: bytearray, view: memoryview, pos: int) -> int:
        size = len(buf)
        rows = target.rows
        keep_headers = rows.header_ends is not None
        subjects: list[bytes] = []
        payloads: list[memoryview] = []
        seqs: list[int] = []
        stamps: list[bytes] = []
        blocks: list[bytes] = []
        pending = None
        prior = -1
        try:
            while (found := match(buf, pos)) is not None:
                header_size, total, subject, seq_text, stamp, last_pending = found.groups()
                start, header_end = found.end(2) + 2, found.end()  # the header block's start and end
                end = start + int(total)
                if header_end - start != int(header_size) or end < header_end or end + 2 > size or buf[end] != 13:
                    break  # sizes that disagree with the block (the per-message path reads by sizes), or not all here
                seq = int(seq_text)
                if not prior < seq <= _MAX_SEQ:
                    break
                pos = end + 2
                pending = last_pending
                subjects.append(subject)
                payloads.append(view[header_end:end])
                seqs.append(seq)
                stamps.append(stamp)
                if keep_headers:  # the message's own headers: what comes before the server's (empty: none)
                    own_end = buf.rfind(DIRECT_HEADERS, start, header_end) + 2
                    blocks.append(bytes(view[start:own_end]) + b"\r\n" if own_end > start + no_headers else b"")
                prior = seq
        except ValueError:  # a number longer than int() converts: the run ends before its reply
            pass
        if seqs:
            first = len(rows.seqs)
            texts = [(rows.subjects, rows.subject_ends, subjects), (rows.payload, rows.offsets, payloads)]
            if keep_headers:
                texts.append((rows.headers, rows.header_ends, blocks))  # type: ignore[arg-type]
            texts.append((rows.times, rows.time_ends, stamps))  # type: ignore[arg-type]
            _append(texts, [(rows.seqs, seqs)])
            keep(rows, first, pending)
        return pos

    return take


class BulkParsers(NamedTuple):
    """One implementation of the bulk handlers of the readers' hot paths."""

    name: str
    deliveries_handler: Callable[[int, Target, Deliver], BulkHandler]
    direct_replies_handler: Callable[[int, bytes, Target, Keep], BulkHandler]


PURE = BulkParsers("pure-Python", deliveries_handler_py, direct_replies_handler_py)

NO_EXTENSIONS = "SPARK_JETSTREAM_NO_EXTENSIONS"
"""The environment variable that, set to anything but ``0`` when the connector is imported, keeps the compiled bulk
handlers out (as ``AIOHTTP_NO_EXTENSIONS`` does aiohttp's)."""


def compiled_parsers() -> tuple[BulkParsers | None, str]:
    """The compiled bulk handlers (``_speedups``) when they import, and why not when they do not."""
    try:
        from spark_jetstream.client import _speedups
    except ImportError as exc:
        return None, f"the compiled ones did not import: {exc}"
    return BulkParsers("compiled", _speedups.deliveries_handler, _speedups.direct_replies_handler), ""


def _choose() -> tuple[BulkParsers, str]:
    if os.environ.get(NO_EXTENSIONS, "") not in ("", "0"):
        return PURE, f"{NO_EXTENSIONS} is set"
    compiled, why = compiled_parsers()
    return (compiled, "") if compiled is not None else (PURE, why)


BULK, _WHY = _choose()
"""The bulk handlers in use (the tests swap it to run one suite over both)."""


@cache
def _announce(name: str) -> None:
    """Say once per process which bulk handlers parse (the first time a reader asks for one)."""
    why = f" ({_WHY})" if _WHY and name == PURE.name else ""
    log.info("spark-jetstream parses messages with its %s bulk handlers%s", name, why)


def deliveries_handler(sid: int, target: Target, deliver: Deliver) -> BulkHandler:
    """``deliveries_handler_py``'s handler, compiled or pure (``BULK``)."""
    _announce(BULK.name)
    return BULK.deliveries_handler(sid, target, deliver)


def direct_replies_handler(sid: int, stream: bytes, target: Target, keep: Keep) -> BulkHandler:
    """``direct_replies_handler_py``'s handler, compiled or pure (``BULK``)."""
    _announce(BULK.name)
    return BULK.direct_replies_handler(sid, stream, target, keep)


def unreadable_delivery(what: str, reply: bytes) -> str:
    """The error for a delivery whose reply subject ``deliveries_handler`` does not know (a newer server's form):
    failing the read beats leaving the message out."""
    return (
        f"{what} got a delivery whose reply subject it cannot read ({reply.decode(errors='replace')!r}); "
        "this nats-server's delivery format is newer than this connector: upgrade spark-jetstream."
    )
