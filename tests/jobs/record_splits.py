"""A streaming job that records how each micro-batch was split into Spark partitions, run as its own process so a
test can SIGKILL it inside a batch and check that the replay is split alike.

python tests/jobs/record_splits.py --servers URL --stream S --group G --out DIR --checkpoint DIR --splits DIR
    [--min-partitions N] [--unordered] [--read-mode M] [--max-per-trigger N] [--hang-on-batch ID] [--available-now]

``--unordered`` reads with ``preservePartitionOrder=false``, ``--read-mode`` sets ``readMode`` (default ``auto``).

Each batch writes ``<splits>/<batch id>-<random>.json`` ({task: [first seq, last seq, rows]}) and its rows to
``<out>/batch=<batch id>`` (overwritten by a replay: an idempotent sink keyed by batch id). With
``--hang-on-batch`` the job creates ``<splits>/hanging`` after that batch's output and then waits to be killed,
before Spark commits the batch.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def main(spark: SparkSession, argv: list[str] | None = None) -> None:
    """Run the job in ``spark`` (a script's own session, or the test's: ``helpers.finish_job``)."""
    parser = argparse.ArgumentParser()
    for name in ("servers", "stream", "group", "out", "checkpoint", "splits"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--min-partitions", type=int)
    parser.add_argument("--max-per-trigger", type=int, default=4000)
    parser.add_argument("--hang-on-batch", type=int)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--unordered", action="store_true")
    parser.add_argument("--read-mode", default="auto")
    args = parser.parse_args(argv)
    splits = Path(args.splits)
    splits.mkdir(parents=True, exist_ok=True)

    rows = (
        spark.readStream.format("jetstream")
        .option("servers", args.servers)
        .option("stream", args.stream)
        .option("group", args.group)
        .option("maxMessagesPerTrigger", args.max_per_trigger)
        .option("readMode", args.read_mode)
        .options(**({"minPartitions": str(args.min_partitions)} if args.min_partitions else {}))
        .options(**({"preservePartitionOrder": "false"} if args.unordered else {}))
        .load()
    )

    def record(batch: DataFrame, batch_id: int) -> None:
        tasks = batch.select(F.spark_partition_id().alias("task"), "seq").groupBy("task")
        found = tasks.agg(F.min("seq"), F.max("seq"), F.count("seq")).collect()
        split = {str(task): [low, high, count] for task, low, high, count in found}
        (splits / f"{batch_id}-{uuid.uuid4().hex}.json").write_text(json.dumps(split, sort_keys=True))
        batch.select("subject", "data", "seq").write.mode("overwrite").parquet(f"{args.out}/batch={batch_id}")
        if batch_id == args.hang_on_batch:
            (splits / "hanging").touch()
            time.sleep(3600)

    writer = rows.writeStream.foreachBatch(record).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="0 seconds")
    writer.start().awaitTermination()


if __name__ == "__main__":
    from local_spark import local_session

    session = local_session()
    main(session)
    session.stop()
