"""Exactly-once writes at any age: rows in atomic batches, each committed with a progress marker (decision 0022).

A write task with a ``ProgressTarget`` publishes its partition's rows in chunks, each one atomic batch (ADR-50,
nats-server 2.12+, a stream with ``allow_atomic``) whose last message is the task's **progress marker**: a message
on ``<progressSubject>.sjp-<sink>.<partition>`` saying which Spark batch it belongs to and how many of the
partition's rows are stored with it. The marker is written with ``Nats-Expected-Last-Subject-Sequence`` of the
marker before it, so of two attempts that try to commit the same rows one is refused whole, and a chunk and its
marker are stored together or not at all.

A task reads its marker first (from the stream leader) and publishes only the rows after the ones it counts: a
retry, a replay after a crash at any age and a speculative copy continue where the stored rows end, and an attempt
of an older Spark batch publishes nothing. The marker counts rows, not chunks: an attempt whose input was cut (a
dying executor's worker takes the cut for the end) stores a shorter last chunk, and the replay goes on right after
it. Replays must put the same rows in the same order into a partition, as Spark's replays of a deterministic plan
over a replayable source do (the same assumption as the msg ids of the writer without a marker).

Marker subjects carry a token of their own (``progress_markers``), by which the connector's reads leave them out.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.features import ATOMIC_BATCHES, leader_version, shown, supports
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.messages import last_message_async
from spark_jetstream.client.progress_markers import marker_subject
from spark_jetstream.client.protocol import STATUS_PREFIX
from spark_jetstream.client.publish import (
    BATCH_COMMIT_HEADER,
    BATCH_ID_HEADER,
    BATCH_SEQUENCE_HEADER,
    EXPECTED_SUBJECT_SEQ_HEADER,
    ROLLUP_HEADER,
    PublishError,
    command,
    header_block,
    queue_commands,
)
from spark_jetstream.errors import OptionError
from spark_jetstream.sink.publishing import Commands, value_range

log = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071  # another attempt moved the marker
BATCH_INCOMPLETE = 10176  # a leader change, a timeout or a gap dropped the batch
TOO_MANY_BATCHES = 10210  # 50 batches in flight on the stream, or 1,000 on the server
BATCH_TOO_LARGE = 10199
DUPLICATE_IN_BATCH = 10201
NO_STREAM_LEADER = 503  # no responders: the stream's leader is being elected (the driver checked the stream)
_RETRIED = {0, WRONG_LAST_SEQUENCE, BATCH_INCOMPLETE, TOO_MANY_BATCHES, NO_STREAM_LEADER}  # 0: no answer
COMMIT_WAIT = 5.0
"""Seconds a commit waits for its answer before the marker is read again (a commit sent into a connection that then
dropped is never answered)."""


WITHIN_WINDOW = (
    "jetstream writes are exactly-once within the target stream's duplicate window only ({why}): a batch replayed "
    "after it (a restart after a night, a failed deploy) stores again what its failed attempt stored. For "
    "exactly-once at any age, write to a stream with allow_atomic (nats-server 2.12+) and set progressSubject to a "
    "subject prefix that stream captures."
)
_said_within_window = False


def progress_target(conn: Connection, prefix: str | None, max_messages: int) -> ProgressTarget | None:
    """Where a write's markers go (on the driver, before any task runs), or None: the writer then keeps exactly-once
    within the duplicate window, and the first such write of the process says so in the log. A ``prefix`` no
    stream captures is refused."""
    if prefix is None:
        return _within_window("no progressSubject")
    api = JetStreamApi(conn)
    stream = progress_stream(api, prefix)
    if not conn.supports(ATOMIC_BATCHES):
        return _within_window(f"the server runs nats-server {shown(conn.server_version)}; atomic batches need 2.12")
    info = api.stream_info(stream)
    if not info["config"].get("allow_atomic"):
        return _within_window(f"stream {stream!r} does not allow atomic batches (allow_atomic: true)")
    if not supports(leader_version(info), ATOMIC_BATCHES):  # a batch is served by the stream's leader
        running = shown(leader_version(info))
        return _within_window(f"stream {stream!r}'s leader runs nats-server {running}; atomic batches need 2.12")
    rollup = bool(info["config"].get("allow_rollup_hdrs"))
    if not rollup and stream not in _said_no_rollup:
        _said_no_rollup.add(stream)
        log.warning(
            "Stream %r does not allow rollups: the progress markers under %r stay, a message per write task per batch. "
            "Allow them (`nats stream edit %s --allow-rollup`) to keep only each partition's last.",
            stream,
            prefix,
            stream,
        )
    return ProgressTarget(stream, prefix, max_messages, rollup)


_said_no_rollup: set[str] = set()


def progress_stream(api: JetStreamApi, prefix: str) -> str:
    """The stream that captures the marker subjects under ``prefix``; a ``prefix`` no stream captures is refused."""
    probe = marker_subject(prefix, "0", 0)
    streams = api.stream_names(probe)
    if not streams:
        raise OptionError(
            f"progressSubject {prefix!r}: no stream captures {probe!r}, where the writer's progress markers go. Add "
            f"'{prefix}.>' to the subjects of the stream the rows go to."
        )
    return streams[0]


def _within_window(why: str) -> None:
    global _said_within_window
    if not _said_within_window:
        _said_within_window = True
        log.warning(WITHIN_WINDOW.format(why=why))
    return None


@dataclass(frozen=True)
class ProgressTarget:
    """Where a write's markers go: the stream holding rows and markers, the marker subjects' prefix, and the
    messages an atomic batch may hold (the server's limit: rows and the marker)."""

    stream: str
    prefix: str
    max_messages: int = 1000
    rollup: bool = False  # the stream allows rollups: each marker removes the one before it on its subject


@dataclass(frozen=True)
class Marker:
    """A task's last stored marker: its stream seq (0: none yet), Spark batch, chunk of that batch, rows of the
    partition stored with it, and the atomic batch that stored it."""

    seq: int = 0
    batch: int = -1
    chunk: int = -1
    rows: int = 0
    stored_by: str = ""
    print: str = ""  # the fingerprint of those rows (``RowPrint``); "" in markers written before it was kept

    def rows_of(self, batch: int) -> int:
        """Rows of Spark batch ``batch`` it says are stored."""
        return self.rows if self.batch == batch else 0

    def body(self) -> bytes:
        body = {"batch": self.batch, "chunk": self.chunk, "rows": self.rows, "id": self.stored_by, "print": self.print}
        return json.dumps(body).encode()


async def read_marker(api: JetStreamApi, stream: str, subject: str) -> Marker:
    """The last marker on ``subject``, read from the stream leader (read-after-write)."""
    found = await last_message_async(api, stream, subject)
    if found is None:
        return Marker()
    try:
        body = json.loads(found.data)
        batch, chunk, rows = int(body["batch"]), int(body["chunk"]), int(body["rows"])
        return Marker(found.seq, batch, chunk, rows, str(body["id"]), str(body.get("print", "")))
    except (ValueError, KeyError, TypeError):
        raise PublishError(
            f"Subject {subject!r} of stream {stream!r} holds {found.data[:60]!r}, not a spark-jetstream progress "
            "marker: something else publishes there; give progressSubject a prefix of its own."
        ) from None


class RowPrint:
    """A fingerprint of the rows of a partition taken so far: their subjects and data, length by length and byte by
    byte, one running hash per column and kind, so that the same rows give the same print however Spark cut them into
    record batches. A replay compares it with its marker's before it skips rows by count (``AtomicWriter``)."""

    def __init__(self, columns: Sequence[int]) -> None:
        self.columns = tuple(columns)
        self.hashes = [(hashlib.sha256(), hashlib.sha256()) for _ in self.columns]

    def update(self, piece: pa.RecordBatch) -> None:
        for index, (lengths, values) in zip(self.columns, self.hashes, strict=True):
            column = piece.column(index)
            sizes = pc.binary_length(column)  # int32 (int64 for large_binary); a null is -1, apart from b""
            sizes = sizes.fill_null(-1) if sizes.null_count else sizes
            width = sizes.type.byte_width
            lengths.update(memoryview(sizes.buffers()[1])[sizes.offset * width : (sizes.offset + len(sizes)) * width])
            offsets = memoryview(column.buffers()[1]).cast("q" if pa.types.is_large_binary(column.type) else "i")
            data = column.buffers()[2]
            if data is not None:
                values.update(memoryview(data)[offsets[column.offset] : offsets[column.offset + len(column)]])

    def copy(self) -> RowPrint:
        twin = RowPrint(self.columns)
        twin.hashes = [(lengths.copy(), values.copy()) for lengths, values in self.hashes]
        return twin

    def hexdigest(self) -> str:
        whole = hashlib.sha256(b"".join(h.digest() for pair in self.hashes for h in pair))
        return whole.hexdigest()[:32]


class _Rows:
    """The task's input rows as a cursor: chunks of rows taken in order, rows skipped, and the fingerprint of the rows
    up to ``position`` (``print``)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], print_columns: Sequence[int]) -> None:
        self.batches = batches
        self.current: pa.RecordBatch | None = None
        self.offset = 0  # rows of ``current`` already taken
        self.position = 0  # rows of the partition taken or skipped
        self.print = RowPrint(print_columns)

    def _next(self) -> pa.RecordBatch | None:
        while self.current is None or self.offset >= self.current.num_rows:
            self.current = next(self.batches, None)
            self.offset = 0
            if self.current is None:
                return None
        return self.current

    def skip(self, count: int) -> int:
        """Skip up to ``count`` rows; the number skipped."""
        skipped = 0
        while skipped < count and (batch := self._next()) is not None:
            step = min(count - skipped, batch.num_rows - self.offset)
            self.print.update(batch.slice(self.offset, step))
            self.offset += step
            skipped += step
        self.position += skipped
        return skipped

    def take(self, max_rows: int, max_bytes: int, data: int) -> list[pa.RecordBatch]:
        """The next rows, at most ``max_rows`` and ``max_bytes`` payload bytes (at least one row), as slices of the
        input; empty at the end. Cut only by the rows themselves: the same rows give the same chunks."""
        out: list[pa.RecordBatch] = []
        rows = size = 0
        while rows < max_rows and (batch := self._next()) is not None:
            piece = batch.slice(self.offset, max_rows - rows)
            ends = pc.cumulative_sum(pc.binary_length(piece.column(data)).fill_null(0)).to_pylist()
            fit = bisect.bisect_right(ends, max_bytes - size) or (0 if rows else 1)
            if not fit:
                break
            out.append(piece.slice(0, fit))
            self.print.update(out[-1])
            rows, size, self.offset = rows + fit, size + ends[fit - 1], self.offset + fit
            if fit < piece.num_rows:
                break
        self.position += rows
        return out


def _print_at(before: RowPrint, slices: list[pa.RecordBatch], count: int) -> RowPrint:
    """``before`` (a print up to the first row of ``slices``) carried on over their first ``count`` rows."""
    taken = before.copy()
    for piece in slices:
        if count <= 0:
            break
        taken.update(piece.slice(0, count))
        count -= piece.num_rows
    return taken


def _drop(slices: list[pa.RecordBatch], count: int) -> list[pa.RecordBatch]:
    """``slices`` without their first ``count`` rows."""
    out = []
    for piece in slices:
        if count >= piece.num_rows:
            count -= piece.num_rows
            continue
        out.append(piece.slice(count))
        count = 0
    return out


@dataclass
class AtomicResult:
    published: int = 0
    skipped: int = 0  # rows an earlier or concurrent attempt stored
    stale: bool = False  # the marker is of a later Spark batch: this attempt is obsolete


class AtomicWriter:
    """One task's rows in atomic batches with progress markers (module doc); ``write`` runs in the task's
    thread, the sends on the connection's loop."""

    def __init__(
        self,
        conn: Connection,
        commands: Commands,
        target: ProgressTarget,
        sink: str,
        batch_id: int,
        partition: int,
        timeout: float,
        max_bytes: int,
    ) -> None:
        self.conn = conn
        self.api = JetStreamApi(conn)
        self.commands = commands
        self.target = target
        self.subject = marker_subject(target.prefix, sink, partition)
        self.partition = partition
        self.batch_id = batch_id
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.inbox = conn.client.new_inbox()
        self.replies: dict[bytes, asyncio.Future[bytes]] = {}
        self.sid: int | None = None

    def write(self, batches: Iterator[pa.RecordBatch]) -> AtomicResult:
        result = AtomicResult()
        columns = self.commands.columns
        rows = _Rows(batches, [index for index in (columns.subject, columns.data) if index is not None])
        self.conn.run(self._open())
        try:
            marker = self._marker()
            if marker.batch > self.batch_id:
                result.stale = True
                return result
            result.skipped = rows.skip(marker.rows_of(self.batch_id))
            self._check(marker, rows.position, rows.print)
            while True:
                before = rows.print.copy()  # the print up to the chunk's first row
                slices = rows.take(self.target.max_messages - 1, self.max_bytes, columns.data)
                if not slices:
                    return result
                end = rows.position
                marker, published = self._commit(slices, end, marker, before, rows.print.hexdigest())
                if marker.batch > self.batch_id:
                    result.stale = True
                    return result
                result.published += published
                result.skipped += sum(piece.num_rows for piece in slices) - published
                result.skipped += rows.skip(marker.rows - end)  # another attempt stored more
                self._check(marker, rows.position, rows.print)
        finally:
            self.conn.run(self._close(), timeout=10)

    def _check(self, marker: Marker, taken: int, taken_print: RowPrint) -> None:
        """Before this attempt goes on after the rows ``marker`` says are stored (``taken`` of its own rows, with
        print ``taken_print``, stand for them): refuse, with the task failing, when its rows are not those. Skipping
        by count would then lose some rows and store others twice (decision 0042)."""
        stored = marker.rows_of(self.batch_id)
        if not stored:
            return
        mine = taken_print.hexdigest() if taken == stored else f"{taken:,} rows only"
        if taken == stored and marker.print in ("", mine):
            return
        raise PublishError(
            f"Partition {self.partition} of Spark batch {self.batch_id} holds other rows than the attempt that stored "
            f"its first {stored:,} rows (progress marker {self.subject!r}: fingerprint {marker.print or '?'}, this "
            f"attempt's {mine}): skipping them by count would lose some rows and store others twice. A replayed "
            "partition must hold its first attempt's rows in the same order: a source that replays a micro-batch as "
            "it was cut (the jetstream source does) and a deterministic plan (no rand(), no shuffle or union whose "
            "order varies). Nothing more was written by this attempt."
        )

    def _marker(self) -> Marker:
        return self.conn.run(read_marker(self.api, self.target.stream, self.subject))

    def _commit(
        self, slices: list[pa.RecordBatch], end: int, marker: Marker, before: RowPrint, end_print: str
    ) -> tuple[Marker, int]:
        """Store the rows of ``slices`` (they end at row ``end``, whose print is ``end_print``; ``before``: the print
        up to their first row) with their marker, or learn that another attempt stored them; returns the marker after
        it and the rows this attempt stored. What the protocol says to retry is retried, the marker read again first,
        for up to ``publishTimeout`` and an election."""
        loop = self.conn.loop
        deadline = loop.time() + self.timeout + self.conn.options.request_timeout
        start = end - sum(piece.num_rows for piece in slices)
        sent: set[str] = set()  # this attempt's atomic batches of these rows: an unanswered one may be stored
        attempt = 0
        code: int | None = None  # the last try's answer
        while True:
            stored = marker.rows_of(self.batch_id)
            if marker.stored_by in sent:
                return marker, end - start
            if marker.batch > self.batch_id or stored >= end:
                return marker, 0  # obsolete, or another attempt stored these rows
            if stored < start:
                raise PublishError(
                    f"The progress marker {self.subject!r} says {stored:,} rows of Spark batch {self.batch_id} are "
                    f"stored, but this attempt's next rows start at row {start:,}: the partition's rows differ "
                    "between attempts (a plan that is not deterministic, such as one after a shuffle)."
                )
            if stored > start:  # another attempt stored a shorter chunk: the same rows?
                before = _print_at(before, slices, stored - start)
                self._check(marker, stored, before)
                slices, start = _drop(slices, stored - start), stored
            chunk = marker.chunk + 1 if marker.batch == self.batch_id else 0
            mine = Marker(0, self.batch_id, chunk, end, uuid.uuid4().hex, end_print)
            sent.add(mine.stored_by)
            wait = min(self.timeout, COMMIT_WAIT)
            code, seq, reason = self.conn.run(self._send(slices, mine, marker.seq, wait, code == TOO_MANY_BATCHES))
            if code is None:
                return replace(mine, seq=seq), end - start
            if code not in _RETRIED:
                raise PublishError(self._failure(code, reason, start, end))
            if loop.time() >= deadline:
                raise PublishError(
                    f"Rows {start:,}..{end:,} of this task could not be committed to stream {self.target.stream!r} "
                    f"within publishTimeout ({self.timeout:g}s) and an election: {reason}. Is a majority of the "
                    "stream's servers up?"
                )
            attempt += 1
            if code != WRONG_LAST_SEQUENCE:  # the batch was dropped, not started or not answered: back off
                time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
            marker = self._marker()

    def _failure(self, code: int, reason: str, start: int, end: int) -> str:
        what = f"Committing rows {start:,}..{end:,} of this task to stream {self.target.stream!r} failed: {reason}"
        if code == BATCH_TOO_LARGE:
            return f"{what}. The server allows fewer messages per atomic batch: lower atomicBatchSize."
        if code == DUPLICATE_IN_BATCH:
            return f"{what}. A msg_id of these rows is a duplicate within the stream's duplicate window."
        return f"{what}."

    async def _open(self) -> None:
        _, self.sid = await self.conn.subscribe_raw(self._on_reply, f"{self.inbox}.*")

    async def _close(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            await self.conn.unsubscribe_raw(sid)

    def _on_reply(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        future = self.replies.pop(subject, None)
        if future is not None and not future.done():
            future.set_result(data if headers is None else headers + data)

    async def _send(
        self, slices: list[pa.RecordBatch], marker: Marker, expected: int, wait: float, ask_first: bool = False
    ) -> tuple[int | None, int, str]:
        """One atomic batch: the rows, then ``marker`` as its commit (expecting the marker subject's last seq to be
        ``expected``). Returns (None, the marker's seq, "") when stored, else (error code, 0, reason); code 0: no
        answer within ``wait`` (the outcome is unknown: a request into a dropped connection is lost). ``ask_first``
        (the server had too many batches in flight): the rest goes out only once the first message's answer says
        the batch started, so a refusal costs one message, not the batch (41 refusals of a 1,000-row batch through
        an 8 s stall sent 3.1 messages a row)."""
        loop = asyncio.get_running_loop()
        batch = marker.stored_by
        prefix = f"{self.inbox}.{batch}-".encode()  # late answers to an earlier attempt match no future
        first, commit = prefix + b"1", prefix + b"commit"
        answers = {token: loop.create_future() for token in (first, commit)}
        self.replies = dict(answers)
        parts: list[bytes | memoryview] = []
        sequence = 1
        for piece in slices:
            if sequence == 1:  # the first message asks for an answer: the batch started, or why not
                parts.append(value_range(self.commands.build(piece.slice(0, 1), 1, prefix, batch)))
                piece = piece.slice(1)
                sequence = 2
            if piece.num_rows:
                parts.append(value_range(self.commands.build(piece, sequence, None, batch)))
                sequence += piece.num_rows
        headers = {
            BATCH_ID_HEADER: batch,
            BATCH_SEQUENCE_HEADER: str(sequence),
            BATCH_COMMIT_HEADER: "1",
            EXPECTED_SUBJECT_SEQ_HEADER: str(expected),
            **({ROLLUP_HEADER: "sub"} if self.target.rollup else {}),
        }
        parts.append(command(self.subject.encode(), commit, marker.body(), header_block(headers)))
        if ask_first:
            queue_commands(self.conn.client, parts[0])
            await self.conn.client._flush_pending()
            started, failed = await _answer(answers[first], wait, "the batch's first message")
            if failed is not None:
                return failed
            if "error" in started:
                return _failure_of(started["error"])
            parts = parts[1:]
        for part in parts:
            queue_commands(self.conn.client, part)
        await self.conn.client._flush_pending()
        ack, failed = await _answer(answers[commit], wait, "the commit")
        if failed is not None:
            return failed
        if "error" not in ack:
            return None, int(ack["seq"]), ""
        started = _json(answers[first].result()) if answers[first].done() else {}
        return _failure_of(started.get("error") or ack["error"])  # why the batch did not start, if it did not


async def _answer(
    future: asyncio.Future[bytes], wait: float, what: str
) -> tuple[dict[str, Any], tuple[int, int, str] | None]:
    """The JSON answer to ``what``, or how ``_send`` fails without one: none within ``wait`` (code 0), or 503."""
    try:
        answer = await asyncio.wait_for(future, wait)
    except TimeoutError:
        return {}, (0, 0, f"no answer to {what} within {wait:g}s")
    if answer.startswith(STATUS_PREFIX + b"503"):
        return {}, (NO_STREAM_LEADER, 0, "503, no responders (the stream has no leader right now)")
    return _json(answer), None


def _failure_of(error: dict[str, Any]) -> tuple[int, int, str]:
    return int(error.get("err_code") or -1), 0, f"{error.get('description')} (error {error.get('err_code')})"


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {"error": {"description": data[:200].decode(errors="replace"), "err_code": -1}}
    return value if isinstance(value, dict) else {}
