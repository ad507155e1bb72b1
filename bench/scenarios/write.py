"""``write``: the Spark writer against raw pipelined publishing, the contenders of ``bench/write.py``."""

from __future__ import annotations

import os
from collections.abc import Callable

from common import Cpu, heading, print_rows
from suite import SIZE, Measurement, Suite, Summary, start_session
from write import STREAM as WRITE_STREAM
from write import SUBJECTS as WRITE_SUBJECTS
from write import Run as WriteRun
from write import raw_publish, timed, warmup_rows, writer_ids

from spark_jetstream.client.publish import publish_all

WRITE_WINDOW = 4000
WRITE_TASKS = 2
WRITE_ROUNDS = 2
"""Every write contender runs this many times in turn and keeps its best (writes take seconds, and
one slow run on this shared machine moved a ratio by 0.15)."""
WRITE_TARGET = 0.8


def run(suite: Suite) -> None:
    args = suite.args
    n = args.messages
    heading(f"write: {n:,} x {SIZE} B, window {WRITE_WINDOW}, {WRITE_TASKS} Spark tasks (bench/write.py)")
    spark = start_session(suite, "write")
    # nats-server was started from a helper thread with a preexec_fn, which closes py4j's connection
    # of this thread: give the new JVM thread the active session back (see bench/write.py).
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[attr-defined]
    api, storage, address = suite.api, args.storage, suite.address
    runs: dict[str, tuple[WriteRun, Cpu]] = {}
    try:
        from pyspark.sql import functions as F

        def spark_write(count: int, **options: str) -> Callable[[], None]:
            def work() -> None:
                frame = spark.range(0, count, 1, WRITE_TASKS).select(
                    F.concat(F.lit("bench.k"), (F.col("id") % WRITE_SUBJECTS).cast("string")).alias("subject"),
                    F.lpad(F.col("id").cast("string"), SIZE, "x").alias("data"),
                )
                writer = frame.write.format("jetstream").option("servers", suite.url)
                writer.option("publishWindow", str(WRITE_WINDOW)).options(**options).mode("append").save()

            return work

        warm = warmup_rows(n)
        timed(suite.conn, api, storage, "warm-up", warm, spark_write(warm))
        payload = os.urandom(SIZE)
        contenders: list[tuple[str, Callable[[], object]]] = [
            ("raw", lambda: raw_publish(address, n, SIZE, WRITE_WINDOW, None)),
            ("raw+ids", lambda: raw_publish(address, n, SIZE, WRITE_WINDOW, writer_ids())),
            (
                "publish_all",
                lambda: publish_all(
                    suite.conn, ((f"bench.k{i % WRITE_SUBJECTS}", payload, None) for i in range(n)), WRITE_WINDOW
                ),
            ),
            ("spark", spark_write(n)),
            ("spark-noids", spark_write(n, deduplicate="false")),
        ]
        for round_ in range(1, WRITE_ROUNDS + 1):
            for name, work in contenders:
                driver = spark if name.startswith("spark") else None
                watch = Measurement(suite, f"write: {name}, round {round_}", driver)
                run = timed(suite.conn, api, storage, name, n, work)  # type: ignore[arg-type]
                cpu = watch.stop()
                print(f"  round {round_}, {name}: {run.rate:,.0f} msgs/s", flush=True)
                if name not in runs or run.rate > runs[name][0].rate:
                    runs[name] = (run, cpu)
    finally:
        spark.stop()
        if WRITE_STREAM in api.stream_names():
            api.delete_stream(WRITE_STREAM)
    print_rows([(name, run.messages, run.seconds, None, cpu) for name, (run, cpu) in runs.items()])
    for connector, baseline, what in (
        ("spark", "raw+ids", "write exactly-once: spark vs raw+ids (msgs/s)"),
        ("spark-noids", "raw", "write no ids: spark-noids vs raw (msgs/s)"),
    ):
        mine, theirs = runs[connector][0].rate, runs[baseline][0].rate
        suite.summary.append(
            Summary(what, mine, theirs, "msgs/s", f">= {WRITE_TARGET:g}x", mine / theirs >= WRITE_TARGET)
        )
