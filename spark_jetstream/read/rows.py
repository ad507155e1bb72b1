"""The row schema in Arrow types and building Arrow record batches from read messages.

Messages are collected in the buffers of their Arrow columns (``RowBuffer``, which the bulk handlers append to) and
turned into Arrow columns in one step per batch. Spark requires the first batch's schema to equal the declared one
exactly: ``string``/``binary`` (not ``large_*``) and ``timestamp[us, UTC]``.

Columns are built from their buffers, not with ``pa.array``/``pa.scalar``: those import pandas the
first time they see a Python object (measured with pyarrow 22: ~0.2 s, in every fresh executor
worker, on the way to the first batch).
"""

from __future__ import annotations

import bisect
from array import array
from collections import deque
from collections.abc import Sequence
from functools import cache
from itertools import accumulate, pairwise
from typing import NamedTuple

import pyarrow as pa

from spark_jetstream.client.progress_markers import is_marker
from spark_jetstream.client.protocol import PIN_HEADER_NAME, header_fields
from spark_jetstream.read.row_schema import columns, spark_schema_ddl

__all__ = ["HEADERS_TYPE", "RowBatches", "RowBuffer", "arrow_schema", "parse_headers", "spark_schema_ddl", "texts"]

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
    """An int32 scalar (a Python int given to pyarrow goes through ``pa.scalar``)."""
    return pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(array("i", [i]))])[0]


_FIRST, _SECOND = _index(0), _index(1)


def repeated_string(value: str, n: int) -> pa.Array:
    """``value`` ``n`` times as a ``string`` array."""
    data = value.encode()
    one = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(array("i", [0, len(data)])), pa.py_buffer(data)])
    return pa.repeat(one[0], n)


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
    """``<p>.<rest>`` subjects (``binary``) -> the partition column and the subjects without their partition token
    (``string``). Where every subject has the first one's partition token (a partition's range), the token is cut
    off each and the partition repeated; else each subject is split."""
    import pyarrow.compute as pc

    first = subjects[0].as_py() if len(subjects) else b""
    token = first[: first.find(b".") + 1]
    if 1 < len(token) <= 10 and token[:-1].isdigit() and pc.all(pc.starts_with(subjects, token)).as_py():
        rest = pc.binary_slice(subjects, len(token), _MAX_OFFSET).cast(pa.string())
        return pa.repeat(_index(int(token[:-1])), len(subjects)), rest
    parts = pc.split_pattern(subjects.cast(pa.string()), ".", max_splits=1)
    return pc.list_element(parts, _FIRST).cast(pa.int32()), pc.list_element(parts, _SECOND)


def texts(values: bytearray, ends: array, start: int, stop: int) -> list[bytes]:
    """Rows ``[start, stop)`` of a column kept as texts back to back (``RowBuffer``), one ``bytes`` each."""
    return [bytes(values[low:high]) for low, high in pairwise(ends[start : stop + 1])]


class RowBuffer:
    """Columns of messages being collected for one record batch, in the buffers of their Arrow columns.

    The bulk handlers append runs of messages straight from the read buffer (``protocol.Columns``): payloads, subjects
    and kept header blocks back to back in a ``bytearray`` each with their ends in an ``array``, seqs and times in
    ``array`` objects. So a batch holds each value once, no object per message is made (decision 0033), and the Arrow
    columns are built without a copy. ``text_times``: the times are RFC 3339 text (Direct Get), parsed per batch;
    ``keep_headers``: header blocks are kept (an empty one: the message had none).
    """

    __slots__ = (
        "header_ends",
        "headers",
        "offsets",
        "payload",
        "seqs",
        "subject_ends",
        "subjects",
        "time_ends",
        "times",
    )

    def __init__(self, text_times: bool = False, keep_headers: bool = False) -> None:
        self.subjects = bytearray()
        self.subject_ends = array("i", [0])  # where each subject ends in ``subjects``
        self.payload = bytearray()
        self.offsets = array("i", [0])  # where each payload ends in ``payload``
        self.seqs = array("q")
        self.times: array | bytearray = bytearray() if text_times else array("q")  # ns since the epoch, or the texts
        self.time_ends = array("i", [0]) if text_times else None  # where each time's text ends in ``times``
        self.headers = bytearray() if keep_headers else None
        self.header_ends = array("i", [0]) if keep_headers else None  # where each header block ends in ``headers``

    def __len__(self) -> int:
        return len(self.seqs)

    def counted(self, rows: int) -> int:
        """The payload and header bytes of the first ``rows`` rows: what the byte bound counts."""
        return self.offsets[rows] + (self.header_ends[rows] if self.header_ends is not None else 0)

    @property
    def nbytes(self) -> int:
        """The payload and header bytes of all rows."""
        return self.counted(len(self.seqs))

    def add(
        self, subject: bytes, data: bytes | memoryview, seq: int, stamp: int | bytes, headers: bytes | None = None
    ) -> None:
        """One message (its header block, or None, is kept where this buffer keeps header blocks)."""
        self.subjects += subject
        self.subject_ends.append(len(self.subjects))
        self.payload += data
        self.offsets.append(len(self.payload))
        if self.headers is not None and self.header_ends is not None:
            self.headers += headers or b""
            self.header_ends.append(len(self.headers))
        self.seqs.append(seq)
        if self.time_ends is None:
            self.times.append(stamp)  # type: ignore[union-attr,arg-type]
        else:
            self.times += stamp  # type: ignore[operator]
            self.time_ends.append(len(self.times))

    def _text_columns(self) -> list[tuple[bytearray, array]]:
        """The columns kept as texts back to back, (values, ends) each: subjects, payloads, then header blocks and times
        where they are kept so."""
        columns = [(self.subjects, self.subject_ends), (self.payload, self.offsets)]
        columns.append((self.headers, self.header_ends))  # type: ignore[arg-type]
        columns.append((self.times, self.time_ends))  # type: ignore[arg-type]
        return [(values, ends) for values, ends in columns if ends is not None]

    def remove(self, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` out (the ends of the rows after them move back)."""
        if stop <= start:
            return
        for values, ends in self._text_columns():
            moved = ends[stop] - ends[start]
            del values[ends[start] : ends[stop]]
            ends[start + 1 :] = array("i", [end - moved for end in ends[stop + 1 :]])
        del self.seqs[start:stop]
        if self.time_ends is None:
            del self.times[start:stop]

    def cut(self, start: int, stop: int) -> RowBuffer:
        """Rows ``[start, stop)`` as a buffer of their own."""
        rows = RowBuffer(self.time_ends is not None, self.header_ends is not None)
        for (values, ends), (into, into_ends) in zip(self._text_columns(), rows._text_columns(), strict=True):
            into += values[ends[start] : ends[stop]]
            into_ends.extend([end - ends[start] for end in ends[start + 1 : stop + 1]])
        rows.seqs = self.seqs[start:stop]
        if self.time_ends is None:
            rows.times = self.times[start:stop]
        return rows

    def header_blocks(self) -> list[bytes | None]:
        """Each row's header block (None where it had none, or none are kept)."""
        if self.header_ends is None or self.headers is None:
            return [None] * len(self.seqs)
        return [block or None for block in texts(self.headers, self.header_ends, 0, len(self.seqs))]

    def data_array(self) -> pa.Array:
        """The data column, over ``payload`` itself (no copy): the buffer is done growing once this is built."""
        return _binary(self.payload, self.offsets, len(self.seqs))

    def to_record_batch(self, stream: str, partitioned: bool, include_headers: bool) -> pa.RecordBatch:
        """Build the batch; on a partitioned stream the leading partition token moves to its column."""
        n = len(self.seqs)
        keep = None  # which rows are read, when not all are (the group's; not the writer's markers)
        if self.time_ends is None:
            times = pa.Array.from_buffers(_NS_TIME, n, [None, pa.py_buffer(self.times)])
        else:  # the server's RFC 3339 text (ASCII: parsed as it is, or refused)
            offsets = pa.py_buffer(self.time_ends)  # type: ignore[arg-type]
            times = pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(self.times)]).cast(_NS_TIME)
        subjects = _binary(self.subjects, self.subject_ends, n)
        if partitioned:
            import pyarrow.compute as pc  # not at module level: the driver imports this module and needs no pc (~20 ms)

            try:
                partition, subjects = _split_partition(subjects)
            except pa.ArrowInvalid:  # read with ">": a message stored before the stream was partitioned is no
                keep = pc.match_substring_regex(subjects, "^[0-9]{1,9}[.]")  # partition's: no partition filter has it
                partition, subjects = _split_partition(pc.if_else(keep, subjects, b"0.-"))
        else:
            subjects = subjects.cast(pa.string())
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
            columns.append(headers_array(self.header_blocks()))
        batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
        return batch if keep is None else batch.filter(keep)


class Kept(NamedTuple):
    """What ``RowBatches.keep_in_order`` kept of a run."""

    last: int
    """The last seq kept (the one before, when none was)."""
    count: int
    past_end: bool
    """Whether one past the end came (the range is complete; what follows it is not read)."""


class RowBatches:
    """Messages collected into record batches of at most ``max_rows`` rows and ``max_bytes`` payload and
    header bytes each: what bounds a reader's memory and the Arrow batches Spark moves through its
    direct memory, whatever the message size. A single message larger than ``max_bytes`` gets a batch
    of its own. Full batches wait in ``ready`` for the caller.

    The bulk handlers append runs to ``rows`` (``protocol.Target``); ``keep`` then says which of the run are rows and
    cuts the batches."""

    __slots__ = ("keep_headers", "max_bytes", "max_rows", "ready", "rows", "text_times")

    def __init__(self, max_rows: int, max_bytes: int, keep_headers: bool, text_times: bool = False) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.keep_headers = keep_headers
        self.text_times = text_times  # the times come as RFC 3339 text (``RowBuffer``)
        self.rows = RowBuffer(text_times, keep_headers)
        self.ready: deque[RowBuffer] = deque()

    def add(
        self, subject: bytes, data: bytes | memoryview, seq: int, stamp: int | bytes, headers: bytes | None
    ) -> None:
        """One message (its header block, or None, counts only for a read that keeps headers)."""
        first = len(self.rows)
        self.rows.add(subject, data, seq, stamp, headers)
        self.keep(first, first, first + 1)

    def keep(self, first: int, low: int, high: int) -> None:
        """Of the rows appended to ``rows`` from ``first`` on, keep ``[low, high)``; then cut the batches the bounds
        allow, as one message at a time would fill them."""
        rows = self.rows
        rows.remove(high, len(rows))
        rows.remove(first, low)
        self._bound(first)

    def keep_in_order(self, first: int, last: int, end: int, stop: int | None = None) -> Kept:
        """Of the run appended to ``rows`` from ``first`` on (seqs ascending), before row ``stop`` (all by default),
        keep the rows in ``(last, end]``: lower ones were read already (redeliveries), and one past ``end`` completes
        the range."""
        seqs = self.rows.seqs
        stop = len(seqs) if stop is None else min(stop, len(seqs))
        low = bisect.bisect_right(seqs, last, first, stop)
        high = bisect.bisect_right(seqs, end, low, stop)
        kept = Kept(seqs[high - 1] if high > low else last, high - low, high < stop)
        self.keep(first, low, high)
        return kept

    def _bound(self, first: int) -> None:
        """Cut ``rows``, whose rows from ``first`` on are new, into batches of at most ``max_rows`` rows and
        ``max_bytes`` bytes (at least one row each): the full ones go to ``ready``, the last one is filled next."""
        rows = self.rows
        count = len(rows)
        if count == first:
            return
        starts = [0]  # where each batch starts
        while True:
            start = starts[-1]
            last = min(count, start + self.max_rows)  # the most rows it may end at
            fit = bisect.bisect_right(range(first, last + 1), rows.counted(start) + self.max_bytes, key=rows.counted)
            stop = max(start + 1, first + fit - 1)  # where it ends: as many as the bounds allow, at least one
            if stop == count and stop - start < self.max_rows:
                break  # not full: filled next
            starts.append(stop)
            if stop == count:
                break
        if len(starts) == 1:
            return
        pieces = [rows.cut(start, stop) for start, stop in pairwise([*starts[1:], count])]
        rows.remove(starts[1], count)
        self.ready.append(rows)
        self.ready.extend(pieces[:-1])
        self.rows = pieces[-1]

    def flush(self) -> None:
        """The rows collected so far become a batch of their own (the read is complete)."""
        if self.rows.seqs:
            self.ready.append(self.rows)
            self.rows = RowBuffer(self.text_times, self.keep_headers)

    def buffered(self) -> tuple[int, int]:
        """Rows and bytes waiting for the caller."""
        waiting = [self.rows, *self.ready]
        return sum(len(rows) for rows in waiting), sum(rows.nbytes for rows in waiting)
