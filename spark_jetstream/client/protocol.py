"""A leaner parser for the NATS wire protocol's message lines, in front of nats-py's.

nats-py's parser matches a regular expression per protocol line, copies the line out of its
buffer and awaits a coroutine per message; profiles of the pull reader and the writer (PubAcks)
put about half of the client's time there. This parser handles ``MSG`` and ``HMSG`` with plain
``find``/``split`` over one buffer pass and calls the raw handlers of the connector's
subscriptions directly. Every other line (``PING``, ``PONG``, ``+OK``, ``-ERR``, ``INFO``) is rare
and goes to nats-py's own parser, as do messages of ordinary nats-py subscriptions.

A subscription may also have a *bulk handler* that takes its consecutive messages straight
from the read buffer and says where it stopped: the pull reader parses its deliveries in one
tight loop, the writer counts a whole run of PubAcks with one regex match (``run_pattern``).
What a bulk handler leaves (a status, an error) goes to the subscription's per-message handler.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from nats.errors import ProtocolError
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

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

    async def parse(self, data: bytes = b"") -> None:
        if self.state != AWAITING_CONTROL_LINE:  # nats-py's parser stopped inside a message
            await super().parse(data)
            return
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
                    view.release()
                    del buf[:pos]
                    pos = 0
                    await super().parse()
                    return
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


def wire(sid: int, subject: bytes, reply: bytes, payload: bytes, headers: bytes | None) -> bytes:
    """One message as the server sends it (for handing a message nats-py parsed to a bulk handler)."""
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

_VERBS = (b"MSG", b"HMSG")  # a message's protocol line without and with headers

Deliver = Callable[[bytes, memoryview, int, int, "memoryview | None", bool], None]
"""``deliver(subject, payload, seq, stamp_ns, headers, drained)`` for one delivery: ``headers`` is its header block
(None without), ``drained`` whether the server counted nothing more pending for the consumer."""


def deliveries_handler(sid: int, deliver: Deliver, counted: Callable[[int], None]) -> BulkHandler:
    """The bulk handler of a pull inbox: runs of JetStream deliveries parsed straight from the read buffer, one
    ``deliver`` call each and one ``counted(n)`` per run, with nothing else per message (the hot path of both
    consumer readers). It stops at anything that is not a delivery to subscription ``sid`` (a status goes to the
    per-message handler) and at a message not yet complete."""
    own = b"%d" % sid

    def take(buf: bytearray, view: memoryview, pos: int) -> int:
        taken = 0
        while True:
            eol = buf.find(_CRLF, pos)
            if eol < 0:
                break
            # HMSG <subject> <sid> <reply> <header size> <size> / MSG <subject> <sid> <reply> <size>
            args = bytes(view[pos:eol]).split()
            headed = len(args) == 6
            if (len(args) != 5 and not headed) or args[0] != _VERBS[headed] or args[2] != own:
                break
            if not args[3].startswith(JS_ACK_PREFIX):
                break
            try:
                header_size, size = (int(args[4]), int(args[5])) if headed else (0, int(args[4]))
            except ValueError:
                break  # malformed: the parser reports it
            start = eol + 2
            end = start + size
            if end + 2 > len(buf) or not 0 <= header_size <= size:
                break
            pos = end + 2
            taken += 1
            tokens = args[3].split(b".")
            base = 2 if len(tokens) >= 11 else 0
            deliver(
                args[1],
                view[start + header_size : end],
                int(tokens[5 + base]),
                int(tokens[7 + base]),
                view[start : start + header_size] if header_size else None,
                tokens[8 + base] == b"0",
            )
        if taken:
            counted(taken)
        return pos

    return take
