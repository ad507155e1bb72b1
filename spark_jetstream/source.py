"""The Spark-facing layer: the ``jetstream`` data source and its stream reader. Thin: it
converts Spark's offsets and read limits and delegates to the coordinator (driver) and the
pinned pull reader (executors); batch reads live in ``batch.py``, writes in ``sink.py``.

>>> spark.readStream.format("jetstream").option("servers", "nats://localhost:4222") \\
...     .option("stream", "orders").option("group", "spark").load()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .batch import BATCH_ONLY_OPTIONS, BatchConfig, JetStreamBatchReader
from .config import SourceConfig
from .connection import connect
from .coordinator import Coordinator
from .errors import OptionError
from .offsets import Watermark
from .options import LOAD_OPTIONS, parse_options
from .planning import Limits
from .pull import MemberRange, read_member
from .rows import spark_schema_ddl
from .sink import JetStreamBatchWriter, JetStreamStreamWriter, batch_writer, stream_writer


class MemberPartition(InputPartition):
    """One Spark input partition: one member consumer and the batch's range."""

    def __init__(self, member: MemberRange) -> None:
        super().__init__(member)
        self.member = member


class JetStreamDataSource(DataSource):
    """``format("jetstream")``: NATS JetStream as a Spark source and sink.

    Which options apply depends on the use, which Spark reveals only in the method it calls:
    ``schema()`` (at ``load()``) checks them against every read option, so bad read options fail
    at ``load()``; ``streamReader``/``reader``/``writer``/``streamWriter`` then apply their own set.
    """

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> str:
        values = parse_options(self.options, LOAD_OPTIONS)
        for first, second in (("startingPosition", "startingTimestamp"), ("endingPosition", "endingTimestamp")):
            if values[second] is not None and any(key.lower() == first.lower() for key in self.options):
                raise OptionError(f"Set {first} or {second}, not both.")
        return spark_schema_ddl(values["includeHeaders"])

    def streamReader(self, schema: StructType) -> JetStreamStreamReader:
        for key in self.options:
            name = next((n for n in BATCH_ONLY_OPTIONS if n.lower() == key.lower()), None)
            if name is not None:
                raise OptionError(
                    f"Option {name!r} applies to spark.read only: a streaming query has no end. Use "
                    "trigger(availableNow=True) to stop at the messages there are when it starts."
                )
        return JetStreamStreamReader(SourceConfig.parse(self.options))

    def reader(self, schema: StructType) -> JetStreamBatchReader:
        return JetStreamBatchReader(BatchConfig.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> JetStreamBatchWriter:
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> JetStreamStreamWriter:
        return stream_writer(self.options, schema)


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches are seq ranges of the stream; each member of the group is one partition.

    Driver-side methods run on one instance in one long-lived process per query run and share
    a ``Coordinator``; ``read`` runs in executors on a pickled copy that never creates one.
    """

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self._coordinator: Coordinator | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_coordinator": None}

    @property
    def coordinator(self) -> Coordinator:
        if self._coordinator is None:
            self._coordinator = Coordinator(self.config)
        return self._coordinator

    def _watermark(self, offset: dict[str, Any]) -> Watermark:
        coordinator = self.coordinator  # an elastic group reads its work stream
        return Watermark.from_offset(offset, coordinator.stream, coordinator.created)

    def initialOffset(self) -> dict[str, Any]:
        return self.coordinator.initial().to_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_messages is not None:
            return ReadMaxRows(self.config.max_messages)
        if self.config.max_bytes is not None:
            return ReadMaxBytes(self.config.max_bytes)
        if self.config.min_messages is not None:
            return ReadMinRows(self.config.min_messages)
        return ReadAllAvailable()

    def _limits(self, limit: ReadLimit) -> Limits:
        """Spark passes one limit (or ReadAllAvailable); the other configured limits apply too."""
        if isinstance(limit, ReadAllAvailable):
            return Limits()
        return Limits(
            max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else self.config.max_messages,
            max_bytes=limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.config.max_bytes,
            min_rows=limit.min_rows if isinstance(limit, ReadMinRows) else self.config.min_messages,
        )

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self.coordinator.latest(self._watermark(start), self._limits(limit)).to_offset()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.coordinator.watermark(self.coordinator.state().last_seq).to_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.coordinator.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = self.coordinator.plan(self._watermark(start), self._watermark(end))
        return [MemberPartition(member) for member in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MemberPartition)
        yield from read_member(connect(self.config.connection), partition.member, self.config.pull)

    def commit(self, end: dict[str, Any]) -> None:
        self.coordinator.commit(self._watermark(end))

    def stop(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
