"""``scaling``: the read with 1, 2, 4 and 8 members on 8 partitions, and the raw pull loop (``bench/scaling.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common import STREAM, heading, messages, print_rows, publish, rate
from raw_pull import PARALLEL, run_baseline_parallel
from scaling import MAX_OTHER_CPU, Measured, mapping_text, measure, print_spark_table
from suite import SIZE, Measurement, Suite, Summary, start_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCALING_PARTITIONS = 8
SCALING_MEMBERS = (1, 2, 4, 8)


def run(suite: Suite) -> None:
    args = suite.args
    heading(f"scaling: members {SCALING_MEMBERS} on {SCALING_PARTITIONS} partitions, {args.messages:,} x {SIZE} B")
    suite.fresh_stream(STREAM, "ev.*", SCALING_PARTITIONS)
    took = publish(suite.conn, "scaling", messages(args.messages, SIZE), args.messages)
    print(f"  published in {took:.1f} s", flush=True)
    for members in SCALING_MEMBERS:
        print(f"  {members} members, member:partitions {mapping_text(members, SCALING_PARTITIONS)}")
    spark: SparkSession | None = start_session(suite, "scaling")
    best: dict[int, Measured] = {}
    try:
        assert spark is not None
        for members in SCALING_MEMBERS:
            watch = Measurement(suite, f"scaling: {members} members", spark)
            group = f"scale{members}"
            best[members] = measure(
                spark, suite.url, members, group, suite.checkpoint("scaling"), args.messages, MAX_OTHER_CPU
            )
            watch.stop()
            print(f"  {members} members: {best[members].rate:,.0f} rows/s", flush=True)
        spark.stop()
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
    print_spark_table(best, list(best.values()), MAX_OTHER_CPU)
    print_rows([(f"raw pull loop, {most} consumers, {PARALLEL} processes", count, seconds, None, cpu)])
    fewest = min(SCALING_MEMBERS)
    suite.summary.append(
        Summary(f"scaling: {most} vs {fewest} member(s) (rows/s)", best[most].rate, best[fewest].rate, "rows/s")
    )
    suite.summary.append(
        Summary(f"scaling: {most} members vs raw pull (rows/s)", best[most].rate, rate(count, seconds), "rows/s")
    )
    suite.api.delete_stream(STREAM)
