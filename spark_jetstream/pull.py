"""The pinned pull reader: read one member consumer's messages in ``(start, end]``.

Protocol (DESIGN section 4): UNPIN the consumer so this attempt takes the pin (an older attempt
still pulling gets 423 and stops), RESET it to ``start + 1`` (drops whatever an earlier attempt
left pending), then pull with JSON requests carrying the priority group and, once known, the
pin id. Until the pin id is known exactly one request is outstanding; after that several are
pipelined. Nothing is ever acked here: the ack floor moves only when Spark commits (with
``ackPolicy=none`` the server itself counts delivery as the ack until the commit resets the floor).

Messages arrive on the connection's loop thread, where a bulk handler parses runs of deliveries
straight from the read buffer and only appends bytes to column lists; the caller's thread turns
full buffers into Arrow record batches. Memory is
bounded by the pull window: new pulls are sent only while fewer than two record batches wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from .connection import Connection
from .errors import (
    ApiError,
    ConnectError,
    ConsumerNotFoundError,
    FencedError,
    JetStreamError,
    ReaderError,
    StreamNotFoundError,
)
from .jsapi import PRIORITY_GROUP, PRIORITY_GROUP_UNKNOWN, JetStreamApi
from .options import config_values, default_of
from .protocol import BulkHandler
from .rows import RowBuffer

log = logging.getLogger(__name__)

_NS = 1_000_000_000
_ACK_PREFIX = b"$JS.ACK."
_VERBS = (b"MSG", b"HMSG")  # a delivery's protocol line without and with headers
_STATUS_PREFIX = b"NATS/1.0 "
_PIN_HEADER = b"Nats-Pin-Id:"
_MAX_RECOVERIES = 5
_API_ATTEMPTS = 8  # about 8 s of backoff: long enough for a leader election
T = TypeVar("T")


@dataclass(frozen=True)
class PullSettings:
    """Pull tuning (options ``pullBatchSize``, ``pullsInFlight``, ``pullExpires``, ...)."""

    batch: int = default_of("pullBatchSize")
    in_flight: int = default_of("pullsInFlight")
    expires: float = default_of("pullExpires")
    idle_heartbeat: float = default_of("pullIdleHeartbeat")  # parse_options keeps it at most expires / 2
    record_batch_size: int = default_of("recordBatchSize")
    max_bytes: int = default_of("pullMaxBytes")
    record_batch_bytes: int = 32 * 1024 * 1024

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> PullSettings:
        return cls(**config_values(cls, options))


@dataclass(frozen=True)
class MemberRange:
    """One member consumer and the watermark range ``(start, end]`` to read from it."""

    stream: str
    consumer: str
    start: int
    end: int
    partitioned: bool = True
    include_headers: bool = False
    priority_group: str = PRIORITY_GROUP


def read_member(conn: Connection, member: MemberRange, settings: PullSettings) -> Iterator[pa.RecordBatch]:
    """Yield the member's messages with ``start < seq <= end`` in seq order, as record batches.

    Raises ``FencedError`` when a newer reader takes the pin, ``ReaderError`` when the read
    cannot make progress. Closing the generator early releases the subscription.
    """
    if member.end <= member.start:
        return
    pull = _PinnedPull(conn, member, settings)
    try:
        conn.run(pull.open())
        while (rows := conn.run(pull.next_rows())) is not None:
            yield rows.to_record_batch(member.stream, member.partitioned, member.include_headers)
    finally:
        conn.run(pull.close(), timeout=10)


def _status(headers: bytes) -> tuple[int, str]:
    """``b"NATS/1.0 408 Request Timeout\\r\\n..."`` -> ``(408, "Request Timeout")``."""
    line = headers[len(_STATUS_PREFIX) :].split(b"\r\n", 1)[0].decode(errors="replace")
    code, _, description = line.partition(" ")
    return (int(code) if code.isdigit() else 0), description.strip()


def _header(headers: bytes, name: bytes) -> str | None:
    start = headers.find(name)
    if start < 0:
        return None
    end = headers.find(b"\r\n", start)
    return headers[start + len(name) : end].strip().decode()


class _PinnedPull:
    """State of one read; every method runs on the connection's loop thread."""

    def __init__(self, conn: Connection, member: MemberRange, settings: PullSettings) -> None:
        self.conn = conn
        self.api = JetStreamApi(conn)
        self.member = member
        self.settings = settings
        self.pull_subject = self.api.subject("CONSUMER", "MSG", "NEXT", member.stream, member.consumer)
        self.inbox = ""
        self.sid: int | None = None
        self.pin_id: str | None = None
        self.last_seq = member.start  # highest seq handed out; anything at or below is a redelivery
        self.requests: deque[int] = deque()  # messages still owed by each outstanding pull, oldest first
        self.budget = 0  # messages we may still ask for: what matched at RESET time, less what arrived
        self.rows = RowBuffer()
        self.ready: deque[RowBuffer] = deque()
        self.done = False
        self.error: JetStreamError | None = None
        self.needs_check = False
        self.oversize = False  # the next pull must fit a message larger than max_bytes
        self.leader_changed = False  # pins seen since then may stem from this reader's own pulls
        self.recoveries = 0
        self.wakeup = asyncio.Event()
        self.received = 0  # messages and statuses that arrived (counted, not timed: the hot path stays lean)
        self.heard = 0  # `received` when next_rows last looked, at `last_activity`
        self.last_activity = 0.0

    @property
    def name(self) -> str:
        return f"consumer {self.member.consumer!r} on stream {self.member.stream!r}"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        try:
            await self.api.unpin(self.member.stream, self.member.consumer, self.member.priority_group)
        except ApiError as exc:
            if exc.err_code != PRIORITY_GROUP_UNKNOWN:
                raise
            config = (await self.api.consumer_info_async(self.member.stream, self.member.consumer))["config"]
            self._check_config(config)
            raise
        await self._reset(self.member.start + 1)
        if self.done:
            return
        await self._new_inbox()
        self._pull()

    async def _new_inbox(self) -> None:
        """Receive on a fresh inbox: late replies to pulls sent before are ignored from now on."""
        old, (self.inbox, self.sid) = self.sid, await self.conn.subscribe_raw(self._on_message, bulk=self._deliveries)
        self.requests.clear()
        self.last_activity = self.conn.loop.time()
        if old is not None:
            await self.conn.unsubscribe_raw(old)

    async def close(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            await self.conn.unsubscribe_raw(sid)

    async def _reset(self, seq: int) -> None:
        info = await self.api.reset(self.member.stream, self.member.consumer, seq)
        self.budget = info["num_pending"]
        self._check_config(info["config"])
        self.requests.clear()
        if self.budget == 0:
            self._finish()

    def _check_config(self, config: dict[str, Any]) -> None:
        group = self.member.priority_group
        if config.get("priority_policy") != "pinned_client" or group not in config.get("priority_groups", []):
            raise ReaderError(
                f"The {self.name} is not a pinned member consumer (priority_policy must be pinned_client "
                f"with priority group {group!r}): recreate it with the group tooling."
            )
        max_ack_pending = config.get("max_ack_pending", 0)
        if 0 < max_ack_pending < min(self.budget, self.member.end - self.member.start):
            raise ReaderError(
                f"The {self.name} has max_ack_pending={max_ack_pending}, but nothing is acked while Spark "
                "works, so the read would stall: set max_ack_pending to -1 (the group tooling does)."
            )
        expires_ns = self.settings.expires * _NS
        timeout = config.get("priority_timeout", 0)
        if timeout and expires_ns * 2 >= timeout:
            raise ReaderError(
                f"pullExpires ({self.settings.expires:g}s) must stay under half the {self.name}'s "
                f"priority_timeout ({timeout / _NS:g}s), or the pin lapses between pulls: lower pullExpires."
            )

    # -- the caller's side -------------------------------------------------------------------

    async def next_rows(self) -> RowBuffer | None:
        """The next full buffer of rows, or None once the range is read."""
        stall_after = 3 * self.settings.idle_heartbeat
        while True:
            if self.error is not None:
                raise self.error
            if self.ready:
                rows = self.ready.popleft()
                self._pull()
                return rows
            if self.done:
                return None
            now = self.conn.loop.time()
            if self.received != self.heard:  # something arrived since the last look
                self.heard, self.last_activity = self.received, now
            quiet = now - self.last_activity > stall_after
            if self.needs_check or quiet or not self.requests:  # no pull could be sent: budget used up
                self.needs_check = False
                await self._check_progress()
                continue
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), stall_after)

    # -- pulls -------------------------------------------------------------------------------

    def _pull(self) -> None:
        """Send pull requests while the window allows: one until the pin id is known, then several."""
        if self.done or self.error is not None or self.sid is None or self.needs_check:
            return
        settings = self.settings
        buffered = len(self.rows) + sum(len(rows) for rows in self.ready)
        buffered_bytes = self.rows.nbytes + sum(rows.nbytes for rows in self.ready)
        limit = 1 if self.pin_id is None else settings.in_flight
        while (
            len(self.requests) < limit
            and buffered < 2 * settings.record_batch_size
            and buffered_bytes < 2 * settings.record_batch_bytes
            and (wanted := min(settings.batch, self.budget - sum(self.requests))) > 0
        ):
            request: dict[str, Any] = {
                "batch": wanted,
                "expires": int(settings.expires * _NS),
                "idle_heartbeat": int(settings.idle_heartbeat * _NS),
                "group": self.member.priority_group,
                # With max_bytes every pull ends with a status, and bytes in flight stay bounded; a
                # message larger than that gets one pull sized by the server's max_payload.
                "max_bytes": 2 * self.conn.client.max_payload + 65536 if self.oversize else settings.max_bytes,
            }
            self.oversize = False
            if self.pin_id is not None:
                request["id"] = self.pin_id
            self.requests.append(wanted)
            self.conn.loop.create_task(
                self.conn.client.publish(self.pull_subject, json.dumps(request).encode(), reply=self.inbox)
            )

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Raw handler for what ``_deliveries`` leaves on the pull inbox: statuses (loop thread)."""
        self.received += 1
        if not reply and headers is not None and headers.startswith(_STATUS_PREFIX):
            self._on_status(*_status(headers), headers)

    def _deliveries(self, sid: int) -> BulkHandler:
        """Bulk handler of the pull inbox: parses consecutive deliveries straight from the read buffer.

        One tight loop per buffer, not a parser pass plus a handler call per message: this is the
        reader's hot path. It stops at anything that is not a delivery (a status goes to
        ``_on_message``) and at a message not yet complete.
        """
        own = b"%d" % sid

        def take(buf: bytearray, view: memoryview, pos: int) -> int:
            member, settings = self.member, self.settings
            end_seq, keep_headers = member.end, member.include_headers
            taken = 0
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                # HMSG <subject> <sid> <reply> <header size> <size> / MSG <subject> <sid> <reply> <size>
                args = bytes(view[pos:eol]).split()
                headed = len(args) == 6
                if (len(args) != 5 and not headed) or args[0] != _VERBS[headed] or args[2] != own:
                    break
                if not args[3].startswith(_ACK_PREFIX):
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
                if self.pin_id is None and header_size:
                    self.pin_id = _header(bytes(view[start : start + header_size]), _PIN_HEADER)
                if self.done:
                    continue
                # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>, or the 11+
                # token form with domain and account hash after "$JS.ACK."
                tokens = args[3].split(b".")
                base = 2 if len(tokens) >= 11 else 0
                seq = int(tokens[5 + base])
                if seq > self.last_seq:
                    if seq > end_seq:
                        self._finish()
                        continue
                    rows = self.rows
                    data = bytes(view[start + header_size : end])
                    rows.subjects.append(args[1])
                    rows.data.append(data)
                    rows.seqs.append(seq)
                    rows.nbytes += len(data)
                    rows.times.append(int(tokens[7 + base]))
                    if keep_headers:
                        rows.headers.append(bytes(view[start : start + header_size]) if headed else None)
                    self.last_seq = seq
                    if len(rows.seqs) >= settings.record_batch_size or rows.nbytes >= settings.record_batch_bytes:
                        self.ready.append(rows)
                        self.rows = RowBuffer()
                        self.wakeup.set()
                if seq >= end_seq or tokens[8 + base] == b"0":  # range complete, or nothing more matches
                    self._finish()
            if taken:
                self._delivered(taken)
            return pos

        return take

    def _delivered(self, count: int) -> None:
        """``count`` messages arrived: they come off the budget and off the oldest pulls still owed any."""
        self.received += count
        self.budget -= count
        requests = self.requests
        for index, owed in enumerate(requests):  # a full pull stays listed until its status
            if not count:
                break
            if owed > 0:
                used = min(owed, count)
                requests[index] = owed - used
                count -= used

    def _on_status(self, code: int, description: str, headers: bytes) -> None:
        if code == 100 or self.done:
            return
        if code == 409 and description in ("Batch Completed", "Message Size Exceeds MaxBytes"):
            # A pull ended (all its messages or bytes were delivered); a too-large next message
            # gets a pull of its own.
            if self.requests:
                self.requests.popleft()
            self.oversize = description != "Batch Completed"
            self._pull()
            return
        if code in (404, 408):
            # A pull expired without filling its batch: nothing was deliverable for a whole `expires`.
            if self.requests:
                self.requests.popleft()
            self.needs_check = True
        elif code == 503 or (code == 409 and description in ("Leadership Change", "Server Shutdown")):
            # No consumer leader right now (an election), or a new one: pin state is not
            # replicated and waiting pulls are gone. Whether the consumer still exists, and
            # what was lost, is found out by the progress check.
            self.needs_check = True
            self.requests.clear()
            self.pin_id = None
            self.leader_changed = True
        elif code == 423:
            self._fail(
                FencedError(
                    f"Read of {self.name} was fenced: a newer reader of this member took the pin "
                    f"({description}). This attempt is obsolete and stops; the newer one reads the range."
                )
            )
        elif code == 409 and description == "Consumer Deleted":
            self._fail(ReaderError(f"The {self.name} was deleted while it was being read."))
        else:
            self._fail(ReaderError(f"Pull from the {self.name} failed: {code} {description}. Check the pull options."))
        self.wakeup.set()

    def _finish(self) -> None:
        self.done = True
        if self.rows:
            self.ready.append(self.rows)
            self.rows = RowBuffer()
        self.wakeup.set()

    def _fail(self, error: JetStreamError) -> None:
        if self.error is None:
            self.error = error
        self.wakeup.set()

    async def _check_progress(self) -> None:
        """A pull ended empty or the server went quiet: find out why, then finish, recover or fail."""
        info = await self._retrying(lambda: self.api.consumer_info_async(self.member.stream, self.member.consumer))
        delivered = info["delivered"]["stream_seq"]
        pinned = next(
            (
                g.get("pinned_client_id")
                for g in info.get("priority_groups", [])
                if g.get("group") == self.member.priority_group
            ),
            None,
        )
        if self.done or self.error is not None:
            return
        if not pinned:
            self.pin_id = None  # a leader change or an expired priority_timeout dropped the pin
        if delivered > self.last_seq:
            # The server delivered messages this reader never saw (lost pulls after a reconnect
            # or a leader change): deliver them again from where this reader is.
            await self._recover(f"deliveries up to seq {delivered} did not arrive")
        elif info["num_pending"] == 0:
            self._finish()
        elif pinned and pinned != self.pin_id and self.leader_changed:
            # A pull this reader sent around the election may hold the new pin: take it back.
            self.leader_changed = False
            await self._recover(f"the pin moved to {pinned} during a leader change", unpin=True)
        elif pinned and pinned != self.pin_id:
            self._fail(
                ReaderError(
                    f"Another client is pulling from the {self.name} (it holds pin {pinned}) while "
                    f"{info['num_pending']} messages are pending: stop that client; only Spark may read "
                    "a member consumer."
                )
            )
        else:
            if not pinned:
                await self._new_inbox()  # replies to pulls sent under the lost pin must not count
            self.budget = info["num_pending"]
            self.requests.clear()
            self._pull()

    async def _recover(self, why: str, unpin: bool = False) -> None:
        self.recoveries += 1
        if self.recoveries > _MAX_RECOVERIES:
            self._fail(ReaderError(f"Gave up reading the {self.name} after {_MAX_RECOVERIES} recoveries: {why}."))
            return
        log.warning("Re-reading the %s from seq %d: %s", self.name, self.last_seq + 1, why)
        await self._new_inbox()
        if unpin:
            self.pin_id = None
            await self._retrying(
                lambda: self.api.unpin(self.member.stream, self.member.consumer, self.member.priority_group)
            )
        await self._retrying(lambda: self._reset(self.last_seq + 1))
        self._pull()

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """Retry an API call through a leader election; a missing stream or consumer is final."""
        for attempt in range(_API_ATTEMPTS):
            try:
                return await call()
            except (StreamNotFoundError, ConsumerNotFoundError):
                raise
            except (ConnectError, ApiError) as exc:
                if attempt == _API_ATTEMPTS - 1:
                    raise ReaderError(f"The {self.name} stayed unavailable: {exc}") from None
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        raise AssertionError("unreachable")
