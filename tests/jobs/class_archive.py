"""Load the classes the suite's Spark JVMs load (a session, SQL, parquet, a Python UDF, a Python data source read in
batch and streaming), so that a JVM started with ``-XX:ArchiveClassesAtExit`` archives them (``conftest.py``).

python tests/jobs/class_archive.py SCRATCH_DIR
"""

from __future__ import annotations

import sys

from local_spark import local_session
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import LongType


class _Reader(DataSourceReader):
    def read(self, partition):
        yield from ((i, f"s{i}") for i in range(100))


class _StreamReader(DataSourceStreamReader):
    def initialOffset(self) -> dict:
        return {"n": 0}

    def latestOffset(self) -> dict:
        return {"n": 100}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition):
        yield from ((i, f"s{i}") for i in range(100))


class _Source(DataSource):
    @classmethod
    def name(cls) -> str:
        return "class_archive_source"

    def schema(self) -> str:
        return "n long, s string"

    def reader(self, schema):
        return _Reader()

    def streamReader(self, schema):
        return _StreamReader()


def main(scratch: str) -> None:
    spark = local_session()
    spark.dataSource.register(_Source)

    @F.udf(LongType())
    def twice(n: int) -> int:
        return 2 * n

    rows = spark.read.format("class_archive_source").load().withColumn("t", twice("n"))
    rows.groupBy((F.col("n") % 7).alias("k")).agg(F.sum("t")).write.parquet(f"{scratch}/batch")
    assert spark.read.parquet(f"{scratch}/batch").count() == 7
    stream = spark.readStream.format("class_archive_source").load()
    query = (
        stream.writeStream.format("parquet")
        .option("path", f"{scratch}/stream")
        .option("checkpointLocation", f"{scratch}/cp")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert spark.read.parquet(f"{scratch}/stream").count() == 100
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
