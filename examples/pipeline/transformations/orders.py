"""The orders stream as a streaming table, and a materialized view over it."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

spark = SparkSession.active()


@dp.table(comment="Every message of the orders stream, once: subject, data, stream, seq, timestamp, partition.")
def orders() -> DataFrame:
    return (
        spark.readStream.format("jetstream")
        .option("servers", spark.conf.get("jetstream.servers"))
        .option("stream", spark.conf.get("jetstream.stream"))
        .load()
    )


@dp.materialized_view(comment="Orders per subject, recomputed from the orders table on every run.")
def orders_by_subject() -> DataFrame:
    return spark.read.table("orders").groupBy("subject").count()
