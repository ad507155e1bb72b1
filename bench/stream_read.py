"""Benchmark: the end-to-end Spark streaming read against the raw-protocol pull baseline.

One run starts a real nats-server (``EmbeddedServer``, file store in a temp dir), publishes
``--messages`` messages of ``--size`` bytes to 1,024 interleaved subjects ``ev.k<i % 1024>`` of a
stream partitioned ``--partitions`` ways (``bench/common.py``), and then reads all
of it twice on the same server and data:

* ``spark``: ``spark.readStream.format("jetstream")`` (group ``bench``) written to the ``noop``
  sink with ``trigger(availableNow=True)`` in a ``local[2]`` SparkSession, timed from
  ``start()`` to the return of ``awaitTermination()``. The source creates the member consumers
  ``bench-0``.. itself. Rows are counted by summing ``numInputRows`` over every micro-batch's
  progress (all batches are kept: ``spark.sql.streaming.numRecentProgressUpdates`` is raised and
  the batch ids are checked to be contiguous) and must equal ``--messages``. A small warm-up
  query on a separate stream runs first, so JVM and Python worker start-up are not measured;
  its (cold) time is printed too, and so is the SparkSession start-up, neither in the rate.
* ``baseline``: the raw NATS pull loop of ``bench/raw_pull.py`` (``raw_drain``) draining the
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
import os
import platform
import resource
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

from common import (
    GROUP,
    STREAM,
    SUBJECTS,
    WARMUP_GROUP,
    WARMUP_STREAM,
    Row,
    SparkRun,
    create_stream,
    descendants,
    jvm_pid,
    messages,
    peak_rss_kb,
    publish,
    run_spark,
    server_version,
    start_spark,
    warmup_messages,
)
from raw_pull import PARALLEL, run_baseline_parallel, run_baseline_sequential

from spark_jetstream.client.connection import ConnectionOptions, close_all, connect
from spark_jetstream.tools.embedded import EmbeddedServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DURATIONS = ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")
SHOWN_BATCHES = 12


# -- processes ---------------------------------------------------------------------------------


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
