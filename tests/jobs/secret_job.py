"""Runs queries with secrets in their options and prints every place a secret could leak to.

python tests/jobs/secret_job.py URL PASSWORD WRONG_TOKEN CHECKPOINT_DIR
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def main() -> None:
    url, password, wrong_token, checkpoint = sys.argv[1:5]
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("INFO")  # everything Spark logs goes to this process's stderr
    options = {"servers": url, "stream": "Sec", "group": "g", "user": "alice", "password": password}
    df = spark.readStream.format("jetstream").options(**options).load()
    print("PLAN", df._jdf.queryExecution().toString())
    query = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    print("PROGRESS", query.recentProgress)
    print("EXPLAIN", query._jsq.explainInternal(True))
    bad = {**options, "password": None, "user": None, "token": wrong_token}
    failing = spark.readStream.format("jetstream").options(**{k: v for k, v in bad.items() if v}).load()
    try:
        failing.writeStream.format("noop").option("checkpointLocation", checkpoint + "-2").start().awaitTermination(60)
    except Exception as exc:
        print("ERROR", exc.getMessage() if hasattr(exc, "getMessage") else exc)
    spark.stop()


if __name__ == "__main__":
    main()
