"""``scaling``: the read with 1, 2, 4 and 8 members of one group on an 8-partition stream, and the raw pull loop.

``--messages`` x 100 B on 1,024 interleaved subjects ``ev.k<i % 1024>``, read once per member count with
``spark.readStream.format("jetstream").option("members", M)`` into ``noop`` with ``trigger(availableNow=True)``.
Each run uses a group of its own (``scale1``, ``scale2``, ...), so it starts at the beginning of the stream with
new member consumers; the members 0..M-1 share the partitions in pcgroups' balanced mapping and every partition
with data is one Spark task. Rows are counted from the query's progress (``run_spark``) and must equal
``--messages``.

It prints, per member count, the seconds, rows/s and speed-up against 1 member, the micro-batches, the part of the
wall time spent in ``addBatch`` (reading, in the Spark tasks), the CPU this benchmark's processes used (100% = one
core) and the CPU other processes used meanwhile (in % of all cores): a run with other CPU above a few % overlapped
with something else and its rate is low. After ``spark.stop()`` the raw pull loop of ``bench/raw_pull.py`` drains
the 8 member consumers of the 8-member run in 2 processes (reset to seq 1 first, not timed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import STREAM, Cpu, SparkRun, heading, messages, print_rows, processes, publish, rate, run_spark
from raw_pull import run_baseline_parallel
from suite import SIZE, Measurement, Suite, Summary, start_session

from spark_jetstream.groups.layout import balanced_mapping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCALING_PARTITIONS = 8
SCALING_MEMBERS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Measured:
    members: int
    run: SparkRun
    cpu: Cpu

    @property
    def rate(self) -> float:
        return rate(self.run.messages, self.run.seconds)

    @property
    def add_batch_share(self) -> float:
        add_batch = sum(p["durationMs"].get("addBatch", 0) for p in self.run.progress)
        return add_batch / (self.run.seconds * 1000) if self.run.seconds else 0.0


def mapping_text(members: int, partitions: int) -> str:
    mapping = balanced_mapping([str(m) for m in range(members)], partitions)
    return " ".join(f"{m}:{','.join(map(str, mapping[str(m)]))}" for m in range(members))


def measure(suite: Suite, spark: SparkSession, members: int) -> Measured:
    """One read of the whole stream with ``members`` members, in a group of its own."""
    expected = suite.args.messages
    watch = Measurement(suite, f"scaling: {members} members", spark)
    group = f"scale{members}"
    run = run_spark(spark, suite.url, STREAM, group, suite.checkpoint(group), None, {"members": str(members)})
    cpu = watch.stop()
    if run.messages != expected:
        raise SystemExit(f"FAILED: the Spark query with {members} members read {run.messages:,} of {expected:,}")
    return Measured(members, run, cpu)


def print_spark_table(measured: dict[int, Measured]) -> None:
    base = measured[min(measured)].rate
    print(
        f"  {'members':>7} {'seconds':>8} {'rows/s':>10} {'speed-up':>8} {'batches':>7} {'addBatch':>8} "
        f"{'own CPU':>7} {'other CPU':>9}"
    )
    for members in sorted(measured):
        m = measured[members]
        print(
            f"  {members:>7} {m.run.seconds:>8.2f} {m.rate:>10,.0f} {m.rate / base:>7.2f}x {m.run.batches:>7} "
            f"{m.add_batch_share:>8.0%} {m.cpu.own_cores:>7.0%} {m.cpu.other_share:>9.0%}"
        )


def run(suite: Suite) -> None:
    args = suite.args
    heading(f"scaling: members {SCALING_MEMBERS} on {SCALING_PARTITIONS} partitions, {args.messages:,} x {SIZE} B")
    suite.fresh_stream(STREAM, "ev.*", SCALING_PARTITIONS)
    took = publish(suite.conn, "scaling", messages(args.messages, SIZE), args.messages)
    print(f"  published in {took:.1f} s", flush=True)
    for members in SCALING_MEMBERS:
        print(f"  {members} members, member:partitions {mapping_text(members, SCALING_PARTITIONS)}")
    spark: SparkSession | None = start_session(suite, "scaling")
    measured: dict[int, Measured] = {}
    try:
        assert spark is not None
        for members in SCALING_MEMBERS:
            measured[members] = measure(suite, spark, members)
            print(f"  {members} members: {measured[members].rate:,.0f} rows/s", flush=True)
        spark.stop()  # the raw loop runs without Spark's threads around
        spark = None
        most = max(SCALING_MEMBERS)
        consumers = [f"scale{most}-{m}" for m in range(most)]
        watch = Measurement(suite, "scaling: raw pull baseline", None)
        seconds, count = run_baseline_parallel(suite.conn, suite.address, consumers, args.messages)
        cpu = watch.stop()
        if count != args.messages:
            raise SystemExit(f"FAILED: the raw pull baseline read {count:,} of {args.messages:,}")
    finally:
        if spark is not None:
            spark.stop()
    print_spark_table(measured)
    print_rows([(f"raw pull loop, {most} consumers, {processes()} processes", count, seconds, None, cpu)])
    fewest = min(SCALING_MEMBERS)
    suite.summary.append(
        Summary(f"scaling: {most} vs {fewest} member(s) (rows/s)", measured[most].rate, measured[fewest].rate, "rows/s")
    )
    suite.summary.append(
        Summary(f"scaling: {most} members vs raw pull (rows/s)", measured[most].rate, rate(count, seconds), "rows/s")
    )
    suite.api.delete_stream(STREAM)
