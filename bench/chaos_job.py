"""The driver of one of the ``chaos`` scenario's streaming queries (``bench/scenarios/chaos.py``), in a process of its
own on a Spark standalone cluster: it runs until ``--stop-file`` appears, then stops the query and exits 0; a query
that fails prints its exception and exits 1.

* ``--query a``: the stream through group ``ga`` (Direct Get), each message's payload written into ``--target-subject``
  by the connector's exactly-once sink;
* ``--query b``: the stream through group ``gb`` with ``readMode=pull``, into parquet (``seq``, ``subject``, ``data``).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

MAX_PER_TRIGGER = 2000
TRIGGER = "1 second"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--query", choices=("a", "b"), required=True)
    for name in ("master", "servers", "stream", "checkpoint", "stop-file", "log4j", "out", "target-subject"):
        parser.add_argument(f"--{name}", required=name not in ("out", "target-subject"))
    parser.add_argument("--cores", default="2", help="spark.cores.max of the app")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    jvm_options = f"-Dlog4j2.configurationFile={args.log4j}"
    spark = (
        SparkSession.builder.master(args.master)
        .appName(f"spark-jetstream chaos {args.query}")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", jvm_options)
        .config("spark.executor.extraJavaOptions", jvm_options)
        .config("spark.executor.memory", "1g")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", args.cores)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10")
        # Every batch's offset and commit files stay: the scenario reads each batch's commit time from them at the end
        # (Spark keeps the last 100 by default).
        .config("spark.sql.streaming.minBatchesToRetain", "1000000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    read = {"group": "ga"} if args.query == "a" else {"group": "gb", "readMode": "pull"}  # a: the default, Direct Get
    rows = (
        spark.readStream.format("jetstream")
        .options(servers=args.servers, stream=args.stream, **read)
        .option("maxMessagesPerTrigger", MAX_PER_TRIGGER)
        .load()
    )
    if args.query == "a":
        sink = (
            rows.select("data")
            .writeStream.format("jetstream")
            .options(servers=args.servers, subject=args.target_subject, commitBucketReplicas=3)
        )
    else:
        sink = rows.select("seq", "subject", "data").writeStream.format("parquet").option("path", args.out)
    query = sink.option("checkpointLocation", args.checkpoint).trigger(processingTime=TRIGGER).start()
    print(f"query {args.query} started: {query.id}", flush=True)
    stop_file = Path(args.stop_file)
    try:
        while not stop_file.exists():
            if query.awaitTermination(1):
                print(f"query {args.query} ended without being told to: {query.exception()}", flush=True)
                return 1
    except Exception:
        print(f"query {args.query} failed:", flush=True)
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return 1
    began = time.monotonic()
    query.stop()
    print(f"query {args.query} stopped in {time.monotonic() - began:.1f} s", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
