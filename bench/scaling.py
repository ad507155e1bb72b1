"""Benchmark: end-to-end Spark read throughput with 1, 2, 4 and 8 members of one group.

One run starts a real nats-server (``EmbeddedServer``, file store in a temp dir), publishes
``--messages`` messages of ``--size`` bytes to 1,024 interleaved subjects ``ev.k<i % 1024>`` of a
stream partitioned ``--partitions`` ways (8 by default; the set-up of ``bench/common.py``),
creates one ``local[2]`` SparkSession, warms it up with a small query on a separate stream, and
then reads the whole stream once per member count with
``spark.readStream.format("jetstream").option("members", M)`` into the ``noop`` sink with
``trigger(availableNow=True)``. Each run uses a group of its own (``scale1``, ``scale2``, ...;
``scale4r2`` on the second round of ``--repeat``), so each one starts at the beginning of the
stream with new member consumers; the members 0..M-1 share the partitions in pcgroups' balanced
mapping and every member with data is one Spark task. Rows are counted from the queries' progress
(``bench/common.py``'s ``run_spark``) and must equal ``--messages``; runs are timed from
``start()`` to the return of ``awaitTermination()``.

It prints, per member count, the seconds, rows/s and speed-up against 1 member (best run of
each with ``--repeat``), with the micro-batches, the part of the wall time spent in
``addBatch`` (reading, in the Spark tasks), the CPU this benchmark's processes used (this
process, the nats-server, the Spark JVM and its Python workers; 100% = one core) and the CPU
other processes used on the machine meanwhile (in % of all cores, from ``/proc/stat``): a run
with other CPU above a few % overlapped with something else and its rate is low. On a shared
machine, each run first waits (up to ``--wait`` seconds) until other processes use less than
``--max-other-cpu`` of the cores, and a run during which they used more is run again, up to
``--attempts`` runs; the best rate among the runs below the threshold counts (a ``*`` marks a
member count that has none).

For reference, after ``spark.stop()`` it also drains the member consumers of the last runs with
1 and with the most members with the raw-protocol pull loop of ``bench/raw_pull.py`` (reset
to seq 1 first, not timed): in 2 processes, as ``local[2]`` runs 2 tasks at once, and in one.

Run it from the repository root::

    python bench/scaling.py --messages 1000000
    python bench/scaling.py --messages 1000000 --storage memory
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import (
    STREAM,
    SUBJECTS,
    WARMUP_GROUP,
    WARMUP_STREAM,
    Cpu,
    CpuWatch,
    Row,
    SparkRun,
    create_stream,
    messages,
    publish,
    run_spark,
    server_version,
    start_spark,
    warmup_messages,
)
from raw_pull import PARALLEL, run_baseline_parallel, run_baseline_sequential

from spark_jetstream.client.connection import ConnectionOptions, close_all, connect
from spark_jetstream.groups.layout import balanced_mapping
from spark_jetstream.tools.embedded import EmbeddedServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GROUP_PREFIX = "scale"
MAX_OTHER_CPU = 0.1
"""``--max-other-cpu`` by default: runs during which other processes used more of the cores do not count."""


@dataclass(frozen=True)
class Measured:
    members: int
    group: str
    run: SparkRun
    cpu: Cpu
    max_other_cpu: float
    """Other processes' share of the cores above which this run does not count (``clean``)."""

    @property
    def rate(self) -> float:
        return self.run.messages / self.run.seconds if self.run.seconds else 0.0

    @property
    def clean(self) -> bool:
        return self.cpu.other_share < self.max_other_cpu

    @property
    def add_batch_share(self) -> float:
        add_batch = sum(p["durationMs"].get("addBatch", 0) for p in self.run.progress)
        return add_batch / (self.run.seconds * 1000) if self.run.seconds else 0.0


def group_name(members: int, round_: int, attempt: int) -> str:
    return f"{GROUP_PREFIX}{members}" + (f"r{round_}" if round_ > 1 else "") + (f"a{attempt}" if attempt > 1 else "")


def wait_quiet(limit: float, timeout: float) -> None:
    """Wait until other processes use less than ``limit`` of the cores over 2 s, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        watch = CpuWatch()
        time.sleep(2)
        other = watch.stop().other_share
        if other < limit:
            return
        if time.monotonic() > deadline:
            print(f"  (still {other:.0%} other CPU after waiting {timeout:.0f} s: measuring anyway)", flush=True)
            return


def mapping_text(members: int, partitions: int) -> str:
    mapping = balanced_mapping([str(m) for m in range(members)], partitions)
    return " ".join(f"{m}:{','.join(map(str, mapping[str(m)]))}" for m in range(members))


def measure(
    spark: SparkSession, url: str, members: int, group: str, checkpoints: str, expected: int, max_other_cpu: float
) -> Measured:
    watch = CpuWatch()
    run = run_spark(
        spark, url, STREAM, group, os.path.join(checkpoints, group), None, options={"members": str(members)}
    )
    if run.messages != expected:
        raise SystemExit(f"FAILED: the Spark query with {members} members read {run.messages:,} of {expected:,}")
    return Measured(members, group, run, watch.stop(), max_other_cpu)


def print_spark_table(best: dict[int, Measured], runs: list[Measured], max_other_cpu: float) -> None:
    base = best[min(best)].rate
    print(f"(other CPU at or above {max_other_cpu:.0%}: the run does not count; * = no run below it)")
    print(
        f"{'members':>7} {'seconds':>8} {'rows/s':>10} {'speed-up':>8} {'batches':>7} {'addBatch':>8} "
        f"{'own CPU':>7} {'other CPU':>9}  all runs rows/s (other CPU)"
    )
    for members in sorted(best):
        m = best[members]
        all_rates = ", ".join(f"{r.rate:,.0f} ({r.cpu.other_share:.0%})" for r in runs if r.members == members)
        print(
            f"{members:>7} {m.run.seconds:>8.2f} {m.rate:>10,.0f}{' ' if m.clean else '*'}{m.rate / base:>7.2f}x "
            f"{m.run.batches:>7} {m.add_batch_share:>8.0%} {m.cpu.own_cores:>7.0%} {m.cpu.other_share:>9.0%}  "
            f"{all_rates}"
        )


def print_baseline_table(rows: list[tuple[Row, Cpu]]) -> None:
    print(f"{'raw pull baseline':<44} {'messages':>11} {'seconds':>8} {'rows/s':>10} {'own CPU':>7} {'other CPU':>9}")
    for row, cpu in rows:
        print(
            f"{row.contender:<44} {row.messages:>11,} {row.seconds:>8.2f} {row.rate:>10,.0f} "
            f"{cpu.own_cores:>7.0%} {cpu.other_share:>9.0%}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to publish and read")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the stream")
    parser.add_argument(
        "--members",
        default="1,2,4,8",
        help="comma-separated member counts, each at most --partitions (default: 1,2,4,8)",
    )
    parser.add_argument("--size", type=int, default=100, help="payload bytes per message")
    parser.add_argument(
        "--storage",
        choices=("file", "memory"),
        default="file",
        help="stream storage; memory takes the server's file-store read cost out",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the member counts; the best run counts")
    parser.add_argument("--warmup-messages", type=int, default=10_000, help="messages of the warm-up query")
    parser.add_argument("--no-baseline", action="store_true", help="skip the raw pull baseline")
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=MAX_OTHER_CPU,
        help=f"share of all cores other processes may use during a run for it to count (default {MAX_OTHER_CPU:g})",
    )
    parser.add_argument("--wait", type=float, default=300, help="seconds to wait for a quiet machine before a run")
    parser.add_argument("--attempts", type=int, default=3, help="runs of a measurement overlapped by others at most")
    args = parser.parse_args(argv)
    if min(args.messages, args.partitions, args.repeat, args.warmup_messages, args.attempts) < 1 or args.size < 0:
        parser.error("--messages, --partitions, --repeat and --warmup-messages must be positive, --size not negative")
    try:
        args.members = sorted({int(m) for m in args.members.split(",") if m.strip()})
    except ValueError:
        parser.error("--members must be comma-separated integers")
    if not args.members or not all(1 <= m <= args.partitions for m in args.members):
        parser.error(f"--members must be between 1 and --partitions ({args.partitions})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoints = tempfile.mkdtemp(prefix="scaling-")
    spark: SparkSession | None = None
    runs: list[Measured] = []
    baseline: list[tuple[Row, Cpu]] = []
    try:
        with EmbeddedServer(name="bench") as server:
            address = ("127.0.0.1", server.port)
            conn = connect(ConnectionOptions(servers=(server.url,)))
            try:
                import pyspark

                import spark_jetstream

                print(
                    f"nats-server {server_version(address)}, PySpark {pyspark.__version__}, "
                    f"{os.cpu_count()} cores, Python {platform.python_version()}, "
                    f"spark_jetstream from {os.path.dirname(spark_jetstream.__file__)}"
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
                for members in args.members:
                    print(f"  {members} members, member:partitions {mapping_text(members, args.partitions)}")

                spark, startup = start_spark()
                warm = run_spark(
                    spark, server.url, WARMUP_STREAM, WARMUP_GROUP, os.path.join(checkpoints, "warmup"), None
                )
                if warm.messages != args.warmup_messages:
                    raise SystemExit(f"FAILED: the warm-up query read {warm.messages:,} of {args.warmup_messages:,}")
                print(
                    f"SparkSession start-up {startup:.2f} s, warm-up query ({warm.messages:,} rows, cold) "
                    f"{warm.seconds:.2f} s: neither in any rate"
                )

                last_group: dict[int, str] = {}
                for round_ in range(1, args.repeat + 1):
                    for members in args.members:
                        for attempt in range(1, args.attempts + 1):
                            wait_quiet(args.max_other_cpu, args.wait)
                            group = last_group[members] = group_name(members, round_, attempt)
                            measured = measure(
                                spark, server.url, members, group, checkpoints, args.messages, args.max_other_cpu
                            )
                            runs.append(measured)
                            print(
                                f"  round {round_}, {members} members ({measured.group}): "
                                f"{measured.run.seconds:.2f} s, {measured.rate:,.0f} rows/s, "
                                f"{measured.run.batches} batches, own CPU {measured.cpu.own_cores:.0%}, "
                                f"other CPU {measured.cpu.other_share:.0%}",
                                flush=True,
                            )
                            if measured.clean:
                                break
                spark.stop()  # the baseline runs without Spark's threads around
                spark = None

                if not args.no_baseline:
                    most, fewest = max(args.members), min(args.members)
                    for members in dict.fromkeys((most, fewest)):
                        group = last_group[members]
                        consumers = [f"{group}-{m}" for m in range(members)]
                        what = f"{members} consumer{'s' if members > 1 else ''} of {group}"
                        contenders: list[tuple[str, Callable[[], tuple[float, int]]]] = []
                        if members > 1:
                            contenders.append(
                                (
                                    f"{what}, {min(PARALLEL, members)} processes",
                                    lambda c=consumers: run_baseline_parallel(conn, address, c, args.messages),
                                )
                            )
                        contenders.append(
                            (f"{what}, 1 process", lambda c=consumers: run_baseline_sequential(conn, address, c))
                        )
                        for name, contender in contenders:
                            for _ in range(args.attempts):
                                wait_quiet(args.max_other_cpu, args.wait)
                                watch = CpuWatch()  # includes the untimed process start and resets
                                seconds, count = contender()
                                cpu = watch.stop()
                                if count != args.messages:
                                    raise SystemExit(f"FAILED: the baseline {name} read {count:,} of {args.messages:,}")
                                baseline.append((Row(name, count, seconds), cpu))
                                print(
                                    f"  baseline {name}: {count / seconds:,.0f} rows/s, other CPU {cpu.other_share:.0%}"
                                )
                                if cpu.other_share < args.max_other_cpu:
                                    break
            finally:
                close_all()
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)

    best: dict[int, Measured] = {}
    for measured in runs:
        known = best.get(measured.members)
        if known is None or (measured.clean, measured.rate) > (known.clean, known.rate):
            best[measured.members] = measured
    print(
        f"\n{args.messages:,} msgs x {args.size} B, {args.partitions} partitions, {args.storage} storage, "
        f"local[2], availableNow into noop, best of {args.repeat} round(s)"
    )
    print_spark_table(best, runs, args.max_other_cpu)
    if baseline:
        print()
        print_baseline_table(baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
