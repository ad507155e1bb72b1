"""A jetstream -> jetstream streaming job run as its own process, so tests can SIGKILL it mid-batch.

python tests/jobs/stream_to_jetstream.py --servers URL --stream S --group G --target PREFIX --checkpoint DIR
    [--progress-subject P --atomic-batch-size N] [--source-option NAME=VALUE ...]

Each message of S is written to ``PREFIX.<last subject token>`` with the same payload. A slow UDF,
small Arrow batches and small worker buffers make the writer receive a partition's rows about a
hundred at a time, so a kill can land while a partition is partly published.
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType


def main(spark: SparkSession, argv: list[str] | None = None) -> None:
    """Run the job in ``spark`` (the script's own session, or the test's: ``helpers.finish_job``)."""
    parser = argparse.ArgumentParser()
    for name in ("servers", "stream", "group", "target", "checkpoint"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--max-per-trigger", type=int, default=1000)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--slow-ms", type=float, default=0.0, help="sleep per row, to make batches slow")
    parser.add_argument("--progress-subject", default=None, help="the writer's progressSubject")
    parser.add_argument("--atomic-batch-size", type=int, default=1000)
    parser.add_argument("--source-option", action="append", default=[], help="another option of the source: NAME=VALUE")
    args = parser.parse_args(argv)

    delay = args.slow_ms / 1000

    @F.udf(BinaryType())
    def slowly(data: bytes) -> bytes:
        time.sleep(delay)
        return data

    rows = (
        spark.readStream.format("jetstream")
        .option("servers", args.servers)
        .option("stream", args.stream)
        .option("group", args.group)
        .option("maxMessagesPerTrigger", args.max_per_trigger)
        .options(**dict(option.split("=", 1) for option in args.source_option))
        .load()
        .select(
            F.concat(F.lit(f"{args.target}."), F.substring_index("subject", ".", -1)).alias("subject"),
            slowly("data").alias("data"),
        )
    )
    writer = (
        rows.writeStream.format("jetstream")
        .option("servers", args.servers)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.progress_subject:
        writer = writer.option("progressSubject", args.progress_subject)
        writer = writer.option("atomicBatchSize", args.atomic_batch_size)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="0 seconds")
    writer.start().awaitTermination()


if __name__ == "__main__":
    from local_spark import local_session

    # Small Arrow batches, and Python workers that pass small outputs on at once: kills find batches partly published.
    session = local_session(**{"spark.sql.execution.arrow.maxRecordsPerBatch": "20", "spark.buffer.size": "256"})
    main(session)
    session.stop()
