"""``cold-job``: a cold ``availableNow`` job in a fresh process, against the raw Direct Get loop on the same data.

``--cold-messages`` x 100 B wait on a 4-partition stream (1,024 interleaved subjects). A fresh process running
``child`` is what a scheduled job is: it starts Spark, runs ``readStream.format("jetstream")`` with
``trigger(availableNow=True)`` into the ``noop`` sink on a new group, and stops. It is timed as a whole (process
start to exit, what a scheduler sees) and from ``start()`` to the query's end. The baseline is the raw Direct Get
loop reading the four partitions in two processes (``raw_direct.run_direct_parallel``), best of two. The target is
the whole job's rate at least 0.8x the raw loop's. ``batch_child`` reads the same messages with ``spark.read`` into
``noop`` in a fresh process too: the streaming query's time over that read's is issue 34's second target (at most
1.15x) at a size where a query's fixed start and stop weigh little.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from common import SUBJECTS, fresh_session, heading, in_fresh_process, publish

if TYPE_CHECKING:
    from suite import Suite

STREAM = "COLD"
PARTITIONS = 4
TARGET = 0.8


def child(servers: str, stream: str, group: str, checkpoint: str) -> dict[str, float]:
    """Runs in the fresh process (``common.in_fresh_process``): Spark's start, the whole query, the stop; seconds
    and rows."""
    began = time.monotonic()
    spark = fresh_session(**{"spark.sql.streaming.numRecentProgressUpdates": "100000"})
    session = time.monotonic()
    query = (
        spark.readStream.format("jetstream")
        .option("servers", servers)
        .option("stream", stream)
        .option("group", group)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    ended = time.monotonic()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    batches = len(query.recentProgress)
    spark.stop()
    return {"session": session - began, "query": ended - session, "rows": rows, "batches": batches}


def batch_child(servers: str, stream: str) -> dict[str, float]:
    """Runs in a fresh process: Spark's start, a batch read of the whole stream into ``noop``, the stop."""
    began = time.monotonic()
    spark = fresh_session()
    session = time.monotonic()
    df = spark.read.format("jetstream").option("servers", servers).option("stream", stream).load()
    df.write.format("noop").mode("overwrite").save()
    ended = time.monotonic()
    spark.stop()
    return {"session": session - began, "read": ended - session}


def run(suite: Suite) -> None:
    from raw_direct import run_direct_parallel
    from suite import SIZE, Summary

    from spark_jetstream.groups.layout import partition_filters

    count = suite.args.cold_messages
    heading(f"cold job: availableNow over {count:,} x {SIZE} B in a fresh process, against the raw Direct Get loop")
    suite.fresh_stream(STREAM, "cold.*", PARTITIONS)
    payload = os.urandom(SIZE)
    took = publish(suite.conn, "cold-job", ((f"cold.k{i % SUBJECTS}", payload, None) for i in range(count)), count)
    print(f"  {count:,} messages published in {took:.1f} s", flush=True)

    raw = []
    for _ in range(2):
        seconds, got, _ = run_direct_parallel(suite.address, STREAM, partition_filters(range(PARTITIONS)))
        if got != count:
            raise SystemExit(f"FAILED: the raw Direct Get loop read {got:,} of {count:,}")
        raw.append(seconds)
    raw_rate = count / min(raw)

    began = time.monotonic()
    result = in_fresh_process("scenarios.cold_job.child", suite.url, STREAM, "cold", suite.checkpoint("cold-job"))
    whole = time.monotonic() - began
    if result["rows"] != count:
        raise SystemExit(f"FAILED: the cold job read {result['rows']:,} of {count:,}")

    batch = in_fresh_process("scenarios.cold_job.batch_child", suite.url, STREAM)
    job_rate, query_rate = count / whole, count / result["query"]
    print(f"  {'read':<44}{'s':>8}{'rows/s':>12}{'ratio':>8}")
    print(f"  {'raw Direct Get, 4 filters, 2 processes':<44}{min(raw):>8.2f}{raw_rate:>12,.0f}{'':>8}")
    print(f"  {'cold job, process start to exit':<44}{whole:>8.2f}{job_rate:>12,.0f}{job_rate / raw_rate:>8.2f}")
    print(f"  {'  of which Spark session start':<44}{result['session']:>8.2f}")
    print(
        f"  {'  of which the query (start() to its end)':<44}{result['query']:>8.2f}{query_rate:>12,.0f}"
        f"{query_rate / raw_rate:>8.2f}"
    )
    print(
        f"  {'batch read of the same, fresh process: the read':<44}{batch['read']:>8.2f}{count / batch['read']:>12,.0f}"
    )
    print(
        f"  micro-batches: {result['batches']}; the query over the batch read: {result['query'] / batch['read']:.2f}x"
    )
    suite.summary.append(
        Summary(
            f"cold job: availableNow over {count:,} in a fresh process vs raw Direct Get",
            job_rate,
            raw_rate,
            "rows/s",
            f">= {TARGET:g}x",
            job_rate / raw_rate >= TARGET,
        )
    )
    suite.summary.append(
        Summary(
            f"cold job: the availableNow query vs a batch read of the same {count:,}, time",
            result["query"],
            batch["read"],
            "s",
            "<= 1.15x",
            result["query"] / batch["read"] <= 1.15,
        )
    )
    suite.api.delete_stream(STREAM)
