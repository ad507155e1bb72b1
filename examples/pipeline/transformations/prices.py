"""A KV bucket's changes as a streaming table: one row per put, delete or purge, in revision order."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

spark = SparkSession.active()


@dp.table(comment="Every change of the prices bucket: key, value, revision, created, operation (PUT, DEL, PURGE).")
def price_changes() -> DataFrame:
    return (
        spark.readStream.format("jetstream")
        .option("servers", spark.conf.get("jetstream.servers"))
        .option("bucket", spark.conf.get("jetstream.bucket"))
        .load()
    )
