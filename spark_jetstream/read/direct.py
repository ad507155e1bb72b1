"""Reading a seq range with Direct Get: what batch reads and streaming reads both use.

A range is ``(start, end]`` of one filter subject (a partition's ``<p>.>``, or a member's filter),
read with Direct Get batches (``$JS.API.DIRECT.GET.<stream>`` with ``seq``, ``next_by_subj`` and
``batch``): a read-only API, so reading creates nothing on the server, acks nothing and moves no
consumer's delivery state. Two attempts of one Spark task read the same immutable range side by
side without disturbing each other. It needs ``allow_direct: true`` on the stream.

Any replica may answer a Direct Get, so a read that seems complete is confirmed with one
``STREAM.MSG.GET`` on the leader (a lagging replica would otherwise end the range early). A mirror
answers its origin's Direct Gets too (the server gives it ``mirror_direct`` from the origin's
``allow_direct``), with what it holds: a filtered or shorter-retention or lagging mirror leaves
messages out. Its replies name it (``Nats-Stream``): they are not taken, the batch is asked again,
and where the mirror keeps answering (it is on the server the read is connected to) the batch is
read from the leader one message at a time. Rows have the streaming source's schema (``read.rows``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pyarrow as pa

from spark_jetstream.client import messages
from spark_jetstream.client.connection import DIRECT_ATTEMPT, Connection
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.protocol import (
    DIRECT_HEADERS,
    HEADER_START,
    STATUS_PREFIX,
    BulkHandler,
    Columns,
    direct_replies_handler,
    status_line,
)
from spark_jetstream.errors import ClusterUnavailableError, ReaderError
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.read.rows import RowBatches, RowBuffer

log = logging.getLogger(__name__)

_NO_HEADERS = len(HEADER_START)  # a reply's header block up to the server's: the message had none
_LAGGING_RETRIES = 50
SIZED_RANGE = 1000
"""A filtered range at least this wide asks each Direct Get batch for what it can still hold (``_DirectReader.size``):
a partition's filter matches a share of the range's seqs, and a batch of the range's width made the server send the
messages after the range too (1.49 sent per message read in a streaming read of 8 partitions)."""
_LEADER_BATCH = 100
"""Messages read from the leader one at a time (``_batch_from_leader``) before Direct Get is tried again."""


def first_seqs(
    conn: Connection, stream: str, filters: Sequence[str], after: int, end: int, leader: bool = False
) -> list[int | None]:
    """The first seq after ``after`` of each filter subject (None: none yet), one Direct Get each, or with ``leader``
    one ``STREAM.MSG.GET`` each on the stream leader (a stream without Direct Get, or a user who may not use it).

    A replica that answers Direct Get may lag the leader: when it has no message up to ``end`` for a filter, the
    leader is asked too, or the partition's messages in the range would be left out of the batch for good. An
    answer up to ``end`` needs no check: a replica holds a prefix of the stream."""
    api = JetStreamApi(conn)

    async def first(subject: str) -> int | None:
        if not leader:
            found = await messages.direct_get_async(api, stream, {"seq": after + 1, "next_by_subj": subject})
            if found is not None and found.seq <= end:
                return found.seq
        return await messages.next_on_leader(api, stream, subject, after)

    async def gather() -> list[int | None]:
        return list(await asyncio.gather(*(first(subject) for subject in filters)))

    return conn.run(gather())


def split(template: SeqRange, firsts: Sequence[int | None], filters: Sequence[str], max_range: int) -> list[SeqRange]:
    """``template``'s range for each filter with a message in it (no empty task), from that message on,
    in pieces of at most ``max_range`` seqs."""
    return [
        replace(template, filter=subject, start=low, end=min(low + max_range, template.end))
        for subject, first in zip(filters, firsts, strict=True)
        if first is not None and first <= template.end
        for low in range(max(template.start, first - 1), template.end, max_range)
    ]


def spread(ranges: Sequence[SeqRange], min_partitions: int | None) -> list[SeqRange]:
    """Option ``minPartitions`` (Kafka's): when there are fewer ranges than ``min_partitions``, cut the widest into
    contiguous slices of about equal seq width until there are that many (a range of width w gives at most w
    slices). Extra slices go one at a time to the range whose slices are widest (the earlier one on a tie), so
    the result depends only on the ranges and the option: a replayed batch is cut the same way."""
    if not min_partitions or len(ranges) >= min_partitions:
        return list(ranges)
    widths = [r.end - r.start for r in ranges]
    parts = [1] * len(ranges)
    widest = [(-width, index) for index, width in enumerate(widths)]  # slice width (negated) of each range, then order
    heapq.heapify(widest)
    for _ in range(min_partitions - len(ranges)):
        while widest and parts[widest[0][1]] >= widths[widest[0][1]]:
            heapq.heappop(widest)  # slices of one seq cannot be cut further
        if not widest:
            break
        index = heapq.heappop(widest)[1]
        parts[index] += 1
        heapq.heappush(widest, (-widths[index] / parts[index], index))
    return [piece for seq_range, count in zip(ranges, parts, strict=True) for piece in _slices(seq_range, count)]


def _slices(seq_range: SeqRange, count: int) -> list[SeqRange]:
    """``seq_range`` cut into ``count`` contiguous pieces whose widths differ by at most one seq."""
    pieces, low = [], seq_range.start
    for index in range(count):
        high = low + (seq_range.end - low) // (count - index)
        pieces.append(replace(seq_range, start=low, end=high))
        low = high
    return pieces


def read_range(conn: Connection, seq_range: SeqRange) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``seq_range`` in seq order, as record batches of the source's schema."""
    reader = _DirectReader(conn, seq_range)
    try:
        conn.run(reader.open())
        conn.run(reader.size())
        while (rows := conn.run(reader.next_rows())) is not None:
            yield rows.to_record_batch(seq_range.stream, seq_range.partitioned, seq_range.include_headers)
    finally:
        conn.run(reader.close(), timeout=10)


class _DirectReader:
    """Sequential Direct Get batches for one range; every method runs on the connection's loop thread."""

    def __init__(self, conn: Connection, seq_range: SeqRange) -> None:
        self.conn = conn
        self.api = JetStreamApi(conn)
        self.range = seq_range
        self.subject = self.api.subject("DIRECT", "GET", seq_range.stream)
        self.stream = seq_range.stream.encode()
        self.last = seq_range.start  # highest seq read
        self.batches = RowBatches(
            seq_range.record_batch_size, seq_range.record_batch_bytes, seq_range.include_headers, text_times=True
        )
        self.inbox = ""
        self.sid: int | None = None
        self.batch_done = asyncio.Event()
        self.requested = 0  # messages the current batch asked for
        self.received = 0  # messages in the current batch
        self.pending: int | None = None  # matching messages after the last one, as the replica saw it
        self.error: str | None = None
        self.unavailable = False  # the last request got 503: nobody answers Direct Get right now
        self.foreign: bytes | None = None  # the stream that answered the last request, where not this one (a mirror)
        self.after_end: int | None = None  # messages of the filter after the range (``size``); None: not counted
        self.left: int | None = None  # messages of the filter left in the range after the last one read
        self.warned = False  # that a mirror answers for the stream (once a read)
        self.answered_at: float | None = None  # when the current request's first reply came (loop time)
        self.done = False

    async def open(self) -> None:
        self.inbox, self.sid = await self.conn.subscribe_raw(self._on_message, bulk=self._bulk, owed=self._owed)

    async def size(self) -> None:
        """Count the filter's messages after the range (one Direct Get of the first one: its ``Nats-Num-Pending``), so
        that each batch asks for what the range still holds: a reply's pending count less this. The first batch then
        asks for one message, whose pending count tells the rest. Only for a filtered range ``SIZED_RANGE`` wide or
        more: a ``>`` range holds a message per seq, and a narrow one costs less than the question."""
        seq_range = self.range
        if seq_range.filter == ">" or seq_range.end - seq_range.start < SIZED_RANGE:
            return
        request = {"seq": seq_range.end + 1, "next_by_subj": seq_range.filter, "batch": 1}
        after = await messages.direct_get_async(self.api, seq_range.stream, request)
        self.after_end = 0 if after is None else (after.num_pending or 0) + 1

    def _owed(self) -> int:
        """Messages the current batch may still bring (the server may end it early: bytes, the range's end), for the
        read loop's low-water mark; 0 where unknown: a narrow filtered range asks for its width (``size``), which other
        subjects' messages mostly fill, and the socket would wait for what never comes."""
        if self.batch_done.is_set() or (self.after_end is None and self.range.filter != ">"):
            return 0
        return self.requested - self.received

    async def close(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            await self.conn.unsubscribe_raw(sid)

    async def next_rows(self) -> RowBuffer | None:
        """The next record batch's worth of rows, or None once the range is read."""
        lagging = 0
        ready = self.batches.ready
        while not self.done and not ready:
            await self._batch()
            if self.done or (self.received and self.pending != 0):
                continue
            # The replica that answered has nothing more: make sure the leader agrees.
            if await self._leader_has_more():
                lagging += 1
                if lagging > _LAGGING_RETRIES:  # what answers stays behind (a mirror on this server): the leader
                    await self._batch_from_leader(f"what answers Direct Get stays behind its leader at seq {self.last}")
                    lagging = 0
                else:
                    await asyncio.sleep(0.1)
            else:
                self.done = True
        if self.done:
            self.batches.flush()
        return ready.popleft() if ready else None

    async def _batch(self) -> None:
        """One Direct Get batch from ``last + 1``.

        A request sent into a connection that then dropped (its server died), or routed to a silent replica
        (frozen, cut off), is never answered, and while a stream has no responding replica the server answers 503:
        without a first reply within ``conn.direct_wait`` (a fraction of a second, doubled per attempt in a row that
        ran out while the server was busy) or a next one within ``DIRECT_ATTEMPT`` (or that wait, if longer), or on a
        503, the rest is asked for again on a new inbox (late replies to the old request are ignored), until
        ``conn.out_of_time`` without progress: a slow server is waited for, a silent one is not. The batch ends at
        its end status, or as soon as the range's last seq is read (a slow server's end status may come seconds
        later).
        """
        started = time.monotonic()  # when this batch last made progress
        stalled = 0  # attempts in a row that ran out of time with the server busy (``conn.asked_too_soon``)
        foreign = 0  # attempts in a row another stream answered
        while True:
            wanted = min(self.range.direct_batch, self.range.end - self.last)
            if self.after_end is not None:  # what the range still holds, once a reply told (``size``)
                wanted = min(wanted, max(1, self.left)) if self.left is not None else 1
            request = {
                "seq": self.last + 1,
                "next_by_subj": self.range.filter,
                "batch": wanted,
                "max_bytes": self.range.direct_max_bytes,  # the server always sends the first message, however large
            }
            self.requested, self.received, self.pending, self.error, self.unavailable = wanted, 0, None, None, False
            self.answered_at, self.foreign = None, None
            self.batch_done.clear()
            await self.conn.client.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
            sent_at = time.monotonic()
            wait = self.conn.direct_wait(stalled)
            while not self.batch_done.is_set():
                heard = self.received
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.batch_done.wait(), wait)
                if self.received > heard:
                    started = time.monotonic()  # messages flow: not stuck
                    wait = max(DIRECT_ATTEMPT, self.conn.direct_wait(stalled))
                elif not self.batch_done.is_set():
                    break  # nothing for a whole attempt: ask again
            if self.answered_at is not None:
                self.conn.replied(self.answered_at - sent_at)
            if self.foreign is not None:
                foreign += 1
                if foreign >= messages.FOREIGN_RETRIES:
                    await self._batch_from_leader(f"its mirror {self.foreign.decode()!r} answers its Direct Gets")
                    return
                await self.close()
                await self.open()
                continue
            if self.batch_done.is_set() and not self.unavailable:
                break
            stalled += not self.unavailable and await self.conn.asked_too_soon()
            if deadline := self.conn.out_of_time(started):
                raise ClusterUnavailableError(self._gave_up(started, deadline))
            log.info(
                "Asking stream %s again for %s from seq %d: %s %.2f s through %s (%d of %d received)",
                self.range.stream,
                self.range.filter,
                self.last + 1,
                "503, no replica answers after" if self.unavailable else "no reply within",
                time.monotonic() - sent_at if self.unavailable else wait,
                self.conn.server_url,
                self.received,
                self.requested,
            )
            await asyncio.sleep(0.1 if self.unavailable else 0)
            await self.close()
            await self.open()
        if self.error is not None:
            raise ReaderError(self.error)
        if self.last >= self.range.end:
            self.done = True

    def _gave_up(self, started: float, deadline: float) -> str:
        """Why the read stopped: no replica answered (503s), no server answered the connection, or a slow one."""
        what = f"Direct Get on stream {self.range.stream!r}"
        where = f"seq {self.last} read of {self.range.end}"
        if silence := self.conn.client.silence_since(started):
            return f"{what} got no answer within {deadline:g}s ({where}){silence}."
        if self.unavailable:
            return (
                f"{what} was answered 503 (no replica answers) for {deadline:g}s ({where}) through "
                f"{self.conn.server_url}: is a majority of the stream's servers up?"
            )
        if not self.conn.client.answering():
            return (
                f"{what} got no answer within {deadline:g}s ({where}): the connection to NATS "
                f"({self.conn.options.shown_servers}) was down and did not come back; check that the servers run."
            )
        return self.conn.unanswered(what, deadline, where)

    def _bulk(self, sid: int) -> BulkHandler:
        """Bulk handler of the Direct Get inbox (``protocol.direct_replies_handler``): takes runs of replies straight
        from the read buffer and keeps each run in one step (decision 0011: the client's CPU is shared with the JVM
        and the server). Statuses, replies it does not recognise and incomplete ones go to ``_on_message``."""
        return direct_replies_handler(sid, self.stream, self.batches, self._keep)

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Raw handler of the Direct Get inbox (loop thread, once per message: keep it lean)."""
        if headers is None:
            return
        if headers.startswith(STATUS_PREFIX):  # a reply too (messages are stamped by ``_keep``)
            if self.answered_at is None:
                self.answered_at = time.monotonic()
            code = headers[len(STATUS_PREFIX) : len(STATUS_PREFIX) + 3]
            if code == b"503":  # no replica answers right now (an election, servers restarting)
                self.unavailable = True
            elif code not in (b"204", b"404"):  # 204: end of batch; 404: nothing (more) matches
                self.error = f"Direct Get on stream {self.range.stream!r} failed: {status_line(headers)}."
            self.batch_done.set()
            return
        cut = headers.rfind(DIRECT_HEADERS)
        fields = dict(line.split(b": ", 1) for line in headers[cut + 2 : -4].split(b"\r\n"))
        if fields[b"Nats-Stream"] != self.stream:  # a mirror's answer: the request is asked again
            if self.foreign is None and not self.batch_done.is_set():
                self.foreign = fields[b"Nats-Stream"]
                self.batch_done.set()
            return
        rows = self.batches.rows
        first = len(rows)
        rows.add(
            fields[b"Nats-Subject"],
            data,
            int(fields[b"Nats-Sequence"]),
            fields[b"Nats-Time-Stamp"],
            headers[:cut] + b"\r\n\r\n" if cut + 2 > _NO_HEADERS else None,
        )
        self._keep(rows, first, fields.get(b"Nats-Num-Pending"))

    def _keep(self, rows: Columns, first: int, pending: bytes | None) -> None:
        """A run of replies appended to the rows from ``first`` on (seqs ascending), whichever path parsed it (loop
        thread): seqs already read are left out, and one past the range ends it (this filter has nothing more in
        it). ``pending``: the last reply's count of matching messages after it."""
        if self.answered_at is None:
            self.answered_at = time.monotonic()
        if self.done:
            self.batches.keep(first, first, first)  # none: the range is read
            return
        kept = self.batches.keep_in_order(
            first, self.last, self.range.end
        )  # the time as RFC 3339 text, parsed per batch
        self.done = kept.past_end
        if kept.count:
            self.received += kept.count
            self.pending = int(pending) if pending is not None else -1
            self.last = kept.last
            if self.after_end is not None and self.pending >= 0:
                self.left = self.pending - self.after_end
        if self.done or self.last >= self.range.end:
            self.batch_done.set()  # the range is read: its end status need not be waited for

    async def _batch_from_leader(self, why: str) -> None:
        """Up to ``_LEADER_BATCH`` messages of the range read on the stream leader, one ``STREAM.MSG.GET`` each: slow,
        and right whatever answers Direct Get; warned once a read."""
        if not self.warned:
            self.warned = True
            log.warning(
                "Stream %r: %s through %s; reading %s from seq %d on the stream leader one message at a time (slower). "
                "Connect to a server that holds the stream itself (a replica), or read with readMode=pull.",
                self.range.stream,
                why,
                self.conn.server_url,
                self.range.filter,
                self.last + 1,
            )
        rows = self.batches.rows
        for _ in range(min(self.range.direct_batch, _LEADER_BATCH)):
            request = {"seq": self.last + 1, "next_by_subj": self.range.filter}
            message = await messages.stored_message_async(self.api, self.range.stream, request)
            if message is None or int(message["seq"]) > self.range.end:
                self.done = True
                return
            first = len(rows)
            hdrs = message.get("hdrs")
            rows.add(
                message["subject"].encode(),
                base64.b64decode(message.get("data") or ""),
                int(message["seq"]),
                message["time"].encode(),
                base64.b64decode(hdrs) if hdrs else None,
            )
            self._keep(rows, first, None)
            if self.done:
                return

    async def _leader_has_more(self) -> bool:
        """Whether the stream leader holds a matching message in ``(last, end]`` (read-after-write)."""
        stream, end = self.range.stream, self.range.end
        return await messages.first_on_leader(self.api, stream, [self.range.filter], self.last, end) is not None
