"""``memory``: the executor Python worker's peak RSS with a 10x larger batch (see ``bench/run.py``)."""

from __future__ import annotations

import os

from common import SUBJECTS, Cpu, heading, mb, print_rows, publish, run_spark
from suite import SIZE, Measurement, Suite, Summary, start_session

MEMORY_TARGET = 1.2
"""Worker peak RSS at 10x the batch at most this many times the smaller batch's: bounded, not growing with it."""


def run(suite: Suite) -> None:
    args = suite.args
    n = args.messages
    small = max(1, n // 10)
    heading(f"memory: {n:,} x {SIZE} B on 1 partition, maxMessagesPerTrigger {small:,} vs {n:,}")
    suite.fresh_stream("MEM", "mem.*", 1)
    payload = os.urandom(SIZE)
    publish(suite.conn, "memory", ((f"mem.k{i % SUBJECTS}", payload, None) for i in range(n)), n)
    worker_peaks: dict[int, int] = {}
    growth: dict[int, int] = {}
    rows: list[tuple[str, int, float, int | None, Cpu | None]] = []
    for limit in (small, n):
        spark = start_session(suite, f"memory{limit}")  # fresh workers: no memory carried over
        try:
            label = f"memory: maxMessagesPerTrigger {limit:,}"
            watch = Measurement(suite, label, spark)
            run = run_spark(spark, suite.url, "MEM", f"mem{limit}", suite.checkpoint(f"mem{limit}"), limit)
            cpu = watch.stop()
        finally:
            spark.stop()
        if run.messages != n:
            raise SystemExit(f"FAILED: the memory read with batches of {limit:,} read {run.messages:,} of {n:,}")
        rows.append((f"maxMessagesPerTrigger {limit:,}", run.messages, run.seconds, run.batches, cpu))
        workers = suite.peaks[-1].kind("worker")
        worker_peaks[limit] = max(workers) if workers else 0
        growth[limit] = suite.peaks[-1].growth("worker") or 0
    print_rows(rows)
    for limit, kb in worker_peaks.items():
        print(
            f"  batches of {limit:>9,}: Python worker peak RSS {mb(kb)} MB, "
            f"{growth[limit] / 1024:+,.0f} MB over the warm worker's RSS at the start"
        )
    suite.summary.append(
        Summary(
            f"memory: worker peak RSS, batch {n:,} vs {small:,}",
            worker_peaks[n] * 1.0,
            worker_peaks[small] * 1.0,
            "MB",
            f"<= {MEMORY_TARGET:g}x",
            worker_peaks[n] <= MEMORY_TARGET * worker_peaks[small],
        )
    )
    suite.api.delete_stream("MEM")
