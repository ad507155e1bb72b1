"""The jetstream sink: ``df.write`` and ``df.writeStream`` ``.format("jetstream")``.

Each Spark task publishes its partition's rows pipelined (``publish.Publisher``) and checks every
PubAck; any failure fails the task with the subject and the server's reason. The protocol
commands for a whole slice of rows are built with Arrow compute kernels, so Python does no
per-row work unless the rows carry ``headers``.

Exactly-once for streaming writes has two parts:

* ``Nats-Msg-Id = <queryId>:<batchId>:<partition>:<row>`` (or the row's ``msg_id``): a batch
  replayed within the target stream's duplicate window is stored once, because the server drops
  the ids it has seen.
* A marker in a KV bucket (``commitBucket``, key ``<queryId>``): the driver's ``commit`` records
  the query's last committed batch, which Spark calls only after every task succeeded. Tasks read
  it first: a replayed batch that was committed (the crash came between the sink's commit and
  Spark's commit log) is skipped whole, however long after the window.

What neither covers: a batch that was published in part (or whole) but not committed, and is
replayed after the stream's duplicate window, stores what it had published again. There is no
per-task "partition done" marker on purpose: when the JVM dies, its Python workers (PySpark's
daemon runs them in their own process group) live on for about half a second, may take the cut
input for a normal end, publish the part they got and would record the partition as done, so a
replay would skip the rest (a test run with such markers lost 173 rows this way).
The ids also assume a replay puts the same rows in the same partitions and order (true for
deterministic plans over replayable sources, not after a shuffle); otherwise give each row a
``msg_id`` derived from its content.

Batch writes (``df.write``) use ``Nats-Msg-Id = <writeId>:<partition>:<row>`` with a random id
per ``save()``: Spark's task retries and speculative copies are stored once, while running the
job again is a new write (a batch job has no checkpoint to say what was written); give rows a
``msg_id`` to make re-runs within the duplicate window idempotent.
"""

from __future__ import annotations

import difflib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from .connection import Connection, ConnectionOptions, connect
from .errors import ApiError, ConnectError, JetStreamError, OptionError, SchemaError, StreamNotFoundError
from .jsapi import JetStreamApi
from .options import SUBJECT_PATTERN, WRITE, config_values, default_of, parse_options
from .publish import EXPECTED_STREAM_HEADER, MSG_ID_HEADER, Publisher, PublishError, header_lines
from .spark_compat import DataSourceArrowWriter, StreamWriterBase, WriterCommitMessage, record_batches

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
STREAM_NAME_EXISTS = 10058

_COLUMNS = ("subject", "data", "headers", "msg_id")


def _bin(value: bytes) -> pa.Scalar:
    return pa.scalar(value, pa.large_binary())


_CRLF = _bin(b"\r\n")
_EMPTY = _bin(b"")


@dataclass(frozen=True)
class SinkConfig:
    """Everything ``format("jetstream")`` was told for a write. Picklable; secrets stay out of repr."""

    connection: ConnectionOptions
    subject: str | None = None
    deduplicate: bool = default_of("deduplicate")
    expected_stream: str | None = None
    commit_bucket: str = default_of("commitBucket")
    commit_bucket_replicas: int = default_of("commitBucketReplicas")
    window: int = default_of("publishWindow")
    timeout: float = default_of("publishTimeout")

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SinkConfig:
        values = parse_options(raw, WRITE)
        return cls(connection=ConnectionOptions.from_options(values), **config_values(cls, values))


@dataclass(frozen=True)
class Columns:
    """Positions of the input columns the writer uses (None: absent)."""

    data: int
    subject: int | None = None
    headers: int | None = None
    msg_id: int | None = None


def check_columns(schema: StructType, config: SinkConfig) -> Columns:
    """Map the DataFrame's columns, or raise ``SchemaError`` naming the column and the accepted types.

    Runs on the driver when the write is planned, so nothing is published from a DataFrame that
    does not fit.
    """
    by_name = {f.name.lower(): (i, f) for i, f in enumerate(schema.fields)}
    for name in by_name:
        if name not in _COLUMNS:
            close = difflib.get_close_matches(name, _COLUMNS, n=1, cutoff=0.75)
            if close and close[0] not in by_name:
                raise SchemaError(
                    f"Column {name!r} is not used by the jetstream writer: did you mean {close[0]!r}? It reads "
                    "subject, data, headers and msg_id and ignores other columns."
                )

    def typed(name: str, accepted: dict[str, Callable[[DataType], bool]]) -> int | None:
        found = by_name.get(name)
        if found is None:
            return None
        index, field = found
        if not any(fits(field.dataType) for fits in accepted.values()):
            raise SchemaError(
                f"Column {name!r} has type {field.dataType.simpleString()}, but the jetstream writer accepts "
                f"{' or '.join(accepted)}: cast it."
            )
        return index

    def is_string(t: DataType) -> bool:
        return isinstance(t, StringType)

    def is_string_map(t: DataType) -> bool:
        return isinstance(t, MapType) and is_string(t.keyType) and is_string(t.valueType)

    def is_list_map(t: DataType) -> bool:
        return (
            isinstance(t, MapType)
            and is_string(t.keyType)
            and isinstance(t.valueType, ArrayType)
            and is_string(t.valueType.elementType)
        )

    data = typed("data", {"binary": lambda t: isinstance(t, BinaryType), "string": is_string})
    if data is None:
        raise SchemaError(
            "The DataFrame has no 'data' column: add the message payloads as a binary or string column named data."
        )
    subject = typed("subject", {"string": is_string})
    if subject is None and config.subject is None:
        raise SchemaError(
            "The DataFrame has no 'subject' column and the subject option is not set: add a string column named "
            "subject, or .option('subject', ...)."
        )
    headers = typed("headers", {"map<string,string>": is_string_map, "map<string,array<string>>": is_list_map})
    return Columns(data=data, subject=subject, headers=headers, msg_id=typed("msg_id", {"string": is_string}))


@dataclass
class WriteResult(WriterCommitMessage):
    """What one task did, reported to the driver's ``commit``."""

    partition: int
    published: int = 0
    duplicates: int = 0
    skipped: bool = False
    query_id: str | None = None
    batch_id: int | None = None


# -- the task side -------------------------------------------------------------------------------


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


class _Commands:
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

    def header_parts(self, rows: pa.RecordBatch, numbers: pa.Array) -> list[Part] | None:
        """The parts of each row's header block, or None when no row needs headers (plain PUB then)."""
        parts: list[Part] = []
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
        return [b"NATS/1.0\r\n", *parts, b"\r\n"] if parts else None

    def build(self, rows: pa.RecordBatch, first: int, reply_prefix: bytes) -> pa.Array:
        """The commands of ``rows`` (the task's rows ``first``.., reply tokens the same) as one array."""
        numbers = self.numbers(first, rows.num_rows)
        subjects = self.subjects(rows, first)
        data = rows.column(self.columns.data).cast(pa.large_binary()).fill_null(_EMPTY)
        header = self.header_parts(rows, numbers)
        if header is None:
            total = pc.binary_length(data)
            parts = [b"PUB ", subjects, b" ", reply_prefix, numbers, b" ", _text(total), b"\r\n", data, b"\r\n"]
        else:
            header_size = _length(header, rows.num_rows)
            total = pc.add(header_size, pc.binary_length(data))
            parts = [b"HPUB ", subjects, b" ", reply_prefix, numbers, b" ", _text(header_size), b" ", _text(total)]
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


def _value_range(array: pa.Array) -> memoryview:
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
    publisher = conn.run(Publisher(conn, config.window, config.timeout, seqs=False).open())
    commands = _Commands(config, columns, id_prefix, conn.client.max_payload)
    chunk = max(1, publisher.window // 2)
    try:
        for batch in batches:
            for start in range(0, batch.num_rows, chunk):
                rows = batch.slice(start, chunk)
                # This publisher's tokens count from 0, so they number the task's rows too.
                first = publisher.reserve(rows.num_rows, _subject_lookup(rows, columns, config))
                built = commands.build(rows, first, publisher.reply_prefix)
                conn.run(publisher.send(_value_range(built), rows.num_rows))
        result = conn.run(publisher.finish())
    finally:
        conn.run(publisher.close(), timeout=10)
    return result.count, result.duplicates


def _subject_lookup(rows: pa.RecordBatch, columns: Columns, config: SinkConfig) -> Any:
    """token offset -> subject, evaluated only to name the subject of a failed publish."""
    if columns.subject is None:
        return lambda _: config.subject or "?"
    column = rows.column(columns.subject)
    return lambda i: column[i].as_py() or config.subject or "?"


# -- KV markers ----------------------------------------------------------------------------------

_ensured: set[tuple[ConnectionOptions, str]] = set()
_ensured_lock = threading.Lock()


def ensure_bucket(conn: Connection, bucket: str, replicas: int) -> None:
    """Create the KV bucket of commit markers when missing (once per process)."""
    with _ensured_lock:
        if (conn.options, bucket) in _ensured:
            return
    api = JetStreamApi(conn)
    try:
        api.stream_info(f"KV_{bucket}")
    except StreamNotFoundError:
        config = {
            "name": f"KV_{bucket}",
            "subjects": [f"$KV.{bucket}.>"],
            "max_msgs_per_subject": 1,
            "discard": "new",
            "allow_rollup_hdrs": True,
            "deny_delete": True,
            "allow_direct": True,
            "num_replicas": replicas,
            "storage": "file",
            "duplicate_window": 120 * 1_000_000_000,
            "description": "spark-jetstream: the last committed batch of each streaming query",
        }
        try:
            api.create_stream(config)
        except ApiError as exc:
            if exc.err_code != STREAM_NAME_EXISTS:  # another process created it meanwhile
                raise
    with _ensured_lock:
        _ensured.add((conn.options, bucket))


def read_marker(conn: Connection, bucket: str, key: str) -> int:
    """The batch id stored under ``key`` (-1: none), read from the bucket's leader (read-after-write)."""
    try:
        entry = JetStreamApi(conn).last_message(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except StreamNotFoundError:
        return -1
    if entry is None or entry.headers.get("KV-Operation") in ("DEL", "PURGE"):
        return -1
    try:
        return int(entry.data)
    except ValueError:
        raise JetStreamError(
            f"KV bucket {bucket!r} holds {entry.data[:40]!r} under {key!r}, not a batch id: the bucket is used "
            "by something else; set commitBucket to another bucket."
        ) from None


def write_marker(conn: Connection, bucket: str, key: str, batch_id: int) -> None:
    subject = f"$KV.{bucket}.{key}"
    try:
        raw = conn.run(conn.request_async(subject, str(batch_id).encode(), conn.api_timeout))
    except ConnectError as exc:
        raise JetStreamError(
            f"Cannot record batch {batch_id} in KV bucket {bucket!r} (key {key}): {exc} Was the bucket deleted?"
        ) from None
    ack = json.loads(raw)
    if "error" in ack:
        raise JetStreamError(
            f"Cannot record batch {batch_id} in KV bucket {bucket!r} (key {key}): "
            f"{ack['error'].get('description')} (error {ack['error'].get('err_code')})."
        )


# -- Spark writers -------------------------------------------------------------------------------


def _drain(batches: Iterator[pa.RecordBatch]) -> int:
    return sum(batch.num_rows for batch in batches)


class JetStreamBatchWriter(DataSourceArrowWriter):
    """``df.write.format("jetstream")``: every row published, msg ids per save() (see module doc)."""

    def __init__(self, config: SinkConfig, columns: Columns) -> None:
        self.config = config
        self.columns = columns
        self.write_id = uuid.uuid4().hex  # made once on the driver: the same in every task and retry

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        conn = connect(self.config.connection)
        published, duplicates = publish_rows(conn, self.config, self.columns, iterator, f"{self.write_id}:{partition}:")
        return WriteResult(partition, published, duplicates)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        results = [m for m in messages if isinstance(m, WriteResult)]
        log.info(
            "jetstream write %s: %d messages stored (%d were duplicates) by %d tasks",
            self.write_id,
            sum(r.published for r in results),
            sum(r.duplicates for r in results),
            len(results),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        published = sum(m.published for m in messages if isinstance(m, WriteResult))
        log.warning(
            "jetstream write %s failed; %d messages of finished tasks stay in the stream (a stream has no rollback)",
            self.write_id,
            published,
        )


class JetStreamStreamWriter(StreamWriterBase):  # type: ignore[misc,valid-type]
    """``df.writeStream.format("jetstream")``: exactly-once with msg ids and KV markers (see module doc).

    PySpark 4.0 passes rows instead of Arrow batches: ``input_schema`` turns them into batches.
    """

    def __init__(self, config: SinkConfig, columns: Columns, input_schema: pa.Schema) -> None:
        self.config = config
        self.columns = columns
        self.input_schema = input_schema

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        from pyspark import TaskContext

        iterator = record_batches(iterator, self.input_schema)

        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch is None:
            raise JetStreamError("The streaming writer ran outside a streaming query (no query or batch id).")
        batch_id, partition = int(batch), context.partitionId()
        conn = connect(self.config.connection)
        bucket = self.config.commit_bucket
        committed = read_marker(conn, bucket, query_id)
        if committed >= batch_id:
            rows = _drain(iterator)
            log.info(
                "Skipping batch %d partition %d of query %s (%d rows): the sink committed it before (through batch %d)",
                batch_id,
                partition,
                query_id,
                rows,
                committed,
            )
            return WriteResult(partition, skipped=True, query_id=query_id, batch_id=batch_id)
        prefix = f"{query_id}:{batch_id}:{partition}:"
        published, duplicates = publish_rows(conn, self.config, self.columns, iterator, prefix)
        return WriteResult(partition, published, duplicates, query_id=query_id, batch_id=batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        results = [m for m in messages if isinstance(m, WriteResult)]
        query_id = next((r.query_id for r in results if r.query_id), None)
        if query_id is None:
            return  # no task ran: nothing was published, nothing to mark
        conn = connect(self.config.connection)
        ensure_bucket(conn, self.config.commit_bucket, self.config.commit_bucket_replicas)
        write_marker(conn, self.config.commit_bucket, query_id, batchId)
        log.info(
            "jetstream batch %d of query %s committed: %d messages stored (%d duplicates), %d partitions skipped",
            batchId,
            query_id,
            sum(r.published for r in results),
            sum(r.duplicates for r in results),
            sum(r.skipped for r in results),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("jetstream batch %d aborted: it is published again when the query replays it", batchId)


def batch_writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> JetStreamBatchWriter:
    """The writer of ``df.write``; a stream cannot be overwritten, so only append mode is accepted."""
    if overwrite:
        raise OptionError(
            "A JetStream stream cannot be overwritten: use .mode('append') (messages are added to the stream)."
        )
    config = SinkConfig.parse(options)
    return JetStreamBatchWriter(config, check_columns(schema, config))


def stream_writer(options: Mapping[str, str], schema: StructType) -> JetStreamStreamWriter:
    """The writer of ``df.writeStream``; makes sure the marker bucket exists before any task runs."""
    config = SinkConfig.parse(options)
    columns = check_columns(schema, config)
    ensure_bucket(connect(config.connection), config.commit_bucket, config.commit_bucket_replicas)
    from pyspark.sql.pandas.types import to_arrow_schema  # imports pandas: only where a stream is written

    return JetStreamStreamWriter(config, columns, to_arrow_schema(schema))
