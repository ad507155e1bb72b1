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
out by ``Publisher.reserve``, so a failed PubAck can be traced back to its subject, and the PubAcks
that came are known token by token. Messages that all carry a ``Nats-Msg-Id`` are sent again when no
PubAck came for ``RESEND_AFTER`` s (a stream leader that froze or died swallowed them; the connection's
server went silent): the stream stores each once (decision 0026). While nothing answers only the oldest one owed goes
out again, a probe every ``RESEND_AFTER`` s; once PubAcks come again, each message still owed goes out once more.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spark_jetstream.client.connection import ATTEMPT_TIMEOUT, Connection
from spark_jetstream.client.nats_client import RawClient
from spark_jetstream.client.protocol import HEADER_START, STATUS_PREFIX, BulkHandler, run_pattern, status_line
from spark_jetstream.client.retry import captured
from spark_jetstream.errors import JetStreamError

log = logging.getLogger(__name__)

RESEND_AFTER = ATTEMPT_TIMEOUT
"""Seconds without any PubAck, while some are owed, after which messages that carry a ``Nats-Msg-Id`` are sent again
(a stream acks within milliseconds; one whose leader froze or died swallowed what was sent to it)."""
IN_PROCESS = b'"err_code":10158'
"""A PubAck error for a message sent again while the stream still works on the first one (``duplicate message id is
in process``): the first one's PubAck will answer for both."""

Message = tuple[str, bytes, dict[str, str] | None]
"""(subject, payload, headers or None)."""

HeaderValue = str | Sequence[str] | None

MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
EXPECTED_SUBJECT_SEQ_HEADER = "Nats-Expected-Last-Subject-Sequence"
BATCH_ID_HEADER = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER = "Nats-Batch-Commit"
ROLLUP_HEADER = "Nats-Rollup"

_STORED = rb'\{"stream":"[^"\\\r\n]*+"(?:,"[a-z_]++": ?+(?:"[^"\\\r\n]*+"|\d++|true))*+\}'
"""A PubAck that says stored (``{"stream":"S","seq":1}``, maybe a domain or ``"duplicate": true``)."""
_SEQ = re.compile(rb'"seq":(\d+)')
_STREAM = re.compile(rb'"stream":"([^"]*)"')
_DESCRIPTION = re.compile(rb'"description":"((?:[^"\\]|\\.)*)"')
_ERR_CODE = re.compile(rb'"err_code":(\d+)')
_NO_RESPONDERS = STATUS_PREFIX + b"503"
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
    then ``finish`` waits for every PubAck and raises ``PublishError`` on any failure. Tokens are handed out and
    sent in order, so a send's tokens follow the previous send's. With ``resend`` (every message carries a
    ``Nats-Msg-Id``), the sends not yet wholly acked go out again after ``RESEND_AFTER`` s without a PubAck; a
    PubAck for a token that has one already is ignored.
    """

    def __init__(
        self,
        conn: Connection,
        window: int = 2000,
        timeout: float = 30.0,
        seqs: bool = True,
        window_bytes: int = 32 * 1024 * 1024,
        resend: bool = False,
    ) -> None:
        self.conn = conn
        self.seqs = seqs  # fill the result's seq range and streams (a cost per PubAck the sink skips)
        self.window = max(2, window)
        self.window_bytes = window_bytes
        self.timeout = timeout
        self.resend = resend
        self.prefix = conn.client.new_inbox()
        self.reply_prefix = f"{self.prefix}.".encode()
        self.result = PublishResult()
        self.sent = 0
        self.outstanding_bytes = 0
        self.resent = 0  # messages sent again
        self._stalled = False  # the oldest message owed went out again, and no PubAck came since
        self._catching_up: asyncio.Task[None] | None = None
        self._floor = 0  # every token below it has its PubAck
        self._ahead: set[int] = set()  # tokens at or above the floor with their PubAck (acks out of order)
        # (first token, end token, bytes, the commands while they may be sent again) of each send not wholly acked
        self._sends: deque[tuple[int, int, int, bytes | memoryview | None]] = deque()
        self.failures: list[str] = []
        self._next_token = 0
        self._subjects: deque[tuple[int, Callable[[int], str]]] = deque()  # (first token, offset -> subject)
        self._room = asyncio.Event()  # set when the window has room again (or something failed)
        self._idle = asyncio.Event()  # set when nothing is outstanding (or something failed)
        self._sid: int | None = None
        self.not_taken = 0  # answers 503, no responders: no stream took the message (``_not_taken``)
        self._capture_check: asyncio.Future[None] | None = None
        # a run's PubAcks one by one: (token, PubAck) (the run pattern keeps each PubAck on one line)
        self._acks_in = re.compile(rb"MSG %b(\d++) [^\r\n]*+\r\n([^\r\n]*+)\r\n" % re.escape(self.reply_prefix))

    @property
    def outstanding(self) -> int:
        """Messages sent that have no PubAck yet."""
        return self.sent - self._floor - len(self._ahead)

    async def open(self) -> Publisher:
        _, self._sid = await self.conn.subscribe_raw(self._on_ack, f"{self.prefix}.*", self._stored_runs)
        return self

    async def close(self) -> None:
        if self._capture_check is not None:
            self._capture_check.cancel()
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
        """Write ``count`` ready commands (the next ``count`` tokens) in one go once the window has room."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        size = len(commands)
        while (
            self.outstanding
            and (self.outstanding + count > self.window or self.outstanding_bytes + size > self.window_bytes)
            and not self.failures
        ):
            self._room.clear()
            await self._wait(self._room, deadline)
        self._raise_failures()
        client = self.conn.client
        if client.is_closed:
            raise PublishError(f"The connection to {self.conn.server_url} is closed: publishing stopped.")
        self._sends.append((self.sent, self.sent + count, size, commands if self.resend else None))
        self.sent += count
        self.outstanding_bytes += size
        queue_commands(client, commands)
        if client._flush_queue is not None and client._flush_queue.empty():
            await client._flush_pending()

    async def _wait(self, event: asyncio.Event, deadline: float) -> None:
        """Wait for ``event`` until ``deadline`` (loop time); with ``resend``, every ``RESEND_AFTER`` s without a
        PubAck the oldest message owed goes out again (``_send_again``)."""
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._timeout_error()
            answered = self._floor + len(self._ahead)
            try:
                wait = min(remaining, RESEND_AFTER) if self.resend else remaining
                await asyncio.wait_for(event.wait(), wait)
                return
            except TimeoutError:
                if self.resend and answered == self._floor + len(self._ahead) and loop.time() < deadline:
                    await self._send_again()

    async def _send_again(self) -> None:
        """Nothing answered for a while: a stream leader froze or died, or the connection moved. Only the oldest
        message owed goes out again (a probe: sending the whole window into a leader that swallows it again is
        traffic for nothing, 2.2-3.9 publishes a row through an 8 s freeze); the others go out once PubAcks come again
        (``_catch_up``)."""
        if not self._sends or self._sends[0][3] is None:
            return
        first, _, _, commands = self._sends[0]
        probe = _split(commands)[self._floor - first]
        log.info(
            "No PubAck for %.1f s from %s: sending the oldest message owed again with its msg id (a stream leader "
            "froze or died, or the connection moved; %d owed)",
            RESEND_AFTER,
            self.conn.server_url,
            self.outstanding,
        )
        self._stalled = True
        self.resent += 1
        await self._queue([probe])

    async def _queue(self, commands: list[bytes | memoryview]) -> None:
        client = self.conn.client
        for part in commands:
            queue_commands(client, part)
        if client._flush_queue is not None and client._flush_queue.empty():
            await client._flush_pending()

    def _catch_up(self) -> None:
        """PubAcks came again after a stall: every message still owed goes out once more (what the stalled leader
        swallowed; one that its PubAck was on the way for is a duplicate the stream drops)."""
        self._stalled = False
        owed: list[bytes | memoryview] = []
        for first, end, _, commands in self._sends:
            if commands is None:
                continue
            if first >= self._floor and not any(first <= token < end for token in self._ahead):
                owed.append(commands)  # none of it answered: as sent
                continue
            owed += [
                part
                for token, part in enumerate(_split(commands), first)
                if token >= self._floor and token not in self._ahead
            ]
        if owed:
            self.resent += sum(1 for part in owed for _ in _split(part))
            self._catching_up = asyncio.ensure_future(self._queue(owed))

    async def finish(self) -> PublishResult:
        """Wait until every message sent has its PubAck; raise ``PublishError`` on any failure."""
        if self.outstanding and not self.failures:
            self._idle.clear()
            await self._wait(self._idle, asyncio.get_running_loop().time() + self.timeout)
        self._raise_failures()
        return self.result

    def _raise_failures(self) -> None:
        if self.failures:
            more = f" ({len(self.failures)} messages failed in all)" if len(self.failures) > 1 else ""
            raise PublishError(f"{self.failures[0]}{more}.")

    def _timeout_error(self) -> PublishError:
        unled = f", {self.not_taken} answers said no stream took them (503: no leader)" if self.not_taken else ""
        return PublishError(
            f"{self.outstanding} of {self.sent} messages got no PubAck within {self.timeout:g}s (the last sent "
            f"was for {self.subject_of(self._next_token - 1)!r}{unled}): is the stream's leader available? Raise "
            "publishTimeout if the server is just slow."
        )

    def _stored_runs(self, sid: int) -> BulkHandler:
        """Bulk handler of the PubAck subscription: takes consecutive PubAcks that all say stored."""
        pattern = run_pattern(sid, _STORED)
        start = len(b"MSG ") + len(self.reply_prefix)

        def take(buf: bytearray, view: memoryview, pos: int) -> int:
            if matched := pattern.match(buf, pos):
                run = bytes(view[pos : matched.end()])
                count = run.count(b"\r\n{")  # one per message: where its payload starts
                first = int(run[start : run.index(b" ", start)])
                last_at = run.rfind(b"\r\nMSG ") + 2 + start if count > 1 else start
                last = int(run[last_at : run.index(b" ", last_at)])
                if first == self._floor and last == first + count - 1 and not self._ahead:
                    self._floor = last + 1  # in order, as a stream acks: no token by token
                    self._on_stored(count, run)
                else:  # several streams' PubAcks interleaved, or PubAcks again for messages sent again
                    acks = self._acks_in.findall(run)
                    new = [self._first_ack(int(token)) for token, _ in acks]
                    if all(new):
                        self._on_stored(count, run)
                    else:
                        for (_, ack), counted in zip(acks, new, strict=True):
                            if counted:
                                self._on_stored(1, ack)
                self._answered()
                return matched.end()
            return pos

        return take

    def _on_stored(self, count: int, text: bytes) -> None:
        """``count`` PubAcks that say stored arrived; ``text`` holds them (seqs, streams, duplicates). A message sent
        again whose first PubAck was lost counts as a duplicate here."""
        result = self.result
        result.count += count
        result.duplicates += text.count(b'"duplicate"')
        if self.seqs and (seqs := [int(seq) for seq in _SEQ.findall(text)]):
            result.first_seq = min(result.first_seq or min(seqs), min(seqs))
            result.last_seq = max(result.last_seq, max(seqs))
            result.streams.update(stream.decode() for stream in _STREAM.findall(text))

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Raw handler of the PubAck subscription for what ``_stored_runs`` did not take."""
        token = subject[len(self.reply_prefix) :]
        if self.resend and headers is not None and headers.startswith(_NO_RESPONDERS) and token.isdigit():
            self._not_taken(int(token))
            return
        if self.resend and IN_PROCESS in data:
            return  # the message went out again while the stream still stored the first: that one's PubAck answers
        if token.isdigit() and not self._first_ack(int(token)):
            return  # a PubAck again, for a message sent again: it has its answer
        if headers is not None and headers.startswith(STATUS_PREFIX):
            self._fail(subject, status_line(headers))
        elif b'"error"' in data:
            description = _DESCRIPTION.search(data)
            code = _ERR_CODE.search(data)
            reason = description.group(1).decode(errors="replace") if description else data.decode(errors="replace")
            self._fail(subject, f"{reason} (error {code.group(1).decode() if code else '?'})")
        else:  # stored, in a shape the run pattern does not know
            self._on_stored(1, data)
        self._answered()

    def _not_taken(self, token: int) -> None:
        """No stream took message ``token`` (503, no responders): the stream that captures its subject has no leader
        (an election: 4-9 s after its leader died), or none captures it. It stays owed and goes out again with its
        msg id (``_send_again``) until ``publishTimeout``, unless the meta leader says no stream captures it."""
        self.not_taken += 1
        if self._capture_check is None:
            self._capture_check = asyncio.ensure_future(self._check_capture(self.subject_of(token)))

    async def _check_capture(self, subject: str) -> None:
        """Fail the publisher at once when the meta leader says no stream captures ``subject``; an unanswered
        question (its election too) leaves the messages to be sent again."""
        if await captured(self.conn, subject) is False:
            self.failures.append(
                f"Publishing to {subject!r} failed: 503: no stream captures this subject (create one, or fix the "
                "subject)"
            )
            self._room.set()
            self._idle.set()
        else:
            log.info("No stream leader took messages for %r (an election?): sending them again", subject)

    def _first_ack(self, token: int) -> bool:
        """Record the PubAck of ``token`` (out of order, maybe); False when it had one already (sent again)."""
        if token < self._floor or token in self._ahead:
            return False
        ahead = self._ahead
        ahead.add(token)
        while self._floor in ahead:
            ahead.discard(self._floor)
            self._floor += 1
        return True

    def _answered(self) -> None:
        """More PubAcks: a send's bytes are released once all its tokens are below the floor (PubAcks of several
        streams may interleave, which only delays the release)."""
        if self._stalled:
            self._catch_up()
        floor, sends, subjects = self._floor, self._sends, self._subjects
        while sends and sends[0][1] <= floor:
            self.outstanding_bytes -= sends.popleft()[2]
        while len(subjects) > 1 and subjects[1][0] <= floor:  # acked: only a stream acking out of order names them
            subjects.popleft()
        outstanding = self.outstanding
        if (outstanding <= self.window // 2 and self.outstanding_bytes <= self.window_bytes // 2) or self.failures:
            self._room.set()
            if not outstanding or self.failures:
                self._idle.set()

    def _fail(self, ack_subject: bytes, reason: str) -> None:
        token = ack_subject[len(self.reply_prefix) :]
        sent_to = self.subject_of(int(token)) if token.isdigit() else "?"
        if reason.startswith("503"):
            reason = f"{reason}: no stream captures this subject (create one, or fix the subject)"
        self.failures.append(f"Publishing to {sent_to!r} failed: {reason}")


_COMMAND = re.compile(rb"H?PUB [^ \r\n]++ [^ \r\n]++ (?:\d++ )?(\d++)\r\n")


def _split(commands: bytes | memoryview) -> list[memoryview]:
    """Ready ``PUB``/``HPUB`` commands (``command``'s), one view each."""
    view = memoryview(commands)
    data = view.obj if isinstance(view.obj, bytes | bytearray) and len(view.obj) == len(view) else bytes(view)
    parts = []
    position = 0
    while position < len(view):
        line = _COMMAND.match(data, position)
        if line is None:
            raise ValueError(f"not a PUB/HPUB command at byte {position}")
        end = line.end() + int(line.group(1)) + 2
        parts.append(view[position:end])
        position = end
    return parts


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
