"""``latency``: publish to ``foreachBatch`` at a steady rate, against the naive source (see ``bench/run.py``)."""

from __future__ import annotations

import os
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common import SUBJECTS, heading, rate
from suite import NAIVE_FORMAT, READ_PARTITIONS, SIZE, Measurement, Suite, Summary, register_naive, start_session

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.publish import Message, publish_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LATENCY_P50_TARGET = 0.3
LATENCY_P99_TARGET = 0.5
TICK = 0.01
"""Seconds between the latency publisher's sends."""
PRIMING = 200
"""Messages published and read before the latency measurement starts (not measured)."""
STAMP = struct.Struct("<dc")
"""Latency payloads start with the publish time (``time.time()``) and a marker: P priming, M measured."""


@dataclass
class LatencyRun:
    """What the ``foreachBatch`` sink saw: per measured row, seconds from publish to sink and to the store."""

    contender: str
    to_sink: list[float] = field(default_factory=list)
    to_store: list[float] = field(default_factory=list)
    primed: int = 0
    batches: int = 0
    first_publish: float = 0.0
    last_publish: float = 0.0
    last_sink: float = 0.0
    progress: list[dict[str, Any]] = field(default_factory=list)

    def sink(self, rows: list[Any]) -> None:
        now = time.time()
        measured = 0
        for data, stored_us in rows:
            published, mark = STAMP.unpack_from(data)
            if mark == b"P":
                self.primed += 1
                continue
            self.to_sink.append(now - published)
            self.to_store.append(stored_us / 1e6 - published)
            measured += 1
        if measured:
            self.batches += 1
            self.last_sink = now

    def percentile(self, q: float) -> float:
        ordered = sorted(self.to_sink)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def rows_per_s(self) -> float:
        """Rows into the sink per second, from the first publish to the last row's arrival."""
        return rate(len(self.to_sink), self.last_sink - self.first_publish)

    @property
    def published_per_s(self) -> float:
        return rate(len(self.to_sink), self.last_publish - self.first_publish)


class SteadyPublisher(threading.Thread):
    """Publishes ``count`` messages at ``rate`` msg/s, each payload starting with its publish time."""

    def __init__(
        self, conn: Connection, prefix: str, rate: int, count: int, mark: bytes = b"M", distinct: int = SUBJECTS
    ) -> None:
        super().__init__(name="steady-publisher", daemon=True)
        self.conn, self.prefix, self.rate, self.count, self.mark = conn, prefix, rate, count, mark
        self.distinct = distinct  # subjects (keys) the messages go to, in turn
        self.sent = 0
        self.began = self.ended = 0.0
        self.error: BaseException | None = None
        self.padding = os.urandom(max(0, SIZE - STAMP.size))

    def batch(self, first: int, end: int) -> Iterator[Message]:
        for i in range(first, end):  # runs on the connection's loop thread, right before the send
            yield (
                f"{self.prefix}.{self.mark.decode()}{i % self.distinct}",
                STAMP.pack(time.time(), self.mark) + self.padding,
                None,
            )

    def run(self) -> None:
        try:
            self.began = time.time()
            start = time.monotonic()
            while self.sent < self.count:
                due = min(self.count, int((time.monotonic() - start) * self.rate) + 1)
                if due > self.sent:
                    stored = publish_all(self.conn, self.batch(self.sent, due)).count
                    if stored != due - self.sent:
                        raise RuntimeError(f"stored {stored} of {due - self.sent} messages")
                    self.sent = due
                time.sleep(TICK)
            self.ended = time.time()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def measure_latency(
    suite: Suite,
    spark: SparkSession,
    contender: str,
    source: str,
    options: dict[str, str],
    stream: str,
    prefix: str,
    columns: tuple[str, str] = ("data", "timestamp"),
    distinct: int = SUBJECTS,
) -> LatencyRun:
    """Run a default-trigger query into ``foreachBatch`` while publishing steadily; latencies per row (``columns``:
    the payload's and the store time's; ``distinct``: subjects the messages go to)."""
    from pyspark.sql import functions as F

    args = suite.args
    result = LatencyRun(contender)
    lock = threading.Lock()

    def sink(frame: Any, batch_id: int) -> None:
        rows = frame.select(columns[0], F.unix_micros(columns[1])).collect()
        with lock:
            result.sink(rows)

    reader = spark.readStream.format(source)
    for key, value in options.items():
        reader = reader.option(key, value)
    checkpoint = suite.checkpoint(f"latency-{stream}")
    query = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
    try:
        priming = SteadyPublisher(suite.conn, prefix, 1000, PRIMING, b"P", distinct)
        priming.run()
        deadline = time.monotonic() + 120
        while result.primed < PRIMING:  # workers and callback server busy once before measuring
            if query.exception() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: {contender}: priming rows not read ({query.exception()})")
            time.sleep(0.05)
        count = int(args.rate * args.latency_seconds)
        last = query.lastProgress
        first_batch = last["batchId"] + 1 if last else 0  # the measured batches' progress only
        watch = Measurement(suite, f"latency: {contender}", spark)
        publisher = SteadyPublisher(suite.conn, prefix, args.rate, count, distinct=distinct)
        publisher.start()
        publisher.join()
        if publisher.error is not None:
            raise SystemExit(f"FAILED: the latency publisher failed: {publisher.error}")
        result.first_publish, result.last_publish = publisher.began, publisher.ended
        deadline = time.monotonic() + 60
        while len(result.to_sink) < count:
            if query.exception() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: {contender} read {len(result.to_sink):,} of {count:,} ({query.exception()})")
            time.sleep(0.05)
        cpu = watch.stop()
        result.progress = [dict(p) for p in query.recentProgress if p["batchId"] >= first_batch]
    finally:
        query.stop()
    if len(result.to_sink) != count:
        raise SystemExit(f"FAILED: {contender} read {len(result.to_sink):,} rows, {count:,} were published")
    print(f"  {contender}: {count:,} rows, other CPU {cpu.other_share:.0%}", flush=True)
    return result


def print_latency(runs: list[LatencyRun]) -> None:
    print(
        f"  {'contender':<26} {'rows':>8} {'rows/s':>7} {'batches':>7} {'p50 s':>6} {'p90 s':>6} {'p99 s':>6} "
        f"{'max s':>6} {'stored p50 ms':>13} {'published/s':>11}"
    )
    for r in runs:
        stored = statistics.median(r.to_store) * 1000 if r.to_store else float("nan")
        print(
            f"  {r.contender:<26} {len(r.to_sink):>8,} {r.rows_per_s:>7,.0f} {r.batches:>7} {r.percentile(0.5):>6.2f} "
            f"{r.percentile(0.9):>6.2f} {r.percentile(0.99):>6.2f} {max(r.to_sink):>6.2f} {stored:>13.1f} "
            f"{r.published_per_s:>11,.0f}"
        )


LATENCY_DURATIONS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


def print_latency_durations(runs: list[LatencyRun]) -> None:
    """Where a micro-batch's time goes: mean ``durationMs`` over the batches that had rows."""
    print("\n  mean durationMs of the batches with rows:")
    print(f"  {'contender':<26} {'batches':>7} {'trigger':>8} " + " ".join(f"{key:>13}" for key in LATENCY_DURATIONS))
    for r in runs:
        active = [p for p in r.progress if (p.get("numInputRows") or 0) > 0]
        if not active:
            continue
        means = {
            key: statistics.fmean(p["durationMs"].get(key, 0) for p in active)
            for key in ("triggerExecution", *LATENCY_DURATIONS)
        }
        print(
            f"  {r.contender:<26} {len(active):>7} {means['triggerExecution']:>8,.0f} "
            + " ".join(f"{means[key]:>13,.0f}" for key in LATENCY_DURATIONS)
        )


def run(suite: Suite) -> None:
    args = suite.args
    heading(
        f"latency: {args.rate:,} msg/s for {args.latency_seconds:g} s, {READ_PARTITIONS} partitions, "
        "default trigger into foreachBatch"
    )
    suite.fresh_stream("LAT", "lat.*", READ_PARTITIONS)
    naive = args.naive_dir if (args.naive_dir / "naive_source.py").is_file() else None
    if naive is not None:
        suite.fresh_stream("LATNAIVE", "latn.*", READ_PARTITIONS)
    conf = {"spark.executorEnv.PYTHONPATH": str(naive)} if naive else {}
    spark = start_session(suite, "latency", conf)
    runs: list[LatencyRun] = []
    try:
        options = {"servers": suite.url, "stream": "LAT", "group": "latency"}
        runs.append(measure_latency(suite, spark, "spark jetstream", "jetstream", options, "LAT", "lat"))
        if naive is not None:
            register_naive(spark, naive)
            options = {"servers": suite.url, "stream": "LATNAIVE"}
            runs.append(measure_latency(suite, spark, "naive source", NAIVE_FORMAT, options, "LATNAIVE", "latn"))
    finally:
        spark.stop()
    print_latency(runs)
    print_latency_durations(runs)
    connector = runs[0]
    base = runs[1] if len(runs) > 1 else None
    for name, q, target in (("p50", 0.5, LATENCY_P50_TARGET), ("p99", 0.99, LATENCY_P99_TARGET)):
        value = connector.percentile(q)
        suite.summary.append(
            Summary(
                f"latency {name}, publish to foreachBatch (vs naive)",
                value,
                base.percentile(q) if base else float("nan"),
                "s",
                f"< {target:g} s",
                value < target,
            )
        )
    suite.api.delete_stream("LAT")
    if naive is not None:
        suite.api.delete_stream("LATNAIVE")
