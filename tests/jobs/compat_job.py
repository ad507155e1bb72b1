"""The connector's main uses, run with whatever PySpark this Python has (tests/test_spark_versions.py
runs it in a venv per supported PySpark minor). Prints one JSON line with what it saw.

python tests/jobs/compat_job.py --servers URL --stream S --group-prefix G --max M --out DIR --target PREFIX

- ``capped``: a streaming read with ``maxMessagesPerTrigger=M`` into parquet (group ``G-capped``), stopped after
  two batches and restarted from its checkpoint until its commit log reaches seq ``--count``. The rows each
  batch read are in its checkpoint's offset log: a progress can miss a batch (a stop between the sink's commit
  and Spark's; the restart then replays it with no rows).
- ``lags``: the lag of each batch of the capped read's first run, as ``JetStreamLagListener`` tells it from the
  progress.
- ``available_now`` and ``available_now_capped``: ``trigger(availableNow=True)`` without and with
  the cap (groups ``G-now`` and ``G-nowcap``); ``available_now_min``: with ``minMessagesPerTrigger`` twice the
  stream (group ``G-nowmin``); ``groupless``: the same without a group.
- ``batch``: a bounded ``spark.read`` of seqs ``(10, 110]``.
- ``python``, ``workers``: the driver's Python minor, and each Python worker's with the bulk handlers it parses
  with.
- ``write``: the stream copied into ``PREFIX.<token>`` subjects with its headers by a streaming
  jetstream -> jetstream query (``availableNow``), run twice on one checkpoint (group ``G-copy``); the same into
  ``aPREFIX.<token>`` with ``progressSubject`` ``aPREFIX_progress`` (atomic batches of 100, group ``G-acopy``), once
  (replays with markers: tests/test_server_versions.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator

import pyspark
from local_spark import bounded_read, local_session
from pyspark.sql import functions as F

from spark_jetstream.streaming.offsets import committed_offset
from spark_jetstream.tools.monitoring import batch_progress


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("servers", "stream", "group-prefix", "out", "target"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--max", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    spark = local_session()

    def source(group: str | None, **options: object):
        reader = spark.readStream.format("jetstream").option("servers", args.servers).option("stream", args.stream)
        if group is not None:
            reader = reader.option("group", f"{args.group_prefix}-{group}")
        return reader.options(**{k: str(v) for k, v in options.items()}).load()

    def to_parquet(name: str, df, trigger: dict):
        return (
            df.writeStream.format("parquet")
            .option("path", f"{args.out}/{name}/out")
            .option("checkpointLocation", f"{args.out}/{name}/cp")
            .trigger(**trigger)
            .start()
        )

    def input_rows(query) -> list[int]:
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    major, minor = sys.version_info[:2]
    result: dict[str, object] = {"pyspark": pyspark.__version__, "python": f"{major}.{minor}"}

    def worker(_: object) -> Iterator[str]:
        import sys

        from spark_jetstream.client.protocol import BULK

        yield f"{sys.version_info[0]}.{sys.version_info[1]} {BULK.name}"

    result["workers"] = sorted(set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker).collect()))

    def committed() -> int:
        """The seq the capped read's last committed batch ends at (0 before its first)."""
        return (committed_offset(f"{args.out}/capped/cp") or {"seq": 0})["seq"]

    reported: list[str] = []  # the stream's end as each batch's progress of the first run reports it
    lags: list[int | None] = []
    for stop_after in (2, None):  # a first run, stopped, then a restart from the checkpoint
        query = to_parquet("capped", source("capped", maxMessagesPerTrigger=args.max), {"processingTime": "0 seconds"})
        deadline = time.monotonic() + 120
        while query.isActive and time.monotonic() < deadline:
            if (stop_after and len(input_rows(query)) >= stop_after) or committed() >= args.count:
                break
            time.sleep(0.2)
        query.stop()
        if query.exception():
            raise query.exception()
        reported = reported or [str(p.sources[0].latestOffset) for p in query.recentProgress if p["numInputRows"]]
        lags = lags or [batch_progress(p).lag for p in query.recentProgress if p["numInputRows"]]
    result["reported_latest"] = reported
    result["lags"] = lags

    for name, group, options in (
        ("available_now", "now", {}),
        ("available_now_capped", "nowcap", {"maxMessagesPerTrigger": args.max}),
        ("available_now_min", "nowmin", {"minMessagesPerTrigger": 2 * args.count}),
        ("groupless", None, {}),
    ):
        query = to_parquet(name, source(group, **options), {"availableNow": True})
        query.awaitTermination(120)
        result[name] = input_rows(query)

    bounded = bounded_read(spark, args.servers, args.stream, 11, 110)
    bounded.write.parquet(f"{args.out}/batch/out")

    for name, target, options, runs in (
        ("copy", args.target, {}, 2),
        ("acopy", f"a{args.target}", {"progressSubject": f"a{args.target}_progress", "atomicBatchSize": "100"}, 1),
    ):
        copy = source(name, includeHeaders="true").select(
            F.concat(F.lit(f"{target}."), F.substring_index("subject", ".", -1)).alias("subject"), "data", "headers"
        )
        for _ in range(runs):
            query = (
                copy.writeStream.format("jetstream")
                .option("servers", args.servers)
                .option("checkpointLocation", f"{args.out}/{name}/cp")
                .options(**options)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination(120)
    result["write"] = "done"
    spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
