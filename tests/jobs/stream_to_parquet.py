"""A streaming job run as its own process, so tests can SIGKILL the whole driver mid-batch (the restart after it
runs in the test's own session: ``helpers.finish_job``).

python tests/jobs/stream_to_parquet.py --servers URL --stream S --group G --out DIR --checkpoint DIR
python tests/jobs/stream_to_parquet.py --servers URL --bucket B --out DIR --checkpoint DIR  (a KV bucket's changes)
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType


def main(spark: SparkSession, argv: list[str] | None = None) -> None:
    """Run the job in ``spark`` (a script's own session, or the test's: ``helpers.finish_job``)."""
    parser = argparse.ArgumentParser()
    for name in ("servers", "out", "checkpoint"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("stream", "group", "bucket"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--max-per-trigger", type=int, default=1000)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--slow-ms", type=float, default=0.0, help="sleep per row, to make batches slow")
    parser.add_argument("--ack-policy", default="explicit", help="the source's ackPolicy option")
    parser.add_argument("--members", help="the source's members option (a group derived from the partitions)")
    parser.add_argument("--read-mode", default="auto", help="the source's readMode option")
    args = parser.parse_args(argv)

    delay = args.slow_ms / 1000

    @F.udf(LongType())
    def slowly(seq: int) -> int:
        time.sleep(delay)
        return seq

    reader = spark.readStream.format("jetstream").option("servers", args.servers)
    reader = reader.option("maxMessagesPerTrigger", args.max_per_trigger).option("readMode", args.read_mode)
    if args.bucket:
        rows = reader.option("bucket", args.bucket).load().withColumn("revision", slowly("revision"))
    else:
        rows = (
            reader.option("stream", args.stream)
            .option("group", args.group)
            .option("ackPolicy", args.ack_policy)
            .options(**({"members": args.members} if args.members else {}))
            .load()
            .withColumn("seq", slowly("seq"))
        )
    writer = rows.writeStream.format("parquet").option("path", args.out).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="0 seconds")
    writer.start().awaitTermination()


if __name__ == "__main__":
    from local_spark import local_session

    session = local_session()
    main(session)
    session.stop()
