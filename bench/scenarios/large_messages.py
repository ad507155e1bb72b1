"""``large-messages``: reads and writes of 1 MB, 200 KB and 10 KB messages with default options and Spark's
default memory: MB/s against raw protocol loops on the same data and against what Spark itself moves from a
Python source, and the peak RSS of Spark's Python workers.

For each size, ``--large-mb`` MB of payload on a fresh 2-partition stream (file storage):

* Spark's ceiling: a Python source that does no I/O and yields the same rows (the connector's schema, the
  same payload size, record batches of the connector's default byte bound), streaming and batch, into the
  same sinks;
* streaming ``availableNow`` read into ``noop`` (Direct Get) and a bounded batch read (Direct Get,
  ``count`` and ``sum(length(data))`` checked), each against ``raw_direct`` reading both partition filters
  in 2 processes;
* the same streaming read with Direct Get switched off on the stream (the pinned pull path), against the
  raw pull loop on the same member consumers in 2 processes;
* ``df.write.format("jetstream")`` of as many rows of that size (2 tasks, msg ids on) against the raw
  pipelined publisher with msg ids, its window the writer's default bytes in flight.

Targets: every case completes with every Python worker at most ``RSS_TARGET_MB``; reads reach at least
``RATIO_TARGET`` of the lower of the raw loop and Spark's ceiling. Every contender runs ``ROUNDS`` times, the
faster kept; the table also gives the ratio against both baselines sharing the cores (a read needs nats-server
and Spark at once on the same machine), the cores the benchmark's processes used and what the rest of the
machine used meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import Cpu, heading
from noio import noio_source
from raw_direct import run_direct_parallel
from raw_publish import raw_publish, writer_ids
from raw_pull import run_baseline_parallel
from suite import Measurement, Suite, Summary, start_session

from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import member_consumer_name, partition_filters
from spark_jetstream.options import default_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SIZES = (1_000_000, 200_000, 10_000)
PARTITIONS = 2
RSS_TARGET_MB = 512
RATIO_TARGET = 0.8
STREAM = "LARGE"
TARGET = "LARGEW"
NOIO = "noio-large"
ROUNDS = 2
"""Runs of every contender, the faster kept: a first run may start Python workers or warm up the JVM's JIT (the
first 1 MB write of a session ran at a third of the second's speed)."""


@dataclass(frozen=True)
class Case:
    size: int
    what: str
    mb_s: float
    raw_mb_s: float
    ceiling_mb_s: float | None  # Spark's, for reads
    worker_mb: float
    cpu: Cpu | None

    @property
    def ratio(self) -> float:
        """Against the lower of the raw loop and Spark's ceiling."""
        bound = min(self.raw_mb_s, self.ceiling_mb_s or self.raw_mb_s)
        return self.mb_s / bound if bound else float("nan")

    @property
    def shared_ratio(self) -> float:
        """Against the raw loop and Spark's ceiling sharing the machine's cores (``1 / (1/raw + 1/Spark)``): each
        of the two baselines has the cores to itself, while a read needs the server and Spark at once."""
        if not self.ceiling_mb_s:
            return float("nan")
        return self.mb_s * (1 / self.raw_mb_s + 1 / self.ceiling_mb_s)


def run(suite: Suite) -> None:
    args = suite.args
    heading(f"large-messages: {args.large_mb:,} MB per size, {PARTITIONS} partitions, default options")
    spark = start_session(suite, "large-messages")
    cases: list[Case] = []
    try:
        for size in SIZES:
            cases += _one_size(suite, spark, size, args.large_mb * 1_000_000 // size)
    finally:
        spark.stop()
        for name in (STREAM, TARGET):
            if name in suite.api.stream_names():
                suite.api.delete_stream(name)
    print(
        f"  {'size':>9} {'case':<28} {'MB/s':>7} {'raw':>7} {'Spark':>7} {'ratio':>6} {'both':>6} {'worker MB':>10} "
        f"{'cores':>6} {'other CPU':>9}"
    )
    for c in cases:
        other = f"{c.cpu.other_share:.0%}" if c.cpu else "-"
        cores = f"{c.cpu.own_cores:.2f}" if c.cpu else "-"
        ceiling = f"{c.ceiling_mb_s:,.0f}" if c.ceiling_mb_s else "-"
        print(
            f"  {c.size:>9,} {c.what:<28} {c.mb_s:>7,.0f} {c.raw_mb_s:>7,.0f} {ceiling:>7} {c.ratio:>6.2f} "
            f"{c.shared_ratio:>6.2f} {c.worker_mb:>10,.0f} {cores:>6} {other:>9}"
        )
    worst = max(cases, key=lambda c: c.worker_mb)
    suite.summary.append(
        Summary(
            f"large messages: Python worker peak RSS, worst ({worst.size:,} B, {worst.what})",
            worst.worker_mb * 1024,
            RSS_TARGET_MB * 1024,
            "MB",
            f"<= {RSS_TARGET_MB} MB",
            worst.worker_mb <= RSS_TARGET_MB,
        )
    )
    slowest = min((c for c in cases if c.what != "write"), key=lambda c: c.ratio)
    bound = min(slowest.raw_mb_s, slowest.ceiling_mb_s or slowest.raw_mb_s)
    suite.summary.append(
        Summary(
            f"large messages: read MB/s vs min(raw, Spark), worst ({slowest.size:,} B, {slowest.what})",
            slowest.mb_s,
            bound,
            "MB/s",
            f">= {RATIO_TARGET:g}x",
            slowest.ratio >= RATIO_TARGET,
        )
    )


def _one_size(suite: Suite, spark: SparkSession, size: int, count: int) -> list[Case]:
    from pyspark.sql import functions as F

    api, url = suite.api, suite.url
    suite.fresh_stream(STREAM, "large.*", PARTITIONS)
    payload = b"x" * size
    published = publish_all(suite.conn, ((f"large.k{i % 64}", payload, None) for i in range(count)))
    if published.count != count:
        raise SystemExit(f"FAILED: published {published.count:,} of {count:,} messages of {size:,} B")
    megabytes = count * size / 1e6
    print(f"  {size:,} B: {count:,} messages ({megabytes:,.0f} MB) published", flush=True)
    cases = []

    def measured(label: str, work: Callable[[], None]) -> tuple[float, float, Cpu]:
        """Seconds, the largest Python worker's peak RSS in MB, CPU."""
        watch = Measurement(suite, f"large {size:,} B: {label}", spark)
        began = time.perf_counter()
        work()
        seconds = time.perf_counter() - began
        cpu = watch.stop()
        workers = suite.peaks[-1].kind("worker")
        return seconds, (max(workers) if workers else 0) / 1024, cpu

    def raw_direct_read(filters: list[str]) -> tuple[float, int]:
        seconds, got, nbytes = run_direct_parallel(suite.address, STREAM, filters)
        check("the raw Direct Get loop", got)
        return seconds, nbytes

    def check(what: str, got: int) -> None:
        if got != count:
            raise SystemExit(f"FAILED: {what} of {size:,} B messages read {got:,} of {count:,}")

    def streaming(group: str, source: str = "jetstream") -> None:
        reader = spark.readStream.format(source).option("servers", url).option("stream", STREAM)
        query = (
            reader.option("group", group)
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", suite.checkpoint(f"large-{size}-{group}"))
            .start()
        )
        query.awaitTermination()
        check(f"the streaming read ({group})", sum(p["numInputRows"] for p in query.recentProgress))

    def batch(source: str = "jetstream") -> None:
        rows = spark.read.format(source).option("servers", url).option("stream", STREAM).load()
        got = rows.agg(F.count("*").alias("n"), F.sum(F.length("data")).alias("bytes")).first()
        check(f"the batch read ({source})", got["n"])
        if got["bytes"] != count * size:
            raise SystemExit(f"FAILED: the batch read of {size:,} B messages got {got['bytes']:,} payload bytes")

    def fresh_target() -> None:
        if TARGET in api.stream_names():
            api.delete_stream(TARGET)
        api.create_stream({"name": TARGET, "subjects": ["bench.>"]})

    def spark_write(sink: str = "jetstream") -> None:
        frame = spark.range(0, count, 1, PARTITIONS).select(
            F.concat(F.lit("bench.k"), (F.col("id") % 64).cast("string")).alias("subject"),
            F.expr(f"cast(repeat('x', {size}) as binary)").alias("data"),
        )
        frame.write.format(sink).option("servers", url).mode("append").save()
        if sink == "jetstream":
            check("the write", api.stream_info(TARGET)["state"]["messages"])

    def best(label: str, work: Callable[[int], None]) -> tuple[float, float, Cpu]:
        """The faster of two runs (``work(run)``; the first may start Python workers or warm the JVM up), with the
        larger worker peak of the two."""
        runs = [measured(f"{label}, run {run}", lambda run=run: work(run)) for run in range(ROUNDS)]
        fastest = min(runs, key=lambda r: r[0])
        return fastest[0], max(r[1] for r in runs), fastest[2]

    spark.dataSource.register(noio_source(NOIO, size, count, PARTITIONS))
    stream_ceiling = megabytes / best("no-I/O streaming read", lambda run: streaming(f"noio-{run}", NOIO))[0]
    batch_ceiling = megabytes / best("no-I/O batch read", lambda run: batch(NOIO))[0]
    write_ceiling = megabytes / best("no-I/O write", lambda run: spark_write(NOIO))[0]

    filters = partition_filters(range(PARTITIONS))
    raw_direct = max(bytes_ / 1e6 / seconds for seconds, bytes_ in (raw_direct_read(filters) for _ in range(ROUNDS)))

    seconds, worker, cpu = best("streaming read, Direct Get", lambda run: streaming(f"direct-{run}"))
    cases.append(Case(size, "streaming (Direct Get)", megabytes / seconds, raw_direct, stream_ceiling, worker, cpu))
    seconds, worker, cpu = best("batch read", lambda run: batch())
    cases.append(Case(size, "batch (Direct Get)", megabytes / seconds, raw_direct, batch_ceiling, worker, cpu))

    api.call(("STREAM", "UPDATE", STREAM), {**api.stream_info(STREAM)["config"], "allow_direct": False}, "Updating")
    seconds, worker, cpu = best("streaming read, pull", lambda run: streaming(f"pull-{run}"))
    consumers = [member_consumer_name("pull-0", str(p)) for p in range(PARTITIONS)]
    pull_bytes = default_of("pullMaxBytes")  # as the connector's pulls
    raw_pull = max(
        megabytes / run_baseline_parallel(suite.conn, suite.address, consumers, count, STREAM, pull_bytes)[0]
        for _ in range(ROUNDS)
    )
    cases.append(Case(size, "streaming (pull)", megabytes / seconds, raw_pull, stream_ceiling, worker, cpu))

    def write(run: int) -> None:
        fresh_target()
        spark_write()

    seconds, worker, cpu = best("write", write)
    window = max(2, default_of("publishWindowBytes") // size)  # the writer's default bytes in flight
    raw_seconds = []
    for _ in range(ROUNDS):
        fresh_target()
        began = time.perf_counter()
        check("the raw publisher", raw_publish(suite.address, count, size, window, writer_ids()))
        raw_seconds.append(time.perf_counter() - began)
    cases.append(Case(size, "write", megabytes / seconds, megabytes / min(raw_seconds), write_ceiling, worker, cpu))
    print(
        f"    Spark's ceiling: streaming {stream_ceiling:,.0f} MB/s, batch {batch_ceiling:,.0f} MB/s, "
        f"write {write_ceiling:,.0f} MB/s"
    )
    for case in cases:
        print(f"    {case.what}: {case.mb_s:,.0f} MB/s, raw {case.raw_mb_s:,.0f}, worker {case.worker_mb:,.0f} MB")
    return cases
