"""What differs between the supported PySpark versions (4.0 to 4.3), in one place.

PySpark is the platform's (a Databricks runtime, a cluster's Spark): the connector does not
install it, so this module checks the one it finds and fails with a clear message when there is
none or it is too old. The rest of the package imports Spark's data source classes from here.

What differs:

- PySpark >= 4.2 has admission control for Python streaming sources: Spark passes a read limit
  to ``latestOffset(start, limit)``, calls ``getDefaultReadLimit`` and ``reportLatestOffset``, and
  runs ``trigger(availableNow=True)`` as several batches through ``SupportsTriggerAvailableNow``.
  Older versions call ``latestOffset()`` without arguments (the source applies its own limits
  from the ``start`` it tracks) and run ``availableNow`` as one batch.
- PySpark >= 4.1 hands a streaming Arrow writer ``pyarrow.RecordBatch``es
  (``DataSourceStreamArrowWriter``); 4.0 hands it rows, which ``record_batches`` converts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from spark_jetstream.errors import SparkVersionError

if TYPE_CHECKING:
    import pyarrow as pa

MINIMUM = (4, 0)
SPARK_EXTRA = "pip install 'pyspark>=4.0,<5'"


def pyspark_version() -> tuple[int, int]:
    """The installed PySpark's (major, minor), or ``SparkVersionError`` naming what is needed."""
    try:
        import pyspark
    except ImportError as missing:
        raise SparkVersionError(
            "spark-jetstream needs PySpark 4.0 or newer, and none is installed in this Python "
            f"environment: run it where Spark provides PySpark (Databricks, spark-submit), or {SPARK_EXTRA}."
        ) from missing
    found = pyspark.__version__
    version = tuple(int(part) for part in re.findall(r"\d+", found)[:2])
    if len(version) < 2 or version < MINIMUM:
        raise SparkVersionError(
            f"spark-jetstream needs PySpark 4.0 or newer (Python data sources), but PySpark {found} is "
            f"installed: use a Spark 4 runtime (Databricks Runtime 17 or newer), or {SPARK_EXTRA}."
        )
    return version[0], version[1]


VERSION = pyspark_version()
ADMISSION_CONTROL = VERSION >= (4, 2)
"""Spark passes read limits to the source and supports multi-batch ``availableNow``."""

# Spark's data source API, imported by the rest of the package from here (after the version check).
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

if ADMISSION_CONTROL:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    STREAM_READER_BASES: tuple[type, ...] = (DataSourceStreamReader, SupportsTriggerAvailableNow)
else:
    STREAM_READER_BASES = (DataSourceStreamReader,)

if VERSION >= (4, 1):
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase
else:
    from pyspark.sql.datasource import DataSourceStreamWriter as StreamWriterBase

__all__ = [
    "ADMISSION_CONTROL",
    "STREAM_READER_BASES",
    "DataSource",
    "DataSourceArrowWriter",
    "DataSourceReader",
    "InputPartition",
    "StreamWriterBase",
    "WriterCommitMessage",
    "read_limit",
    "record_batches",
]


def read_limit(max_rows: int | None, max_bytes: int | None, min_rows: int | None) -> Any:
    """Spark's read limit object for the first configured limit (PySpark >= 4.2 only)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

    if max_rows is not None:
        return ReadMaxRows(max_rows)
    if max_bytes is not None:
        return ReadMaxBytes(max_bytes)
    if min_rows is not None:
        return ReadMinRows(min_rows)
    return ReadAllAvailable()


def record_batches(items: Iterable[Any], schema: pa.Schema, size: int = 10_000) -> Iterator[pa.RecordBatch]:
    """The writer's input as Arrow batches: PySpark >= 4.1 passes them through, 4.0 passes rows."""
    import pyarrow as pa  # not at module level: a data source lookup imports this module, and needs no pyarrow

    rows: list[Any] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
            continue
        rows.append(item)
        if len(rows) >= size:
            yield _batch(rows, schema)
            rows = []
    if rows:
        yield _batch(rows, schema)


def _batch(rows: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    columns = zip(*rows, strict=True)
    arrays = [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
