"""Python workers started and the connector imported while a query starts, through a source that reads nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType


class WarmUpSource(DataSource):
    """A Python data source that reads nothing: reading it starts the Python workers a read of ``jetstream`` uses.

    Spark pools Python workers by kind and environment (measured with PySpark 4.3): RDD jobs, SQL functions and a
    source found by Spark's own look-up each get their own. A read of a source registered from this session uses the
    same pools as the query's reads (the read workers, and the planner processes that create the source and plan
    its read), and unlike ``mapInArrow`` it does not need pandas, which the ``demo`` extra does not install."""

    @classmethod
    def name(cls) -> str:
        return "jetstream_demo_warmup"

    def schema(self) -> str:
        return "id long"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _WarmUpReader(int(self.options.get("partitions", "1")))


class _WarmUpReader(DataSourceReader):
    def __init__(self, partitions: int) -> None:
        self.count = partitions

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(index) for index in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        """Import what a read imports (``source.py`` imports the rest when ``read()`` is called)."""
        import pyarrow.compute  # noqa: F401

        import spark_jetstream.read.direct
        import spark_jetstream.source  # noqa: F401

        yield (partition.value,)


class WorkerWarmUp(threading.Thread):
    """Starts a Python worker per core that imports the connector (Spark reuses them), while the query starts.

    The first batch's tasks then skip the workers' start-up and imports. Nothing else is warmed up: a sample write of
    the sink (shuffle, code generation, the parquet writer) held both task slots while the first batch waited for
    them. A failure is not the demo's: the first batch then starts the workers itself, and one line says so."""

    def __init__(self, spark: SparkSession) -> None:
        super().__init__(name="demo-workers", daemon=True)
        self.spark = spark
        self.failure: str | None = None

    def run(self) -> None:
        try:
            cores = self.spark.sparkContext.defaultParallelism
            self.spark.dataSource.register(WarmUpSource)
            self.spark.read.format(WarmUpSource.name()).option("partitions", cores).load().collect()
        except Exception as exc:  # reported in one line by the main thread
            self.failure = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
