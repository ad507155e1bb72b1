"""A spark-submit job: orders from the stream ORDERS, read with the consumer group `invoicing`, turned into
invoices and written exactly once to the stream INVOICES (README.md in this folder says how to run it).

spark-submit job.py --servers nats://localhost:4222 --checkpoint /tmp/invoicing-checkpoint [--available-now]
"""

from __future__ import annotations

import argparse
import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import spark_jetstream

ORDER = "order_id BIGINT, customer STRING, country STRING, quantity INT, price DECIMAL(10,2)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", default=os.environ.get("NATS_URL", "nats://localhost:4222"))
    parser.add_argument("--source", default="ORDERS", help="the stream to read")
    parser.add_argument("--group", default="invoicing", help="the consumer group to read it with")
    parser.add_argument("--target", default="invoices", help="subject prefix of the invoices")
    parser.add_argument("--progress-subject", default="invoices_progress", help="the writer's progressSubject")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint: durable, shared storage")
    parser.add_argument("--available-now", action="store_true", help="read what is there, write it, and stop")
    args = parser.parse_args()

    spark = SparkSession.builder.appName("jetstream-invoicing").getOrCreate()
    spark_jetstream.register(spark)  # format("jetstream"), also where the package was installed after Spark started
    nats = {"servers": args.servers}  # add "creds", "tls.ca", ... here

    orders = (
        spark.readStream.format("jetstream")
        .options(**nats)
        .option("stream", args.source)
        .option("group", args.group)
        .option("maxMessagesPerTrigger", 10_000)
        .load()
        .select(F.from_json(F.col("data").cast("string"), ORDER).alias("order"))
        .select("order.*")
    )
    # Deterministic, row by row: a replayed batch gives the same rows in the same order in each partition, which
    # the writer's exactly-once needs (no rand(), no shuffle, no union whose order varies).
    invoices = orders.select(
        F.concat(F.lit(f"{args.target}."), F.col("country")).alias("subject"),
        F.to_json(F.struct("order_id", "customer", (F.col("price") * F.col("quantity")).alias("amount"))).alias("data"),
    )
    writer = (
        invoices.writeStream.format("jetstream")
        .options(**nats)
        .option("progressSubject", args.progress_subject)
        .option("checkpointLocation", args.checkpoint)
    )
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="10 seconds")
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
