"""A fresh Python process that uses format("jetstream") without any register call.

python tests/jobs/fresh_session.py MASTER SERVERS STREAM GROUP -> prints the row count and distinct seqs
"""

from __future__ import annotations

import sys
import tempfile

from pyspark.sql import SparkSession


def main() -> None:
    master, servers, stream, group = sys.argv[1:5]
    spark = SparkSession.builder.master(master).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("jetstream")
            .option("servers", servers)
            .option("stream", stream)
            .option("group", group)
            .load()
            .writeStream.format("memory")
            .queryName("rows")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    rows = spark.sql("select count(*) as n, count(distinct seq) as d, min(seq) as lo, max(seq) as hi from rows")
    block_managers = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()  # driver + executors
    print("RESULT", *rows.first(), "executors", block_managers - 1 if master.startswith("local-cluster") else 0)
    spark.stop()


if __name__ == "__main__":
    main()
