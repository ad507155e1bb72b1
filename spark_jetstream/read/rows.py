"""The row schema in Arrow types and building Arrow record batches from read messages.

Messages are collected as raw bytes in plain lists (cheap on the hot path) and turned into
Arrow columns in one step per batch. Spark requires the first batch's schema to equal the
declared one exactly: ``string``/``binary`` (not ``large_*``) and ``timestamp[us, UTC]``.

Columns are built from their buffers, not with ``pa.array``/``pa.scalar``: those import pandas the
first time they see a Python object (measured with pyarrow 22: ~0.2 s, in every fresh executor
worker, on the way to the first batch).
"""

from __future__ import annotations

import bisect
import operator
from array import array
from collections import deque
from collections.abc import Sequence
from functools import cache
from itertools import accumulate, islice
from typing import TypeVar

import pyarrow as pa

from spark_jetstream.client.progress_markers import is_marker
from spark_jetstream.client.protocol import PIN_HEADER_NAME, header_fields
from spark_jetstream.read.row_schema import columns, spark_schema_ddl

T = TypeVar("T")

__all__ = ["HEADERS_TYPE", "RowBatches", "RowBuffer", "arrow_schema", "parse_headers", "spark_schema_ddl"]

HEADERS_TYPE = pa.map_(pa.string(), pa.list_(pa.string()))

_ARROW_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,array<string>>": HEADERS_TYPE,
}

INTERNAL_HEADERS = frozenset({PIN_HEADER_NAME})
"""Headers the server adds on delivery; they are not part of the stored message."""


@cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    """The row schema (``row_schema.columns``) in Arrow types."""
    return pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in columns(include_headers)])


def parse_headers(block: bytes | None) -> list[tuple[str, list[str]]]:
    """A raw NATS header block -> ``[(key, [values...]), ...]`` in first-seen key order.

    Repeated keys keep every value; delivery-only headers (the pin id) are dropped.
    """
    if not block:
        return []
    grouped: dict[str, list[str]] = {}
    for key, value in header_fields(block):
        if key not in INTERNAL_HEADERS:
            grouped.setdefault(key, []).append(value)
    return list(grouped.items())


_MAX_OFFSET = 2**31 - 1  # 32-bit offsets of ``string``/``binary``
_NS_TIME = pa.timestamp("ns", tz="UTC")  # the times as a read keeps them, before the schema's microseconds


def binary_array(values: Sequence[bytes]) -> pa.Array:
    """``pa.array(values, pa.binary())``, built from its buffers (``.cast(pa.string())`` checks UTF-8)."""
    offsets = array("i", [0])
    ends = list(accumulate(map(len, values)))
    if ends and ends[-1] > _MAX_OFFSET:  # more than 32-bit offsets can hold: pa.array's own handling
        return pa.array(values, pa.binary())
    offsets.extend(ends)
    return _binary(b"".join(values), offsets, len(values))


def _binary(values: bytes | bytearray, ends: array, n: int) -> pa.Array:
    """The binary column over its values buffer and its ``n + 1`` offsets (no copy)."""
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends), pa.py_buffer(values)])


def _index(i: int) -> pa.Scalar:
    """An int32 scalar for ``pc.list_element`` (a Python int there goes through ``pa.scalar``)."""
    return pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(array("i", [i]))])[0]


_FIRST, _SECOND = _index(0), _index(1)


def repeated_string(value: str, n: int) -> pa.Array:
    """``value`` ``n`` times as a ``string`` array."""
    data = value.encode()
    if n * len(data) > _MAX_OFFSET:
        return pa.array([value] * n, pa.string())
    offsets = array("i", range(0, (n + 1) * len(data), len(data))) if data else array("i", bytes(4 * (n + 1)))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


def headers_array(blocks: Sequence[bytes | None]) -> pa.Array:
    """``pa.array([parse_headers(b) for b in blocks], HEADERS_TYPE)``, built from its parts."""
    if not any(blocks):  # no message has headers (a KV bucket's puts): empty maps, nothing to parse
        empty = pa.array([], pa.string())
        values = pa.ListArray.from_arrays(_offsets([]), empty)
        return pa.MapArray.from_arrays(_offsets([0] * len(blocks)), empty, values)
    keys: list[bytes] = []
    values: list[bytes] = []
    map_ends: list[int] = []
    value_ends: list[int] = []
    for block in blocks:
        for key, found in parse_headers(block):
            keys.append(key.encode())
            values.extend(value.encode() for value in found)
            value_ends.append(len(values))
        map_ends.append(len(keys))
    lists = pa.ListArray.from_arrays(_offsets(value_ends), binary_array(values).cast(pa.string()))
    return pa.MapArray.from_arrays(_offsets(map_ends), binary_array(keys).cast(pa.string()), lists)


def _offsets(ends: list[int]) -> pa.Array:
    """An int32 offsets array: 0, then ``ends``."""
    offsets = array("i", [0])
    offsets.extend(ends)
    return pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)])


def _split_partition(subjects: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``<p>.<rest>`` subjects -> the partition column and the subjects without their partition token."""
    import pyarrow.compute as pc

    parts = pc.split_pattern(subjects, ".", max_splits=1)
    return pc.list_element(parts, _FIRST).cast(pa.int32()), pc.list_element(parts, _SECOND)


def _append_texts(values: bytearray, ends: array, texts: Sequence[bytes]) -> None:
    """``texts`` back to back onto ``values``, each one's end onto ``ends``: a binary column's buffers."""
    ends.extend(islice(accumulate(map(len, texts), initial=len(values)), 1, None))
    values += b"".join(texts)


class RowBuffer:
    """Columns of messages being collected for one record batch, in the buffers of their Arrow columns.

    Payloads are copied straight from the read buffer into one ``bytearray`` (the data column's values buffer), a
    run's subjects joined onto another and its seqs and times onto ``array``s, so a batch holds each value once, no
    object per message outlives its run (measured: the record batch is built in half the time), and the Arrow
    columns are built without a copy. ``text_times``: the times are RFC 3339 text (Direct Get), parsed per batch.
    """

    __slots__ = ("headers", "nbytes", "offsets", "payload", "seqs", "subject_ends", "subjects", "time_ends", "times")

    def __init__(self, text_times: bool = False) -> None:
        self.nbytes = 0  # payload and header bytes: what the byte bound counts
        self.subjects = bytearray()
        self.subject_ends = array("i", [0])  # where each subject ends in ``subjects``
        self.payload = bytearray()
        self.offsets = array("i", [0])  # where each payload ends in ``payload``
        self.seqs = array("q")
        self.times: array | bytearray = bytearray() if text_times else array("q")  # ns since the epoch, or the texts
        self.time_ends = array("i", [0]) if text_times else None  # where each time's text ends in ``times``
        self.headers: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, subject: bytes, data: bytes | memoryview, seq: int, stamp: int | bytes) -> None:
        self.extend([subject], [data], [len(self.payload) + len(data)], [seq], [stamp])
        self.nbytes += len(data)

    def extend(
        self,
        subjects: Sequence[bytes],
        payloads: Sequence[bytes | memoryview],
        ends: Sequence[int],
        seqs: Sequence[int],
        stamps: Sequence,
    ) -> None:
        """``add`` for each message of a run (``ends``: where each payload ends in ``payload``); the caller counts
        ``nbytes``."""
        payload = self.payload
        self.offsets.extend(ends)
        for data in payloads:  # straight from the read buffer into the column
            payload += data
        _append_texts(self.subjects, self.subject_ends, subjects)
        self.seqs.extend(seqs)
        if self.time_ends is None:
            self.times.extend(stamps)  # type: ignore[arg-type]
        else:
            _append_texts(self.times, self.time_ends, stamps)  # type: ignore[arg-type]

    def data_array(self) -> pa.Array:
        """The data column, over ``payload`` itself (no copy): the buffer is done growing once this is built."""
        return _binary(self.payload, self.offsets, len(self.seqs))

    def to_record_batch(self, stream: str, partitioned: bool, include_headers: bool) -> pa.RecordBatch:
        """Build the batch; on a partitioned stream the leading partition token moves to its column."""
        n = len(self.seqs)
        keep = None  # which rows are read, when not all are (the group's; not the writer's markers)
        if self.time_ends is None:
            times = pa.Array.from_buffers(_NS_TIME, n, [None, pa.py_buffer(self.times)])
        else:
            times = _binary(self.times, self.time_ends, n).cast(pa.string()).cast(_NS_TIME)  # type: ignore[arg-type]
        subjects = _binary(self.subjects, self.subject_ends, n).cast(pa.string())
        if partitioned:
            import pyarrow.compute as pc  # not at module level: the driver imports this module and needs no pc (~20 ms)

            try:
                partition, subjects = _split_partition(subjects)
            except pa.ArrowInvalid:  # read with ">": a message stored before the stream was partitioned is no
                keep = pc.match_substring_regex(subjects, "^[0-9]{1,9}[.]")  # partition's: no partition filter has it
                partition, subjects = _split_partition(pc.if_else(keep, subjects, "0.-"))
        else:
            partition = pa.nulls(n, pa.int32())
        if (markers := is_marker(subjects)) is not None:  # the exactly-once writer's bookkeeping, not data
            import pyarrow.compute as pc

            keep = pc.invert(markers) if keep is None else pc.and_(keep, pc.invert(markers))
        columns = [
            subjects,
            self.data_array(),
            repeated_string(stream, n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.seqs)]),
            times.cast(pa.timestamp("us", tz="UTC"), safe=False),
            partition,
        ]
        if include_headers:
            columns.append(headers_array(self.headers))
        batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
        return batch if keep is None else batch.filter(keep)


class RowBatches:
    """Messages collected into record batches of at most ``max_rows`` rows and ``max_bytes`` payload and
    header bytes each: what bounds a reader's memory and the Arrow batches Spark moves through its
    direct memory, whatever the message size. A single message larger than ``max_bytes`` gets a batch
    of its own. Full batches wait in ``ready`` for the caller."""

    __slots__ = ("keep_headers", "max_bytes", "max_rows", "ready", "rows", "text_times")

    def __init__(self, max_rows: int, max_bytes: int, keep_headers: bool, text_times: bool = False) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.keep_headers = keep_headers
        self.text_times = text_times  # the times come as RFC 3339 text (``RowBuffer``)
        self.rows = RowBuffer(text_times)
        self.ready: deque[RowBuffer] = deque()

    def add(
        self, subject: bytes, data: bytes | memoryview, seq: int, stamp: int | bytes, headers: bytes | None
    ) -> None:
        """One message (its header block, or None, counts only for a read that keeps headers)."""
        headers_size = len(headers) if headers is not None and self.keep_headers else 0
        rows = self.rows
        if rows.seqs and rows.nbytes + len(data) + headers_size > self.max_bytes:
            self.ready.append(rows)
            rows = self.rows = RowBuffer(self.text_times)
        rows.add(subject, data, seq, stamp)
        if self.keep_headers:
            rows.headers.append(headers)
            rows.nbytes += headers_size
        if len(rows.seqs) >= self.max_rows:
            self.ready.append(rows)
            self.rows = RowBuffer(self.text_times)

    def extend(
        self,
        subjects: Sequence[bytes],
        payloads: Sequence[bytes | memoryview],
        seqs: Sequence[int],
        stamps: Sequence,
        headers: Sequence[bytes | None] | None,
    ) -> None:
        """A run of messages, bounded as ``add`` bounds each one: what fits goes into the current batch in one
        step (the hot path's), the rest into the next ones."""
        keep_headers = self.keep_headers and headers is not None
        sizes = list(map(len, payloads))
        counted = sizes  # what the byte bound counts
        if keep_headers:
            counted = [size + len(block or b"") for size, block in zip(sizes, headers, strict=True)]  # type: ignore[arg-type]
        first, count = 0, len(seqs)
        while first < count:
            rows = self.rows
            last = min(count, first + self.max_rows - len(rows.seqs))
            ends = list(accumulate(counted[first:last], initial=rows.nbytes))
            fit = max(0, bisect.bisect_right(ends, self.max_bytes) - 1)  # how many of them fit in the byte bound
            if fit == 0 and not rows.seqs:
                fit = 1  # a message larger than the bound gets a batch of its own
            stop = first + fit
            if self.keep_headers:  # the byte bound counts headers too: the payloads' ends are their own sums
                payload_ends = list(islice(accumulate(sizes[first:stop], initial=len(rows.payload)), 1, None))
            else:  # the byte count is the payload's length: its sums are the payloads' ends
                payload_ends = ends[1 : fit + 1]
            rows.extend(subjects[first:stop], payloads[first:stop], payload_ends, seqs[first:stop], stamps[first:stop])
            rows.nbytes = ends[fit]
            if keep_headers:
                rows.headers.extend(headers[first:stop])  # type: ignore[index]
            if stop < count or len(rows.seqs) >= self.max_rows:
                if rows.seqs:
                    self.ready.append(rows)
                self.rows = RowBuffer(self.text_times)
            first = stop

    def extend_in_order(
        self,
        subjects: list[bytes],
        payloads: list[memoryview],
        seqs: list[int],
        stamps: list[int],
        headers: list[memoryview | None],
        last: int,
        end: int,
    ) -> tuple[int, bool]:
        """A run of deliveries into the rows: those in ``(last, end]`` above every one before them (lower ones are
        redeliveries). Returns the last seq kept (``last`` when none) and whether one past ``end`` came (the range
        is complete; what follows it is not read). ``headers`` holds each one's header block where kept."""
        keep, past_end = _in_order(seqs, last, end)
        kept = _pick(seqs, keep)
        if not kept:
            return last, past_end
        blocks = None
        if self.keep_headers:
            blocks = [None if block is None else bytes(block) for block in _pick(headers, keep)]
        self.extend(_pick(subjects, keep), _pick(payloads, keep), kept, _pick(stamps, keep), blocks)
        return kept[-1], past_end

    def flush(self) -> None:
        """The rows collected so far become a batch of their own (the read is complete)."""
        if self.rows.seqs:
            self.ready.append(self.rows)
            self.rows = RowBuffer(self.text_times)

    def buffered(self) -> tuple[int, int]:
        """Rows and bytes waiting for the caller."""
        waiting = [self.rows, *self.ready]
        return sum(len(rows) for rows in waiting), sum(rows.nbytes for rows in waiting)


def _in_order(seqs: Sequence[int], last: int, end: int) -> tuple[slice | list[int], bool]:
    """Which of a run's seqs ``extend_in_order`` keeps, and whether one past ``end`` came."""
    if all(map(operator.lt, seqs, islice(seqs, 1, None))):  # ascending: the usual run
        first, stop = bisect.bisect_right(seqs, last), bisect.bisect_right(seqs, end)
        return slice(first, stop), stop < len(seqs)
    keep = []
    for index, seq in enumerate(seqs):
        if seq > end:
            return keep, True
        if seq > last:
            keep.append(index)
            last = seq
    return keep, False


def _pick(values: list[T], which: slice | list[int]) -> list[T]:
    """``values[which]`` for ``_in_order``'s answer."""
    return values[which] if isinstance(which, slice) else [values[index] for index in which]
