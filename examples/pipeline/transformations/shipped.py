"""A jetstream sink: every order copied, once, to the sink stream under the sink prefix."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()

dp.create_sink(
    "shipped",
    "jetstream",
    {
        "servers": spark.conf.get("jetstream.servers"),
        "expectedStream": spark.conf.get("jetstream.sinkStream"),  # a message this stream does not store fails the flow
    },
)


@dp.append_flow(target="shipped")
def ship_orders() -> DataFrame:
    prefix = spark.conf.get("jetstream.sinkPrefix")
    return spark.readStream.table("orders").select(F.concat(F.lit(f"{prefix}."), "subject").alias("subject"), "data")
