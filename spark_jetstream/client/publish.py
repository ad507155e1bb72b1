"""Pipelined JetStream publishing: many messages in flight, every PubAck checked.

Publishing one message and awaiting its PubAck caps out near 18k msg/s; core publishes without
acks can be dropped by a busy server. A ``Publisher`` keeps up to ``window`` messages ahead of
their PubAcks, with one wildcard reply subscription, and fails on the first error with the
subject and the server's reason. Successful PubAcks are counted a whole run at a time (the
protocol parser hands over every consecutive ``{"stream":..,"seq":..}`` reply it has in one
call); only an error or a status goes through the per-message handler.

Messages go out as ready-made ``PUB``/``HPUB`` protocol commands, many per socket write: the
Spark writer builds them for a whole Arrow record batch at once (vectorized), ``publish_all``
one by one. Either way each message's reply subject is ``<prefix>.<token>``, with tokens handed
out by ``Publisher.reserve``, so a failed PubAck can be traced back to its subject.
"""

from __future__ import annotations

import asyncio
import bisect
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.nats_client import RawClient
from spark_jetstream.client.protocol import HEADER_START, STATUS_PREFIX, BulkHandler, run_pattern, status_line
from spark_jetstream.errors import JetStreamError

Message = tuple[str, bytes, dict[str, str] | None]
"""(subject, payload, headers or None)."""

HeaderValue = str | Sequence[str] | None

MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
EXPECTED_SUBJECT_SEQ_HEADER = "Nats-Expected-Last-Subject-Sequence"
BATCH_ID_HEADER = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER = "Nats-Batch-Commit"

_STORED = rb'\{"stream":"[^"\\\r\n]*+"(?:,"[a-z_]++": ?+(?:"[^"\\\r\n]*+"|\d++|true))*+\}'
"""A PubAck that says stored (``{"stream":"S","seq":1}``, maybe a domain or ``"duplicate": true``)."""
_SEQ = re.compile(rb'"seq":(\d+)')
_STREAM = re.compile(rb'"stream":"([^"]*)"')
_DESCRIPTION = re.compile(rb'"description":"((?:[^"\\]|\\.)*)"')
_ERR_CODE = re.compile(rb'"err_code":(\d+)')
_HEADER_KEY = re.compile(r"^[!-9;-~]+$")  # printable ASCII without ':' and spaces, as the protocol needs


class PublishError(JetStreamError):
    """A message was not stored: the message names the subject and the server's reason."""


@dataclass
class PublishResult:
    """What a pipelined publish stored."""

    count: int = 0
    duplicates: int = 0
    first_seq: int = 0
    last_seq: int = 0
    streams: set[str] = field(default_factory=set)


def header_lines(headers: Mapping[str, HeaderValue] | Iterable[tuple[str, HeaderValue]]) -> bytes:
    """``Key: value`` lines of a NATS header block; a key with a list of values is repeated per value.

    Keys must be printable ASCII without ``:`` or spaces (the wire format has no escaping); line
    breaks in values become spaces, as nats-py does; a null value list adds no line.
    """
    items = headers.items() if isinstance(headers, Mapping) else headers
    lines = []
    for key, values in items:
        if not _HEADER_KEY.match(key or ""):
            raise PublishError(
                f"Header name {key!r} cannot be sent: NATS header names are printable ASCII without ':' or spaces."
            )
        for value in [values] if values is None or isinstance(values, str) else values:
            clean = (value or "").replace("\r", " ").replace("\n", " ")
            lines.append(f"{key}: {clean}\r\n".encode())
    return b"".join(lines)


def header_block(headers: Mapping[str, HeaderValue] | Iterable[tuple[str, HeaderValue]]) -> bytes:
    """A whole NATS header block (see ``header_lines``)."""
    return HEADER_START + header_lines(headers) + b"\r\n"


def command(subject: bytes, reply: bytes, payload: bytes, headers: bytes | None) -> bytes:
    """One ``PUB`` (or ``HPUB`` with a header block) protocol command."""
    if headers is None:
        return b"PUB %b %b %d\r\n%b\r\n" % (subject, reply, len(payload), payload)
    size = len(headers)
    return b"HPUB %b %b %d %d\r\n%b%b\r\n" % (subject, reply, size, size + len(payload), headers, payload)


def queue_commands(client: RawClient, commands: bytes | memoryview) -> None:
    """Ready ``PUB``/``HPUB`` commands onto the connection's write buffer: what ``Client.publish`` does, minus its
    per-message subject check and header encoding (the caller validated subjects and built the commands)."""
    client._pending.append(commands)
    client._pending_data_size += len(commands)


class Publisher:
    """Pipelined publishes over one connection; every method runs on the connection's loop thread.

    ``reserve`` tokens, build commands whose reply is ``reply_prefix + token``, ``send`` them,
    then ``finish`` waits for every PubAck and raises ``PublishError`` on any failure.
    """

    def __init__(
        self,
        conn: Connection,
        window: int = 2000,
        timeout: float = 30.0,
        seqs: bool = True,
        window_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.conn = conn
        self.seqs = seqs  # fill the result's seq range and streams (a cost per PubAck the sink skips)
        self.window = max(2, window)
        self.window_bytes = window_bytes
        self.timeout = timeout
        self.prefix = conn.client.new_inbox()
        self.reply_prefix = f"{self.prefix}.".encode()
        self.result = PublishResult()
        self.sent = 0
        self.outstanding = 0
        self.outstanding_bytes = 0
        self._sends: deque[tuple[int, int]] = deque()  # (messages sent up to its end, bytes) of each send not yet acked
        self.failures: list[str] = []
        self._next_token = 0
        self._subjects: deque[tuple[int, Callable[[int], str]]] = deque()  # (first token, offset -> subject)
        self._room = asyncio.Event()  # set when the window has room again (or something failed)
        self._idle = asyncio.Event()  # set when nothing is outstanding (or something failed)
        self._sid: int | None = None

    async def open(self) -> Publisher:
        _, self._sid = await self.conn.subscribe_raw(self._on_ack, f"{self.prefix}.*", self._stored_runs)
        return self

    async def close(self) -> None:
        if self._sid is not None:
            sid, self._sid = self._sid, None
            await self.conn.unsubscribe_raw(sid)

    def reserve(self, count: int, subject_of: Callable[[int], str]) -> int:
        """Hand out ``count`` consecutive reply tokens; ``subject_of(i)`` names the i-th one's subject."""
        first = self._next_token
        self._next_token += count
        self._subjects.append((first, subject_of))
        return first

    def subject_of(self, token: int) -> str:
        index = bisect.bisect_right(self._subjects, token, key=lambda item: item[0]) - 1
        if index < 0:
            return "?"
        first, lookup = self._subjects[index]
        return lookup(token - first)

    async def send(self, commands: bytes | memoryview, count: int) -> None:
        """Write ``count`` ready commands in one go once the window has room for them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        size = len(commands)
        while (
            self.outstanding
            and (self.outstanding + count > self.window or self.outstanding_bytes + size > self.window_bytes)
            and not self.failures
        ):
            self._room.clear()
            try:
                await asyncio.wait_for(self._room.wait(), max(0.01, deadline - loop.time()))
            except TimeoutError:
                raise self._timeout_error() from None
        self._raise_failures()
        client = self.conn.client
        if client.is_closed:
            raise PublishError(f"The connection to {self.conn.server_url} is closed: publishing stopped.")
        self.outstanding += count
        self.sent += count
        self.outstanding_bytes += size
        self._sends.append((self.sent, size))
        queue_commands(client, commands)
        if client._flush_queue is not None and client._flush_queue.empty():
            await client._flush_pending()

    async def finish(self) -> PublishResult:
        """Wait until every message sent has its PubAck; raise ``PublishError`` on any failure."""
        if self.outstanding and not self.failures:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), self.timeout)
            except TimeoutError:
                raise self._timeout_error() from None
        self._raise_failures()
        return self.result

    def _raise_failures(self) -> None:
        if self.failures:
            more = f" ({len(self.failures)} messages failed in all)" if len(self.failures) > 1 else ""
            raise PublishError(f"{self.failures[0]}{more}.")

    def _timeout_error(self) -> PublishError:
        return PublishError(
            f"{self.outstanding} of {self.sent} messages got no PubAck within {self.timeout:g}s (the last sent "
            f"was for {self.subject_of(self._next_token - 1)!r}): is the stream's leader available? Raise "
            "publishTimeout if the server is just slow."
        )

    def _stored_runs(self, sid: int) -> BulkHandler:
        """Bulk handler of the PubAck subscription: takes consecutive PubAcks that all say stored."""
        pattern = run_pattern(sid, _STORED)

        def take(buf: bytearray, view: memoryview, pos: int) -> int:
            if matched := pattern.match(buf, pos):
                run = bytes(view[pos : matched.end()])
                count = run.count(b"\r\n{")  # one per message: where its payload starts
                self._on_stored(count, run)
                self._acked(count)
                return matched.end()
            return pos

        return take

    def _on_stored(self, count: int, text: bytes) -> None:
        """``count`` PubAcks that say stored arrived; ``text`` holds them (seqs, streams, duplicates)."""
        result = self.result
        result.count += count
        result.duplicates += text.count(b'"duplicate"')
        if self.seqs and (seqs := [int(seq) for seq in _SEQ.findall(text)]):
            result.first_seq = min(result.first_seq or min(seqs), min(seqs))
            result.last_seq = max(result.last_seq, max(seqs))
            result.streams.update(stream.decode() for stream in _STREAM.findall(text))

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Raw handler of the PubAck subscription for what ``_stored_runs`` did not take."""
        if headers is not None and headers.startswith(STATUS_PREFIX):
            self._fail(subject, status_line(headers))
        elif b'"error"' in data:
            description = _DESCRIPTION.search(data)
            code = _ERR_CODE.search(data)
            reason = description.group(1).decode(errors="replace") if description else data.decode(errors="replace")
            self._fail(subject, f"{reason} (error {code.group(1).decode() if code else '?'})")
        else:  # stored, in a shape the run pattern does not know
            self._on_stored(1, data)
        self._acked(1)

    def _acked(self, count: int) -> None:
        """``count`` more PubAcks: a send's bytes are released once as many PubAcks came as were sent up to its
        end (a stream acks in order; PubAcks of several streams may interleave, which only delays the release)."""
        self.outstanding -= count
        acked, sends, subjects = self.sent - self.outstanding, self._sends, self._subjects
        while sends and sends[0][0] <= acked:
            self.outstanding_bytes -= sends.popleft()[1]
        while len(subjects) > 1 and subjects[1][0] <= acked:  # acked: only a stream acking out of order names them
            subjects.popleft()
        if (self.outstanding <= self.window // 2 and self.outstanding_bytes <= self.window_bytes // 2) or self.failures:
            self._room.set()
            if not self.outstanding or self.failures:
                self._idle.set()

    def _fail(self, ack_subject: bytes, reason: str) -> None:
        token = ack_subject[len(self.reply_prefix) :]
        sent_to = self.subject_of(int(token)) if token.isdigit() else "?"
        if reason.startswith("503"):
            reason = f"{reason}: no stream captures this subject (create one, or fix the subject)"
        self.failures.append(f"Publishing to {sent_to!r} failed: {reason}")


def publish_all(
    conn: Connection, messages: Iterable[Message], window: int = 2000, timeout: float = 30.0
) -> PublishResult:
    """Publish every message with acks pipelined ``window`` deep; raise ``PublishError`` on any failure."""
    return conn.run(_publish_all(conn, messages, window, timeout))


async def _publish_all(conn: Connection, messages: Iterable[Message], window: int, timeout: float) -> PublishResult:
    publisher = await Publisher(conn, window, timeout).open()
    chunk, chunk_bytes = max(1, publisher.window // 2), publisher.window_bytes // 2
    max_payload = conn.client.max_payload
    try:
        commands: list[bytes] = []
        subjects: list[str] = []
        size = 0
        for subject, payload, headers in messages:
            if not subject or any(c in subject for c in " \t\r\n"):
                raise PublishError(f"Cannot publish to {subject!r}: a subject is not empty and has no whitespace.")
            block = header_block(headers) if headers else None
            if len(payload) + len(block or b"") > max_payload:
                raise PublishError(
                    f"A message for {subject!r} has {len(payload):,} bytes, more than the server's max_payload "
                    f"({max_payload:,}): split it or raise max_payload."
                )
            reply = publisher.reply_prefix + str(publisher._next_token + len(commands)).encode()
            commands.append(command(subject.encode(), reply, payload, block))
            subjects.append(subject)
            size += len(commands[-1])
            if len(commands) >= chunk or size >= chunk_bytes:
                await _send_chunk(publisher, commands, subjects)
                commands, subjects, size = [], [], 0
        if commands:
            await _send_chunk(publisher, commands, subjects)
        return await publisher.finish()
    finally:
        await publisher.close()


async def _send_chunk(publisher: Publisher, commands: list[bytes], subjects: list[str]) -> None:
    publisher.reserve(len(commands), subjects.__getitem__)
    await publisher.send(b"".join(commands), len(commands))
