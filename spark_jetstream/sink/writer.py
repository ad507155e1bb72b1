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
replayed after the stream's duplicate window, stores what it had published again. ``progressSubject`` on a stream
with ``allow_atomic`` covers that too (``sink.atomic``: atomic batches with per-task progress markers, instead of
the ids and the KV marker); the driver decides which writer a write gets before any task runs. There is no
per-task "partition done" marker on purpose: when the JVM dies, its Python workers (PySpark's
daemon runs them in their own process group) live on for about half a second, may take the cut
input for a normal end, publish the part they got and would record the partition as done, so a
replay would skip the rest (a test run with such markers lost 173 rows this way).
The ids need a replay to put the same rows in the same partitions and order: of the source, that it replays a
micro-batch as it first cut it (the jetstream source records each batch's cut in its end offset, decision 0042; a
file source replays its files); of the user's plan, that it is deterministic (no ``rand()``, no shuffle or union
whose order varies). Otherwise a replayed row at a position whose id was stored is dropped as a duplicate, silently:
give each row a ``msg_id`` derived from its content. (The progress markers check it: their rows' fingerprint.)

Batch writes (``df.write``) use ``Nats-Msg-Id = <writeId>:<partition>:<row>`` with a random id
per ``save()``: Spark's task retries and speculative copies are stored once, while running the
job again is a new write (a batch job has no checkpoint to say what was written); give rows a
``msg_id`` to make re-runs within the duplicate window idempotent. With ``progressSubject`` the write id names the
tasks' markers instead: retries and speculative copies continue after the rows stored.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from spark_jetstream.client.connection import Connection, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import JetStreamError, NotPermittedError, OptionError, surfaced
from spark_jetstream.sink.atomic import AtomicWriter, ProgressTarget, progress_target
from spark_jetstream.sink.config import Columns, SinkConfig, check_columns
from spark_jetstream.sink.kv import KvColumns, check_kv_columns, publish_kv
from spark_jetstream.sink.markers import ensure_bucket, forget_progress, read_marker, write_marker
from spark_jetstream.sink.publishing import Commands, publish_rows
from spark_jetstream.spark_compat import DataSourceArrowWriter, StreamWriterBase, WriterCommitMessage, record_batches
from spark_jetstream.worker_heap import settle

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class WriteResult(WriterCommitMessage):
    """What one task did, reported to the driver's ``commit``."""

    partition: int
    published: int = 0
    duplicates: int = 0
    skipped: bool = False
    query_id: str | None = None
    batch_id: int | None = None


def _drain(batches: Iterator[pa.RecordBatch]) -> int:
    return sum(batch.num_rows for batch in batches)


def _publish(
    conn: Connection,
    config: SinkConfig,
    columns: Columns | KvColumns,
    batches: Iterator[pa.RecordBatch],
    id_prefix: str,
) -> tuple[int, int]:
    """``publish_rows`` of a task's rows; a bucket's rows as its messages (``sink.kv``)."""
    if isinstance(columns, KvColumns):
        return publish_kv(conn, config, columns, batches, id_prefix)
    return publish_rows(conn, config, columns, batches, id_prefix)


def _write_atomic(
    conn: Connection,
    config: SinkConfig,
    columns: Columns,
    target: ProgressTarget,
    sink: str,
    batch_id: int,
    partition: int,
    batches: Iterator[pa.RecordBatch],
) -> WriteResult:
    """A task's rows in atomic batches with its progress marker (``sink.atomic``)."""
    commands = Commands(config, columns, None, conn.client.max_payload)  # no generated ids: the marker decides
    writer = AtomicWriter(conn, commands, target, sink, batch_id, partition, config.timeout, config.window_bytes)
    result = writer.write(batches)
    if result.stale:
        rows = _drain(batches)
        log.info(
            "Partition %d of %s batch %d is obsolete (its marker is of a later batch): %d rows not written",
            partition,
            sink,
            batch_id,
            rows,
        )
    elif result.skipped:
        log.info(
            "Partition %d of %s batch %d: %d rows were stored before (by an earlier or concurrent attempt)",
            partition,
            sink,
            batch_id,
            result.skipped,
        )
    return WriteResult(partition, result.published, skipped=result.stale, batch_id=batch_id)


@surfaced
class JetStreamBatchWriter(DataSourceArrowWriter):
    """``df.write.format("jetstream")``: every row published, msg ids per save() (see module doc)."""

    def __init__(self, config: SinkConfig, columns: Columns | KvColumns, progress: ProgressTarget | None) -> None:
        self.config = config
        self.columns = columns
        self.progress = progress
        self.write_id = uuid.uuid4().hex  # made once on the driver: the same in every task and retry

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        conn = connect(self.config.connection)
        settle()
        if self.progress is not None:
            return _write_atomic(conn, self.config, self.columns, self.progress, self.write_id, 0, partition, iterator)
        published, duplicates = _publish(conn, self.config, self.columns, iterator, f"{self.write_id}:{partition}:")
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
        self._forget_markers()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        published = sum(m.published for m in messages if isinstance(m, WriteResult))
        log.warning(
            "jetstream write %s failed; %d messages of finished tasks stay in the stream (a stream has no rollback)",
            self.write_id,
            published,
        )
        self._forget_markers()

    def _forget_markers(self) -> None:
        """A batch write's progress markers serve only its own tasks' retries (a rerun is a new write id): once the
        job is over they go, or each write would leave a subject per partition in the stream for ever."""
        if self.progress is None:
            return
        conn, stream = connect(self.config.connection), self.progress.stream
        try:
            forget_progress(conn, self.progress.prefix, self.write_id, stream)
        except JetStreamError as exc:
            log.warning(
                "The progress markers of write %s stay in stream %r (%s). Allow the writer %s.STREAM.PURGE.%s, or "
                "remove them later: spark-jetstream commits forget --progress-subject %s --older-than 1d",
                self.write_id,
                stream,
                exc,
                conn.options.api_prefix,
                stream,
                self.progress.prefix,
            )


@surfaced
class JetStreamStreamWriter(StreamWriterBase):  # type: ignore[misc,valid-type]
    """``df.writeStream.format("jetstream")``: exactly-once with msg ids and KV markers (see module doc).

    PySpark 4.0 passes rows instead of Arrow batches: ``input_schema`` turns them into batches.
    """

    def __init__(
        self,
        config: SinkConfig,
        columns: Columns | KvColumns,
        input_schema: pa.Schema,
        progress: ProgressTarget | None,
    ) -> None:
        self.config = config
        self.columns = columns
        self.input_schema = input_schema
        self.progress = progress

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
        settle()
        if self.progress is not None:
            result = _write_atomic(
                conn, self.config, self.columns, self.progress, query_id, batch_id, partition, iterator
            )
            result.query_id = query_id
            return result
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
        published, duplicates = _publish(conn, self.config, self.columns, iterator, prefix)
        return WriteResult(partition, published, duplicates, query_id=query_id, batch_id=batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        results = [m for m in messages if isinstance(m, WriteResult)]
        query_id = next((r.query_id for r in results if r.query_id), None)
        if query_id is None:
            return  # no task ran: nothing was published, nothing to mark
        if self.progress is None:  # with progress markers the tasks' markers say what is stored
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


def _progress(conn: Connection, config: SinkConfig, columns: Columns | KvColumns) -> ProgressTarget | None:
    """Where the write's progress markers go (``sink.atomic``), settled before any task runs. A ``msg_id`` column is
    refused with them: a duplicate id rejects a whole atomic batch, where the writer without markers drops the row."""
    if config.bucket:
        return None
    progress = progress_target(conn, config.progress_subject, config.atomic_batch_size)
    if progress is not None and isinstance(columns, Columns) and columns.msg_id is not None:
        raise OptionError(
            "A msg_id column cannot be written with progressSubject: the server rejects a whole atomic batch for one "
            "duplicate id, where a write without markers drops that row. Remove the msg_id column (the markers make "
            "replays exact at any age), or the progressSubject option."
        )
    return progress


def _target_stream(conn: Connection, config: SinkConfig) -> str | None:
    """The stream the write goes to, where the options say: ``expectedStream``, or the stream that takes the
    ``subject`` option's subject (rows may name others; the commit bucket's replicas follow it)."""
    if config.expected_stream or config.subject is None:
        return config.expected_stream
    try:
        names = JetStreamApi(conn).stream_names(config.subject)
    except NotPermittedError:  # a writer's rights need not list streams: the bucket then has one replica
        return None
    return names[0] if len(names) == 1 else None


def _columns(schema: StructType, config: SinkConfig) -> Columns | KvColumns:
    """The columns a write uses: a stream's, or a bucket's (``key``, ``value``, ``revision``)."""
    return check_kv_columns(schema, config.bucket) if config.bucket else check_columns(schema, config)


def batch_writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> JetStreamBatchWriter:
    """The writer of ``df.write``; a stream cannot be overwritten, so only append mode is accepted."""
    if overwrite:
        raise OptionError(
            "A JetStream stream cannot be overwritten: use .mode('append') (messages are added to the stream)."
        )
    config = SinkConfig.parse(options)
    columns = _columns(schema, config)
    return JetStreamBatchWriter(config, columns, _progress(connect(config.connection), config, columns))


def stream_writer(options: Mapping[str, str], schema: StructType) -> JetStreamStreamWriter:
    """The writer of ``df.writeStream``; makes sure the marker bucket exists before any task runs."""
    config = SinkConfig.parse(options)
    columns = _columns(schema, config)
    conn = connect(config.connection)
    progress = _progress(conn, config, columns)
    if progress is None:
        ensure_bucket(conn, config.commit_bucket, config.commit_bucket_replicas, _target_stream(conn, config))
    from pyspark.sql.pandas.types import to_arrow_schema  # needs no pandas (PySpark 4.0-4.3), but is heavy

    return JetStreamStreamWriter(config, columns, to_arrow_schema(schema), progress)
