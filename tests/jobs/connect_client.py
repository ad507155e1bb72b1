"""A Spark Connect client, as a Databricks serverless or standard-access notebook is one: it runs the
connector's main uses against a Connect server and prints one JSON line with what it saw.

python tests/jobs/connect_client.py --remote sc://HOST:PORT --servers URL --stream S --group G --out DIR
    --target SUBJECT [--register]

With ``--register`` the client registers the data source itself (``spark.dataSource.register``);
without it the server finds ``format("jetstream")`` by auto-registration.
"""

from __future__ import annotations

import argparse
import json

from local_spark import bounded_read
from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("remote", "servers", "stream", "group", "out", "target"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--register", action="store_true")
    args = parser.parse_args()
    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    if args.register:
        from spark_jetstream.source import JetStreamDataSource

        spark.dataSource.register(JetStreamDataSource)
    result: dict[str, object] = {"connect": spark.__class__.__module__}

    # Serverless runs streaming queries with availableNow only.
    query = (
        spark.readStream.format("jetstream")
        .option("servers", args.servers)
        .option("stream", args.stream)
        .option("group", args.group)
        .option("maxMessagesPerTrigger", 400)
        .load()
        .writeStream.format("parquet")
        .option("path", f"{args.out}/stream/out")
        .option("checkpointLocation", f"{args.out}/stream/cp")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    result["batches"] = [p.numInputRows for p in query.recentProgress if p.numInputRows]

    bounded = bounded_read(spark, args.servers, args.stream, 1, 50)
    result["batch_seqs"] = sorted(row.seq for row in bounded.select("seq").collect())

    bounded.select(F.lit(args.target).alias("subject"), "data").write.format("jetstream").option(
        "servers", args.servers
    ).mode("append").save()
    result["write"] = "done"
    spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
