"""The Spark session of the job scripts in this folder (each runs as its own process)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession


def local_session(master: str = "local[2]", **conf: str) -> SparkSession:
    """A quiet local session: no UI, 2 shuffle partitions, errors only in the log."""
    builder = SparkSession.builder.master(master).config("spark.ui.enabled", "false")
    for key, value in {"spark.sql.shuffle.partitions": "2", **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def bounded_read(spark: SparkSession, servers: str, stream: str, first: int, last: int) -> DataFrame:
    """``spark.read.format("jetstream")`` of seqs ``first..last`` (both included)."""
    reader = spark.read.format("jetstream").option("servers", servers).option("stream", stream)
    return reader.option("startingPosition", first).option("endingPosition", last).load()
