"""The PUB/HPUB commands of a write task, built for whole slices of rows with Arrow kernels.

Python does no per-row work unless the rows carry ``headers``; ``publish_rows`` sends the built
commands through one pipelined ``Publisher`` and checks every PubAck. No Spark here: the commands are
a pure rule over Arrow batches (``tests/test_publishing.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.protocol import HEADER_START
from spark_jetstream.client.publish import (
    BATCH_ID_HEADER,
    BATCH_SEQUENCE_HEADER,
    EXPECTED_STREAM_HEADER,
    MSG_ID_HEADER,
    Publisher,
    PublishError,
    header_lines,
)
from spark_jetstream.options import SUBJECT_PATTERN

if TYPE_CHECKING:
    from spark_jetstream.sink.config import Columns, SinkConfig


def _bin(value: bytes) -> pa.Scalar:
    return pa.scalar(value, pa.large_binary())


_EMPTY = _bin(b"")


Part = bytes | pa.Array
"""A piece of every row's command: the same bytes for all rows, or one value per row."""


def _join(parts: list[Part]) -> pa.Array:
    """Concatenate the parts row by row in one kernel call (adjacent constant bytes merged first)."""
    merged: list[Part] = []
    for part in parts:
        if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] += part
        else:
            merged.append(part)
    return pc.binary_join_element_wise(*(_bin(p) if isinstance(p, bytes) else p for p in merged), _EMPTY)


def _length(parts: list[Part], rows: int) -> pa.Array:
    """The byte length of every row's concatenation of ``parts``."""
    total = pa.repeat(pa.scalar(sum(len(p) for p in parts if isinstance(p, bytes)), pa.int64()), rows)
    for part in parts:
        if not isinstance(part, bytes):
            total = pc.add(total, pc.binary_length(part))
    return total


class Commands:
    """Builds PUB/HPUB commands for a slice of rows with Arrow kernels (no per-row Python).

    Every command is a flat list of parts joined by one kernel call; the row number within the
    task serves as both the reply token and the generated msg id's last field.
    """

    def __init__(self, config: SinkConfig, columns: Columns, id_prefix: str | None, max_payload: int) -> None:
        self.config = config
        self.columns = columns
        self.id_prefix = id_prefix.encode() if id_prefix is not None else None
        self.max_payload = max_payload
        expected = config.expected_stream
        self.expected_line = f"{EXPECTED_STREAM_HEADER}: {expected}\r\n".encode() if expected else None
        self._counting = pa.array([], pa.int64())

    @property
    def every_row_has_an_id(self) -> bool:
        """Every message carries a ``Nats-Msg-Id`` (generated where a row has none): safe to send again."""
        return self.id_prefix is not None and self.config.deduplicate

    def numbers(self, first: int, count: int) -> pa.Array:
        """``first .. first + count - 1`` as text (an arange is built once, not per slice)."""
        if len(self._counting) < count:
            self._counting = pa.array(range(count), pa.int64())
        return _text(pc.add(self._counting.slice(0, count), first))

    def subjects(self, rows: pa.RecordBatch, first: int) -> Part:
        if self.columns.subject is None:
            assert self.config.subject is not None
            return self.config.subject.encode()
        subjects = rows.column(self.columns.subject).cast(pa.large_string())
        if subjects.null_count:
            if self.config.subject is None:
                row = first + subjects.is_null().to_pylist().index(True)
                raise PublishError(
                    f"Row {row} of this task's partition has a null subject and the subject option is not set: "
                    "fill the subject column or set .option('subject', ...)."
                )
            subjects = subjects.fill_null(self.config.subject)
        distinct = pc.unique(subjects)  # usually far fewer than the rows: check each subject once
        valid = pc.match_substring_regex(distinct, SUBJECT_PATTERN)
        if not pc.all(valid).as_py():
            bad = distinct[valid.to_pylist().index(False)].as_py()
            raise PublishError(
                f"Cannot publish to subject {bad!r}: a subject is dot-separated tokens without spaces, empty "
                "tokens or wildcards. Fix the subject column."
            )
        return subjects.cast(pa.large_binary())

    def header_parts(self, rows: pa.RecordBatch, numbers: pa.Array, batch: str | None = None) -> list[Part] | None:
        """The parts of each row's header block, or None when no row needs headers (plain PUB then). With ``batch``,
        the rows are messages of that atomic batch, ``numbers`` their places in it."""
        parts: list[Part] = []
        if batch is not None:
            parts += [f"{BATCH_ID_HEADER}: {batch}\r\n{BATCH_SEQUENCE_HEADER}: ".encode(), numbers, b"\r\n"]
        has_id_header: list[bool] | None = None
        if self.columns.headers is not None:
            lines, has_id_header = [], []
            for entry in rows.column(self.columns.headers).to_pylist():
                lines.append(header_lines(entry) if entry else b"")
                has_id_header.append(bool(entry) and any(key == MSG_ID_HEADER for key, _ in entry))
            parts.append(pa.array(lines, pa.large_binary()))
        given = None
        if self.columns.msg_id is not None:
            given = rows.column(self.columns.msg_id).cast(pa.large_binary())
            if pc.any(pc.match_substring_regex(given.cast(pa.large_string()), r"[\r\n]")).as_py():
                raise PublishError("A msg_id contains a line break, which NATS headers cannot carry: remove it.")
        prefix = self.id_prefix if self.config.deduplicate else None  # generated ids: prefix + row number
        own_ids = has_id_header is not None and any(has_id_header)  # a row's own Nats-Msg-Id header wins
        if prefix is not None and given is None and not own_ids:  # the usual case: no per-row choice to make
            parts += [f"{MSG_ID_HEADER}: ".encode() + prefix, numbers, b"\r\n"]
        elif prefix is not None or given is not None:
            ids = _join([prefix, numbers]) if prefix is not None else None
            if given is not None:
                ids = given if ids is None else pc.coalesce(given, ids)
            line = _join([f"{MSG_ID_HEADER}: ".encode(), ids, b"\r\n"])
            if own_ids:
                line = pc.if_else(pa.array(has_id_header), _EMPTY, line)
            parts.append(line.fill_null(_EMPTY))
        if self.expected_line is not None:
            parts.append(self.expected_line)
        return [HEADER_START, *parts, b"\r\n"] if parts else None

    def build(self, rows: pa.RecordBatch, first: int, reply_prefix: bytes | None, batch: str | None = None) -> pa.Array:
        """The commands of ``rows`` (the task's rows ``first``.., reply tokens the same; no reply without
        ``reply_prefix``) as one array. With ``batch``, messages ``first``.. of that atomic batch."""
        numbers = self.numbers(first, rows.num_rows)
        subjects = self.subjects(rows, first)
        data = rows.column(self.columns.data).cast(pa.large_binary()).fill_null(_EMPTY)
        header = self.header_parts(rows, numbers, batch)
        reply: list[Part] = [] if reply_prefix is None else [reply_prefix, numbers, b" "]
        if header is None:
            total = pc.binary_length(data)
            parts = [b"PUB ", subjects, b" ", *reply, _text(total), b"\r\n", data, b"\r\n"]
        else:
            header_size = _length(header, rows.num_rows)
            total = pc.add(header_size, pc.binary_length(data))
            parts = [b"HPUB ", subjects, b" ", *reply, _text(header_size), b" ", _text(total)]
            parts += [b"\r\n", *header, data, b"\r\n"]
        too_big = pc.greater(total, self.max_payload)
        if pc.any(too_big).as_py():
            index = too_big.to_pylist().index(True)
            subject = subjects if isinstance(subjects, bytes) else subjects[index].as_py()
            raise PublishError(
                f"Row {first + index} for subject {subject.decode()!r} has {total[index].as_py():,} bytes with "
                f"headers, more than the server's max_payload ({self.max_payload:,}): split the payload or raise "
                "max_payload."
            )
        return _join(parts)


def _text(numbers: pa.Array) -> pa.Array:
    return numbers.cast(pa.large_string()).cast(pa.large_binary())


def value_range(array: pa.Array) -> memoryview:
    """The bytes of all values of a fresh large_binary array, without copying."""
    _, offsets, values = array.buffers()
    bounds = pa.Array.from_buffers(pa.int64(), len(array) + 1, [None, offsets], offset=array.offset)
    return memoryview(values)[bounds[0].as_py() : bounds[len(array)].as_py()]


def publish_rows(
    conn: Connection,
    config: SinkConfig,
    columns: Columns,
    batches: Iterator[pa.RecordBatch],
    id_prefix: str | None,
) -> tuple[int, int]:
    """Publish every row pipelined; return (messages stored, of which duplicates). Raises ``PublishError``."""
    commands = Commands(config, columns, id_prefix, conn.client.max_payload)
    resend = commands.every_row_has_an_id
    publisher = conn.run(Publisher(conn, config.window, config.timeout, False, config.window_bytes, resend).open())
    chunk, chunk_bytes = max(1, publisher.window // 2), max(1, publisher.window_bytes // 2)
    try:
        for batch in batches:
            payload_ends = pc.cumulative_sum(pc.binary_length(batch.column(columns.data)).fill_null(0)).to_pylist()
            for start, length in slices(payload_ends, chunk, chunk_bytes):
                rows = batch.slice(start, length)
                # This publisher's tokens count from 0, so they number the task's rows too.
                first = publisher.reserve(rows.num_rows, _subject_lookup(rows, columns, config))
                built = commands.build(rows, first, publisher.reply_prefix)
                conn.run(publisher.send(value_range(built), rows.num_rows))
        result = conn.run(publisher.finish())
    finally:
        conn.run(publisher.close(), timeout=10)
    return result.count, result.duplicates


def slices(payload_ends: list[int], max_rows: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """(first row, rows) of consecutive slices of at most ``max_rows`` rows and ``max_bytes`` payload bytes
    (``payload_ends``: the running total of the rows' payload sizes); a larger row is a slice of its own."""
    start, count = 0, len(payload_ends)
    while start < count:
        before = payload_ends[start - 1] if start else 0
        stop = bisect.bisect_right(payload_ends, before + max_bytes, start, min(count, start + max_rows))
        stop = max(stop, start + 1)
        yield start, stop - start
        start = stop


def _subject_lookup(rows: pa.RecordBatch, columns: Columns, config: SinkConfig) -> Any:
    """token offset -> subject, evaluated only to name the subject of a failed publish. Over a copy of the
    slice's subjects: Spark's batches arrive as one IPC body, which any slice of a column keeps alive."""
    if columns.subject is None:
        return lambda _: config.subject or "?"
    column = pa.concat_arrays([rows.column(columns.subject)])
    return lambda i: column[i].as_py() or config.subject or "?"
