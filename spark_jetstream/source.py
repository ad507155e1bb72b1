"""The Spark-facing layer: the ``jetstream`` data source and its stream reader. Thin: it
converts Spark's offsets and read limits and delegates to the coordinator (``streaming/coordinator.py``, driver)
and, in executors, to Direct Get reads (``read/direct.py``) or the pinned pull reader (``streaming/pull.py``);
batch reads live in ``read/batch.py``, writes in ``sink/writer.py``.

>>> spark.readStream.format("jetstream").option("servers", "nats://localhost:4222") \\
...     .option("stream", "orders").option("group", "spark").load()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from spark_jetstream.errors import JetStreamError, surfaced
from spark_jetstream.options import LOAD, parse_options
from spark_jetstream.read.row_schema import spark_schema_ddl
from spark_jetstream.spark_compat import STREAM_READER_BASES, DataSource, InputPartition, read_limit
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.offsets import INITIAL, BatchEnd, Watermark
from spark_jetstream.streaming.planning import Limits

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from spark_jetstream.read.batch import JetStreamBatchReader
    from spark_jetstream.sink.writer import JetStreamBatchWriter, JetStreamStreamWriter
    from spark_jetstream.streaming.coordinator import Coordinator


@surfaced
class JetStreamDataSource(DataSource):
    """``format("jetstream")``: NATS JetStream as a Spark source and sink.

    Which options apply depends on the use, which Spark reveals only in the method it calls:
    ``schema()`` (at ``load()``) checks them against every read option, so bad read options fail
    at ``load()``; ``streamReader``/``reader``/``writer``/``streamWriter`` then apply their own set.
    Everything beyond the options is imported when used: every Spark Python process that looks the
    source up, asks for its schema, plans a read or runs a task imports this module (with a fresh
    Python each, before the first batch), and each needs only its part: the driver-side process the
    coordinator, an executor task the NATS client and its reader, the planner neither (measured with
    PySpark 4.3: importing everything cost 0.12-0.25 s in each of them).
    """

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> str:
        values = parse_options(self.options, LOAD)
        if values["bucket"]:
            from spark_jetstream.read.kv import KV_SCHEMA_DDL

            return KV_SCHEMA_DDL
        return spark_schema_ddl(values["includeHeaders"])

    def streamReader(self, schema: StructType) -> JetStreamStreamReader:
        """Options a streaming read refuses (those ``load()`` could not tell from a batch read's) are raised at
        Spark's first call of the reader, not here: PySpark's streaming runner (4.0-4.3) masks whatever this method
        raises behind an ``UnboundLocalError`` from its own clean-up."""
        try:
            return JetStreamStreamReader(SourceConfig.parse(self.options))
        except JetStreamError as exc:
            return JetStreamStreamReader(None, refused=exc)

    def reader(self, schema: StructType) -> JetStreamBatchReader:
        from spark_jetstream.read.batch import BatchConfig, JetStreamBatchReader

        return JetStreamBatchReader(BatchConfig.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> JetStreamBatchWriter:
        from spark_jetstream.sink.writer import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> JetStreamStreamWriter:
        from spark_jetstream.sink.writer import stream_writer

        return stream_writer(self.options, schema)


@surfaced
class JetStreamStreamReader(*STREAM_READER_BASES):  # type: ignore[misc]
    """Micro-batches are seq ranges of the stream; each group partition with messages in the batch is
    one Spark partition, or several with ``minPartitions`` (each member, with ``readMode=pull``).

    Driver-side methods run on one instance in one long-lived process per query run and share
    a ``Coordinator``; ``read`` runs in executors on a pickled copy that never creates one.

    PySpark 4.0 and 4.1 call ``latestOffset()`` without the batch start and a read limit: the
    reader then starts from the last offset Spark showed it (the end of the last ``partitions``
    call; on a restart Spark calls ``partitions(latest, latest)`` first) or, in a new query, from
    its initial offset, and applies the configured limits itself.
    """

    def __init__(self, config: SourceConfig | None, refused: JetStreamError | None = None) -> None:
        self._config = config
        self._refused = refused  # why the options were refused: raised at Spark's first call
        self._coordinator: Coordinator | None = None
        self._position: dict[str, Any] | None = None  # the last offset Spark showed (PySpark < 4.2)

    def __getstate__(self) -> dict[str, Any]:
        return {"_config": self._config, "_refused": None, "_coordinator": None, "_position": None}

    @property
    def config(self) -> SourceConfig:
        if self._refused is not None:
            raise self._refused
        assert self._config is not None
        return self._config

    @property
    def coordinator(self) -> Coordinator:
        if self._coordinator is None:
            from spark_jetstream.streaming.coordinator import Coordinator

            self._coordinator = Coordinator(self.config)
        return self._coordinator

    def _watermark(self, offset: dict[str, Any]) -> Watermark:
        return self.coordinator.position(offset)

    def initialOffset(self) -> dict[str, Any]:
        """``INITIAL``, the same in every run: where a new query starts is worked out at its first ``latestOffset`` and
        recorded in batch 0's end offset, which Spark logs (it never logs a start), so that a restart in batch 0 replays
        it from there (decision 0042)."""
        return Watermark(self.coordinator.stream, INITIAL).to_offset()

    def getDefaultReadLimit(self) -> Any:
        config = self.config
        return read_limit(config.max_messages, config.max_bytes_per_trigger, config.min_messages)

    def _limits(self, limit: Any) -> Limits:
        """Spark passes one limit, ReadAllAvailable, or (PySpark < 4.2) none; the other configured
        limits apply too. Read by field name: Spark's limit classes are dataclasses."""
        if type(limit).__name__ == "ReadAllAvailable":
            return Limits()
        config = self.config
        return Limits(
            max_rows=getattr(limit, "max_rows", config.max_messages),
            max_bytes=getattr(limit, "max_bytes", config.max_bytes_per_trigger),
            min_rows=getattr(limit, "min_rows", config.min_messages),
        )

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        if start is None:  # PySpark < 4.2
            start = self._position or self.initialOffset()
        end = self.coordinator.latest(BatchEnd.from_offset(start, self._watermark(start)), self._limits(limit))
        return start if end is None else end.to_offset()  # the start itself: no batch now

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.coordinator.watermark(self.coordinator.state().last_seq).to_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.coordinator.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._position = end
        if start == end:  # PySpark 4.0/4.1's first call of a restart: an empty range, which moves nothing
            return []
        planned = BatchEnd.from_offset(end, self._watermark(end))
        return [InputPartition(r) for r in self.coordinator.plan(self._watermark(start), planned)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """A ``SeqRange`` is read with Direct Get or through an ephemeral consumer, as its ``read_mode`` says (a
        ``SmallBatch``'s ranges one after the other); a ``MemberRange`` is pulled from its member consumer. Messages of
        the task's ranges that retention or a purge removed since the batch was planned are data loss, seen here."""
        from spark_jetstream.client.connection import connect
        from spark_jetstream.read.ranges import SeqRange, SmallBatch
        from spark_jetstream.read.start import check_removed
        from spark_jetstream.read.tasks import read_ranges

        conn = connect(self.config.connection)
        value = partition.value
        check_removed(conn, value, self.config.fail_on_data_loss)
        if isinstance(value, SeqRange | SmallBatch):
            yield from read_ranges(conn, value)
        else:
            from pyspark import TaskContext

            from spark_jetstream.streaming.pull import read_member
            from spark_jetstream.worker_heap import settle

            context = TaskContext.get()  # a retry or a speculative copy must fence the attempt before it
            settle()
            first = context is None or context.attemptNumber() == 0
            yield from read_member(conn, value, self.config.pull, first_attempt=first)

    def commit(self, end: dict[str, Any]) -> None:
        self.coordinator.commit(BatchEnd.from_offset(end, self._watermark(end)))

    def stop(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
