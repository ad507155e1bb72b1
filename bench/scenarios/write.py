"""``write``: the Spark writer against raw pipelined publishing, on the suite's server in the same run.

``--messages`` x 100 B on the 1,024 subjects ``bench.k<i % 1024>``, each contender into a freshly created stream
``WBENCH``, ``WRITE_ROUNDS`` rounds of every contender in turn, best kept:

* ``raw``: the raw pipelined publisher of ``bench/raw_publish.py``, ``WRITE_WINDOW`` messages ahead of their
  PubAcks; ``raw+ids`` the same with a ``Nats-Msg-Id`` per message shaped like the Spark writer's (the same
  server work as exactly-once);
* ``publish_all``: ``spark_jetstream.client.publish.publish_all`` (nats-py connection, one process);
* ``spark``: ``spark.range(n)`` with a 100-byte string ``data`` column written by ``df.write.format("jetstream")``
  (``WRITE_TASKS`` tasks), msg ids on (the default); ``spark-noids`` with ``deduplicate=false``; ``spark-atomic``
  with ``progressSubject`` (atomic batches of 1,000 messages with progress markers: exactly-once at any age). Timed from
  ``save()`` to its return; an untimed write of a fifth of ``--messages`` first warms up the Python workers and
  the JVM's JIT (a 20,000-row warm-up left the first measured write up to 40% slower than the next, hot-spot
  compilation included).

Every contender must leave exactly ``--messages`` rows in the stream (and ``spark-atomic`` its markers). Then
``LARGE_COUNT`` x ``LARGE_SIZE`` messages, ``spark`` against ``spark-atomic`` alone. The summary rows are the Spark
writer against the raw publisher doing the same server work (``spark`` / ``raw+ids``, ``spark-noids`` / ``raw``)
and the atomic writer against today's (``spark-atomic`` / ``spark``, both sizes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from common import SUBJECTS, Cpu, heading, print_rows
from raw_publish import raw_publish, writer_ids
from suite import SIZE, Measurement, Suite, Summary, start_session

from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all

STREAM = "WBENCH"
WRITE_WINDOW = 4000
WRITE_TASKS = 2
WRITE_ROUNDS = 2
"""Every write contender runs this many times in turn and keeps its best (writes take seconds, and
one slow run on this shared machine moved a ratio by 0.15)."""
WRITE_TARGET = 0.8
LARGE_SIZE = 200_000
LARGE_COUNT = 1000
PROGRESS = "benchp"


@dataclass(frozen=True)
class Run:
    contender: str
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def fresh_stream(api: JetStreamApi, storage: str) -> None:
    if STREAM in api.stream_names():
        api.delete_stream(STREAM)
    config = {"name": STREAM, "subjects": ["bench.>", f"{PROGRESS}.>"], "storage": storage, "allow_atomic": True}
    api.create_stream(config)


def warmup_rows(messages: int) -> int:
    """Rows of the untimed warm-up write (see the module doc)."""
    return max(20_000, messages // 5)


def timed(api: JetStreamApi, storage: str, name: str, expected: int, work: Callable[[], object]) -> Run:
    """Run ``work`` into a fresh stream, timed; it must leave ``expected`` messages there."""
    fresh_stream(api, storage)
    began = time.perf_counter()
    work()
    seconds = time.perf_counter() - began
    info = api.call(("STREAM", "INFO", STREAM), {"subjects_filter": "bench.>"}, "Counting rows", STREAM)
    stored = sum((info["state"].get("subjects") or {}).values())  # rows, not the atomic writer's markers
    if stored != expected:
        raise SystemExit(f"FAILED: {name} left {stored:,} messages in the stream, expected {expected:,}")
    return Run(name, expected, seconds)


def run(suite: Suite) -> None:
    args = suite.args
    n = args.messages
    heading(f"write: {n:,} x {SIZE} B, window {WRITE_WINDOW}, {WRITE_TASKS} Spark tasks")
    spark = start_session(suite, "write")
    api, storage, address = suite.api, args.storage, suite.address
    runs: dict[str, tuple[Run, Cpu]] = {}
    try:
        from pyspark.sql import functions as F

        def spark_write(count: int, size: int = SIZE, **options: str) -> Callable[[], None]:
            def work() -> None:
                frame = spark.range(0, count, 1, WRITE_TASKS).select(
                    F.concat(F.lit("bench.k"), (F.col("id") % SUBJECTS).cast("string")).alias("subject"),
                    F.lpad(F.col("id").cast("string"), size, "x").alias("data"),
                )
                writer = frame.write.format("jetstream").option("servers", suite.url)
                writer.option("publishWindow", str(WRITE_WINDOW)).options(**options).mode("append").save()

            return work

        warm = warmup_rows(n)
        timed(api, storage, "warm-up", warm, spark_write(warm))
        payload = os.urandom(SIZE)
        contenders: list[tuple[str, Callable[[], object]]] = [
            ("raw", lambda: raw_publish(address, n, SIZE, WRITE_WINDOW, None)),
            ("raw+ids", lambda: raw_publish(address, n, SIZE, WRITE_WINDOW, writer_ids())),
            (
                "publish_all",
                lambda: publish_all(
                    suite.conn, ((f"bench.k{i % SUBJECTS}", payload, None) for i in range(n)), WRITE_WINDOW
                ),
            ),
            ("spark", spark_write(n)),
            ("spark-noids", spark_write(n, deduplicate="false")),
            ("spark-atomic", spark_write(n, progressSubject=PROGRESS)),
            (f"spark {LARGE_SIZE // 1000} KB", spark_write(LARGE_COUNT, LARGE_SIZE)),
            (f"spark-atomic {LARGE_SIZE // 1000} KB", spark_write(LARGE_COUNT, LARGE_SIZE, progressSubject=PROGRESS)),
        ]
        for round_ in range(1, WRITE_ROUNDS + 1):
            for name, work in contenders:
                driver = spark if name.startswith("spark") else None
                watch = Measurement(suite, f"write: {name}, round {round_}", driver)
                run = timed(api, storage, name, LARGE_COUNT if name.endswith(" KB") else n, work)
                cpu = watch.stop()
                print(f"  round {round_}, {name}: {run.rate:,.0f} msgs/s", flush=True)
                if name not in runs or run.rate > runs[name][0].rate:
                    runs[name] = (run, cpu)
    finally:
        spark.stop()
        if STREAM in api.stream_names():
            api.delete_stream(STREAM)
    print_rows([(name, run.messages, run.seconds, None, cpu) for name, (run, cpu) in runs.items()])
    for name, (run, _) in runs.items():
        size = LARGE_SIZE if name.endswith(" KB") else SIZE
        print(f"  {name}: {run.rate * size / 1e6:,.1f} MB/s")
    large = f"{LARGE_SIZE // 1000} KB"
    for connector, baseline, what in (
        ("spark", "raw+ids", "write exactly-once: spark vs raw+ids (msgs/s)"),
        ("spark-noids", "raw", "write no ids: spark-noids vs raw (msgs/s)"),
        ("spark-atomic", "spark", "write at any age: spark-atomic vs spark (msgs/s)"),
        (f"spark-atomic {large}", f"spark {large}", f"write at any age, {large}: spark-atomic vs spark (msgs/s)"),
    ):
        mine, theirs = runs[connector][0].rate, runs[baseline][0].rate
        suite.summary.append(
            Summary(what, mine, theirs, "msgs/s", f">= {WRITE_TARGET:g}x", mine / theirs >= WRITE_TARGET)
        )
