"""Runs queries with secrets in their options and prints every place a secret could leak to.

python tests/jobs/secret_job.py SPEC.json

SPEC: ``{"options": <a working query's options>, "checkpoint": DIR, "failing": {name: options}}``. The
working query runs (plan, progress, explain printed); then each failing option set is tried as a batch
read and as a streaming read, and Spark's whole error is printed after ``ERROR <name> <kind>``. Spark
and the connector log at DEBUG to this process's stderr (the driver log).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def error_text(exc: BaseException) -> str:
    get_message = getattr(exc, "getMessage", None)
    return get_message() if callable(get_message) else str(exc)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    options, checkpoint = spec["options"], spec["checkpoint"]
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("DEBUG")  # everything Spark logs goes to this process's stderr
    logging.basicConfig()  # and everything the connector logs in the driver (not py4j's DEBUG: it logs every call)
    logging.getLogger("spark_jetstream").setLevel(logging.DEBUG)
    df = spark.readStream.format("jetstream").options(**options).load()
    print("PLAN", df._jdf.queryExecution().toString())
    query = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    print("PROGRESS", query.recentProgress)
    print("EXPLAIN", query._jsq.explainInternal(True))
    for name, failing in spec["failing"].items():
        try:
            spark.read.format("jetstream").options(**failing).load().collect()
        except Exception as exc:
            print("ERROR", name, "batch", error_text(exc))
        try:
            started = (
                spark.readStream.format("jetstream")
                .options(**failing)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", f"{checkpoint}-{name}")
                .start()
            )
            started.awaitTermination(60)
        except Exception as exc:
            print("ERROR", name, "stream", error_text(exc))
    spark.stop()


if __name__ == "__main__":
    main()
