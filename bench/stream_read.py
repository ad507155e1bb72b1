"""Benchmark: the end-to-end Spark streaming read against the raw-protocol pull baseline.

One run starts a real nats-server (``EmbeddedServer``, file store in a temp dir), publishes
``--messages`` messages of ``--size`` bytes to 1,024 interleaved subjects ``ev.k<i % 1024>`` of a
stream partitioned ``--partitions`` ways (as ``bench/pull_reader.py`` does), and then reads all
of it twice on the same server and data:

* ``spark``: ``spark.readStream.format("jetstream")`` (group ``bench``) written to the ``noop``
  sink with ``trigger(availableNow=True)`` in a ``local[2]`` SparkSession, timed from
  ``start()`` to the return of ``awaitTermination()``. The source creates the member consumers
  ``bench-0``.. itself. Rows are counted by summing ``numInputRows`` over every micro-batch's
  progress (all batches are kept: ``spark.sql.streaming.numRecentProgressUpdates`` is raised and
  the batch ids are checked to be contiguous) and must equal ``--messages``. A small warm-up
  query on a separate stream runs first, so JVM and Python worker start-up are not measured;
  its (cold) time is printed too, and so is the SparkSession start-up, neither in the rate.
* ``baseline``: the raw NATS pull loop of ``bench/pull_reader.py`` (``raw_drain``) draining the
  same member consumers the Spark run created, after an untimed UNPIN + RESET to seq 1 of each.
  It runs in 2 spawned processes taking members one at a time (as ``local[2]`` runs 2 tasks at
  once); a sequential drain in this process is printed too. The worker processes are started
  and warm before timing. Both must read exactly ``--messages`` messages.

It prints messages, seconds and rows/s per contender, the ratio spark/baseline, peak RSS of
the driver (Python) process, the Spark JVM and its Python children, and the per-batch
``durationMs`` breakdown of the measured query (where Spark's time went).

``--storage memory`` takes the server's file-store read cost out of both contenders.
``--max-per-trigger`` sets ``maxMessagesPerTrigger`` to see the cost of many micro-batches.

Run it from the repository root::

    python bench/stream_read.py --messages 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pull_reader import GROUP, INBOX, STREAM, SUBJECTS, messages, raw_drain, server_version

from spark_jetstream.connection import Connection, ConnectionOptions, close_all, connect
from spark_jetstream.embedded import EmbeddedServer
from spark_jetstream.groups import partitioned_stream_config
from spark_jetstream.jsapi import JetStreamApi
from spark_jetstream.publish import Message, publish_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WARMUP_STREAM = "WARMUP"
WARMUP_GROUP = "warmup"
PARALLEL = 2
"""Baseline processes: as many as ``local[2]`` runs tasks at once."""

DURATIONS = ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")
SHOWN_BATCHES = 12


@dataclass
class SparkRun:
    messages: int
    seconds: float
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def batches(self) -> int:
        return len(self.progress)


@dataclass(frozen=True)
class Row:
    contender: str
    messages: int
    seconds: float
    batches: int | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


# -- set-up ------------------------------------------------------------------------------------


def create_stream(conn: Connection, name: str, subject: str, partitions: int, storage: str) -> None:
    JetStreamApi(conn).create_stream(partitioned_stream_config(name, subject, partitions, storage=storage))


def warmup_messages(count: int, size: int) -> Iterator[Message]:
    payload = os.urandom(size)
    for i in range(count):
        yield f"warm.k{i % SUBJECTS}", payload, None


def publish(conn: Connection, what: str, batch: Iterator[Message], expected: int) -> float:
    began = time.perf_counter()
    published = publish_all(conn, batch)
    took = time.perf_counter() - began
    if published.count != expected:
        raise SystemExit(f"FAILED: published {published.count:,} of {expected:,} {what} messages")
    return took


# -- spark -------------------------------------------------------------------------------------


def start_spark() -> tuple[SparkSession, float]:
    """A ``local[2]`` session; return it and how long start-up took."""
    from pyspark.sql import SparkSession

    began = time.perf_counter()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("stream_read bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark, time.perf_counter() - began


def run_spark(
    spark: SparkSession,
    url: str,
    stream: str,
    group: str,
    checkpoint: str,
    max_per_trigger: int | None,
    options: dict[str, str] | None = None,
) -> SparkRun:
    """One ``availableNow`` query into the noop sink; return its rows, time and batch progress.

    ``options`` are further source options (e.g. ``members``)."""
    reader = spark.readStream.format("jetstream").option("servers", url).option("stream", stream).option("group", group)
    if max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(max_per_trigger))
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.format("noop").trigger(availableNow=True)
    writer = writer.option("checkpointLocation", checkpoint)
    began = time.perf_counter()
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:  # StreamingQueryException: report the connector's error as is
        raise SystemExit(f"FAILED: the Spark query on {stream} failed:\n{exc}") from None
    seconds = time.perf_counter() - began
    progress = sorted((dict(p) for p in query.recentProgress), key=lambda p: p["batchId"])
    ids = [p["batchId"] for p in progress]
    if ids and ids != list(range(ids[0], ids[0] + len(ids))):
        print(f"WARNING: batch ids of {stream} are not contiguous: {ids[:5]}..{ids[-5:]}")
    if ids and ids[0] != 0:
        print(f"WARNING: progress of {stream} starts at batch {ids[0]}: earlier batches are not counted")
    return SparkRun(sum(p["numInputRows"] or 0 for p in progress), seconds, progress)


def jvm_pid(spark: SparkSession) -> int | None:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    except Exception:
        return None


def peak_rss_kb(pid: int) -> int | None:
    """VmHWM (peak resident set) of a live process, in KiB."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Live descendant pids of ``pid`` (Spark's Python daemon, workers, source runner)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as children:
                    kids = [int(k) for k in children.read().split()]
            except OSError:
                continue
            found += kids
            stack += kids
    return found


def command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            args = cmdline.read().split(b"\0")
    except OSError:
        return "?"
    for arg in args[1:]:  # the module a python worker runs, e.g. pyspark.daemon
        if arg.startswith(b"pyspark.") or arg.endswith(b".py"):
            return arg.decode(errors="replace")
    return os.path.basename(args[0].decode(errors="replace")) if args else "?"


# -- baseline ----------------------------------------------------------------------------------


def _worker_ready(_: int) -> int:
    time.sleep(0.3)
    return os.getpid()


def drain(address: tuple[str, int], consumer: str) -> int:
    """``raw_drain`` on an inbox of its own: concurrent drains on one shared inbox see each other's messages."""
    return raw_drain(address, STREAM, consumer, b"%s.%d.%s" % (INBOX, os.getpid(), consumer.encode()))


def _drain(job: tuple[tuple[str, int], str]) -> tuple[str, int, float]:
    address, consumer = job
    began = time.perf_counter()
    count = drain(address, consumer)
    return consumer, count, time.perf_counter() - began


def reset_members(conn: Connection, consumers: list[str]) -> int:
    """UNPIN and RESET every member to seq 1; return the messages now pending on them."""
    api = JetStreamApi(conn)
    pending = 0
    for consumer in consumers:
        conn.run(api.unpin(STREAM, consumer))
        pending += conn.run(api.reset(STREAM, consumer, 1))["num_pending"]
    return pending


def run_baseline_parallel(
    conn: Connection, address: tuple[str, int], consumers: list[str], expected: int
) -> tuple[float, int]:
    """Drain the members with ``raw_drain`` in ``PARALLEL`` spawned processes; resets and process start not timed."""
    workers = min(PARALLEL, len(consumers))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in range(20):  # every worker up and done importing before the clock starts
            if len(set(pool.map(_worker_ready, range(workers), chunksize=1))) == workers:
                break
        if reset_members(conn, consumers) != expected:
            raise SystemExit("FAILED: the member consumers do not hold every message after RESET to seq 1")
        began = time.perf_counter()
        results = pool.map(_drain, [(address, c) for c in consumers], chunksize=1)
        seconds = time.perf_counter() - began
    return seconds, sum(count for _, count, _ in results)


def run_baseline_sequential(conn: Connection, address: tuple[str, int], consumers: list[str]) -> tuple[float, int]:
    """Drain the members one after the other in this process; the resets are not timed."""
    reset_members(conn, consumers)
    began = time.perf_counter()
    total = sum(drain(address, consumer) for consumer in consumers)
    return time.perf_counter() - began, total


# -- output ------------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    print(f"{'contender':<26} {'messages':>11} {'batches':>7} {'seconds':>8} {'rows/s':>10}")
    for row in rows:
        batches = "-" if row.batches is None else f"{row.batches:,}"
        print(f"{row.contender:<26} {row.messages:>11,} {batches:>7} {row.seconds:>8.2f} {row.rate:>10,.0f}")


def print_durations(run: SparkRun) -> None:
    """Per-batch ``durationMs`` of the measured query, and the totals."""
    print(f"\nper-batch durationMs of the measured query ({run.batches} batches):")
    header = f"{'batch':>6} {'rows':>10} " + " ".join(f"{key:>16}" for key in DURATIONS)
    print(header)
    progress = run.progress
    shown = progress if len(progress) <= SHOWN_BATCHES else progress[:8] + progress[-4:]
    for index, p in enumerate(shown):
        if len(progress) > SHOWN_BATCHES and index == 8:
            print(f"{'...':>6}")
        durations = p["durationMs"]
        cells = " ".join(f"{durations.get(key, 0):>16,}" for key in DURATIONS)
        print(f"{p['batchId']:>6} {p['numInputRows'] or 0:>10,} {cells}")
    totals = {key: sum(p["durationMs"].get(key, 0) for p in progress) for key in DURATIONS}
    print(f"{'total':>6} {run.messages:>10,} " + " ".join(f"{totals[key]:>16,}" for key in DURATIONS))
    wall_ms = run.seconds * 1000
    outside = wall_ms - totals["triggerExecution"]
    print(
        f"wall {wall_ms:,.0f} ms: triggers {totals['triggerExecution']:,} ms "
        f"({totals['triggerExecution'] / wall_ms:.0%}), addBatch {totals['addBatch']:,} ms "
        f"({totals['addBatch'] / wall_ms:.0%}), outside triggers (query start/stop) {outside:,.0f} ms"
    )


def print_memory(jvm: int | None, jvm_peak_kb: int | None, children: dict[int, tuple[str, int | None]]) -> None:
    """Peak RSS of this (driver) process, and of the Spark JVM and its live children as last seen."""
    driver_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS: driver Python process {driver_mb:,.0f} MB", end="")
    if jvm_peak_kb:
        print(f", Spark JVM (pid {jvm}) {jvm_peak_kb / 1024:,.0f} MB", end="")
    print()
    by_name: dict[str, list[int]] = {}
    for name, kb in children.values():
        if kb:
            by_name.setdefault(name, []).append(kb)
    for name, sizes in sorted(by_name.items()):
        print(
            f"  {len(sizes)} live {name} processes under the JVM: peak RSS max {max(sizes) / 1024:,.0f} MB, "
            f"sum {sum(sizes) / 1024:,.0f} MB"
        )


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to publish and read")
    parser.add_argument("--partitions", type=int, default=4, help="partitions = member consumers")
    parser.add_argument("--size", type=int, default=100, help="payload bytes per message")
    parser.add_argument(
        "--storage",
        choices=("file", "memory"),
        default="file",
        help="stream storage; memory takes the server's file-store read cost out of both contenders",
    )
    parser.add_argument("--warmup-messages", type=int, default=10_000, help="messages of the warm-up query")
    parser.add_argument("--max-per-trigger", type=int, default=None, help="maxMessagesPerTrigger (default: none)")
    args = parser.parse_args(argv)
    if min(args.messages, args.partitions, args.warmup_messages) < 1 or args.size < 0:
        parser.error("--messages, --partitions and --warmup-messages must be positive, --size not negative")
    if args.max_per_trigger is not None and args.max_per_trigger < 1:
        parser.error("--max-per-trigger must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoints = tempfile.mkdtemp(prefix="stream-read-")
    spark: SparkSession | None = None
    rows: list[Row] = []
    try:
        with EmbeddedServer(name="bench") as server:
            address = ("127.0.0.1", server.port)
            conn = connect(ConnectionOptions(servers=(server.url,)))
            try:
                import pyspark

                print(
                    f"nats-server {server_version(address)}, PySpark {pyspark.__version__}, "
                    f"{os.cpu_count()} cores, Python {platform.python_version()}"
                )
                create_stream(conn, WARMUP_STREAM, "warm.*", args.partitions, args.storage)
                create_stream(conn, STREAM, "ev.*", args.partitions, args.storage)
                publish(conn, "warm-up", warmup_messages(args.warmup_messages, args.size), args.warmup_messages)
                took = publish(conn, "bench", messages(args.messages, args.size), args.messages)
                print(
                    f"published {args.messages:,} msgs of {args.size} B to {SUBJECTS:,} subjects "
                    f"in {args.partitions} partitions ({args.storage} storage): {took:.2f} s "
                    f"({args.messages / took:,.0f} msgs/s)"
                )

                spark, startup = start_spark()
                print(f"SparkSession start-up: {startup:.2f} s (not in any rate)")
                warm = run_spark(
                    spark, server.url, WARMUP_STREAM, WARMUP_GROUP, os.path.join(checkpoints, "warmup"), None
                )
                if warm.messages != args.warmup_messages:
                    raise SystemExit(f"FAILED: the warm-up query read {warm.messages:,} of {args.warmup_messages:,}")
                rows.append(Row("spark warm-up (cold)", warm.messages, warm.seconds, warm.batches))

                run = run_spark(
                    spark, server.url, STREAM, GROUP, os.path.join(checkpoints, "bench"), args.max_per_trigger
                )
                if run.messages != args.messages:
                    raise SystemExit(f"FAILED: the Spark query read {run.messages:,} of {args.messages:,} messages")
                rows.append(Row("spark", run.messages, run.seconds, run.batches))

                jvm = jvm_pid(spark)
                children = (
                    {pid: (command_name(pid), peak_rss_kb(pid)) for pid in descendants(jvm)} if jvm is not None else {}
                )
                jvm_peak = peak_rss_kb(jvm) if jvm is not None else None
                spark.stop()  # the baseline runs without Spark's threads around
                spark = None

                consumers = [f"{GROUP}-{p}" for p in range(args.partitions)]
                seconds, count = run_baseline_parallel(conn, address, consumers, args.messages)
                if count != args.messages:
                    raise SystemExit(f"FAILED: the parallel baseline read {count:,} of {args.messages:,} messages")
                parallel = Row(f"baseline ({PARALLEL} processes)", count, seconds)
                seconds, count = run_baseline_sequential(conn, address, consumers)
                if count != args.messages:
                    raise SystemExit(f"FAILED: the sequential baseline read {count:,} of {args.messages:,} messages")
                sequential = Row("baseline (sequential)", count, seconds)
                rows += [parallel, sequential]
            finally:
                close_all()
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)

    print()
    print_table(rows)
    spark_row = rows[1]
    print(
        f"\nratio spark/baseline: {spark_row.rate / parallel.rate:.2f} (vs {PARALLEL} processes), "
        f"{spark_row.rate / sequential.rate:.2f} (vs sequential)"
    )
    print(f"SparkSession start-up {startup:.2f} s, not included in any rate")
    print_memory(jvm, jvm_peak, children)
    print_durations(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
