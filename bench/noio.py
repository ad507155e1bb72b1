"""Spark's ceiling for a Python source: a data source with the connector's schema that does no I/O.

The scenarios measure the connector against it on the same machine, in the same run: what Spark itself moves
from (and to) any Python source with this schema and record batch size.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from spark_jetstream.options import default_of

if TYPE_CHECKING:
    import pyarrow as pa


def noio_source(name: str, size: int, count: int, partitions: int, batches: int = 1) -> type:
    """A Python data source ``name`` (streaming and batch) that yields ``count`` rows of ``size`` payload bytes in
    the connector's schema and record batch bound, in ``partitions`` partitions, and a writer that drops what it
    gets, without I/O. Streaming, it offers them in ``batches`` micro-batches of ``partitions`` partitions each (as a
    multi-batch read of the connector is; one batch on PySpark before 4.2, which passes no start offset). Its classes
    are local, so Spark pickles them by value (nothing to install on workers)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    from spark_jetstream.read.row_schema import spark_schema_ddl

    per_batch = max(1, min(default_of("recordBatchSize"), default_of("recordBatchBytes") // size))

    def rows(n: int) -> Iterator[pa.RecordBatch]:
        from array import array

        import pyarrow as pa

        from spark_jetstream.read.rows import repeated_string

        def int64_array(values: list[int], type_: pa.DataType) -> pa.Array:
            return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(array("q", values))])

        def build(k: int) -> pa.RecordBatch:
            offsets = pa.py_buffer(array("i", range(0, (k + 1) * size, size)))
            data = pa.Array.from_buffers(pa.binary(), k, [None, offsets, pa.py_buffer(b"x" * (size * k))])
            return pa.RecordBatch.from_arrays(
                [
                    repeated_string("noio.k1", k),
                    data,
                    repeated_string("NOIO", k),
                    int64_array(list(range(1, k + 1)), pa.int64()),
                    int64_array([time.time_ns() // 1000] * k, pa.timestamp("us", tz="UTC")),
                    pa.Array.from_buffers(pa.int32(), k, [None, pa.py_buffer(array("i", [0] * k))]),
                ],
                schema=pa.schema(
                    [
                        ("subject", pa.string()),
                        ("data", pa.binary()),
                        ("stream", pa.string()),
                        ("seq", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")),
                        ("partition", pa.int32()),
                    ]
                ),
            )

        full = build(per_batch)
        for start in range(0, n, per_batch):
            yield full if start + per_batch <= n else build(n - start)

    def split(n: int) -> list[InputPartition]:
        return [InputPartition(n // partitions + (p < n % partitions)) for p in range(partitions)] if n > 0 else []

    step = -(-count // batches)

    try:  # PySpark >= 4.2: availableNow asks batch after batch, each up to the default read limit
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

        bases: tuple[type, ...] = (DataSourceStreamReader, SupportsTriggerAvailableNow)
    except ImportError:
        bases = (DataSourceStreamReader,)

    class Stream(*bases):  # type: ignore[misc]
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def getDefaultReadLimit(self) -> Any:
            """``step`` rows a batch, as ``maxMessagesPerTrigger`` gives the connector's (PySpark >= 4.2)."""
            from pyspark.sql.streaming.datasource import ReadMaxRows

            return ReadMaxRows(step)

        def prepareForTriggerAvailableNow(self) -> None:
            """Nothing to fix: the rows are ``count`` for good."""

        def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
            rows = getattr(limit, "max_rows", None)  # None: ReadAllAvailable (availableNow's target), PySpark < 4.2
            return {"n": count if start is None or rows is None else min(count, start["n"] + rows)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return split(end["n"] - start["n"])

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield from rows(partition.value)

    class Batch(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return split(count)

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield from rows(partition.value)

    class Drop(DataSourceArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class NoIo(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return spark_schema_ddl(include_headers=False)

        def streamReader(self, schema: Any) -> Stream:
            return Stream()

        def reader(self, schema: Any) -> Batch:
            return Batch()

        def writer(self, schema: Any, overwrite: bool) -> Drop:
            return Drop()

    return NoIo
