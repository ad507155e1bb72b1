"""``kv``: a KV bucket read as a table and streamed as changes (see ``bench/run.py``).

* Table: a bucket of ``--messages`` keys (100 B values, one revision per key, Direct Get allowed, as ``nats kv add``
  makes it), ``spark.read.format("jetstream").option("bucket", ...)`` counted, against the raw Direct Get loop reading
  the bucket's stream (``>``) in one process, ``KV_ROUNDS`` rounds each, best kept; the Python workers' peak memory
  is in the run's peak table.
* Changes: ``--rate`` puts a second for ``--latency-seconds`` into a bucket streamed (default trigger) into
  ``foreachBatch``: p50/p99 seconds from put to row (the ``latency`` scenario's measure).
"""

from __future__ import annotations

import os
import time

from common import heading, rate
from raw_direct import run_direct_parallel
from suite import SIZE, Measurement, Suite, Summary, start_session

from scenarios.latency import measure_latency, print_latency
from spark_jetstream.client.publish import publish_all

BUCKET = "benchkv"
CHANGES = "benchkvchanges"
KV_ROUNDS = 2
TARGET = 0.8


def make_bucket(suite: Suite, bucket: str) -> str:
    stream = f"KV_{bucket}"
    if stream in suite.api.stream_names():
        suite.api.delete_stream(stream)
    suite.api.create_stream(
        {"name": stream, "subjects": [f"$KV.{bucket}.>"], "max_msgs_per_subject": 1, "allow_rollup_hdrs": True,
         "deny_delete": True, "discard": "new", "allow_direct": True, "storage": suite.args.storage}
    )  # fmt: skip
    return stream


def run(suite: Suite) -> None:
    args = suite.args
    count = args.messages
    heading(f"kv: a bucket of {count:,} keys x {SIZE} B as a table; {args.rate:,} puts/s streamed as changes")
    stream = make_bucket(suite, BUCKET)
    value = os.urandom(SIZE)
    stored = publish_all(suite.conn, ((f"$KV.{BUCKET}.k{i}", value, None) for i in range(count))).count
    if stored != count:
        raise SystemExit(f"FAILED: stored {stored:,} of {count:,} keys")
    spark = start_session(suite, "kv")
    best: dict[str, float] = {}
    try:
        reader = spark.read.format("jetstream").option("servers", suite.url).option("bucket", BUCKET)
        for round_ in range(1, KV_ROUNDS + 1):
            seconds, got, _ = run_direct_parallel(suite.address, stream, [">"])
            if got != count:
                raise SystemExit(f"FAILED: the raw Direct Get read {got:,} of {count:,}")
            best["raw Direct Get ('>', 1 process)"] = min(best.get("raw Direct Get ('>', 1 process)", seconds), seconds)
            watch = Measurement(suite, f"kv: table read, round {round_}", spark)
            began = time.perf_counter()
            got = reader.load().count()
            seconds = time.perf_counter() - began
            watch.stop()
            if got != count:
                raise SystemExit(f"FAILED: the table read gave {got:,} of {count:,} keys")
            best["table read"] = min(best.get("table read", seconds), seconds)
            print(f"  round {round_}: table read {rate(count, seconds):,.0f} rows/s", flush=True)
        make_bucket(suite, CHANGES)
        options = {"servers": suite.url, "bucket": CHANGES}
        prefix = f"$KV.{CHANGES}"
        columns = ("value", "created")
        # A key per put: no change is compacted away before the query reads it.
        changes = measure_latency(suite, spark, "bucket changes", "jetstream", options, CHANGES, prefix, columns, 10**9)
    finally:
        spark.stop()
        for name in (stream, f"KV_{CHANGES}"):
            if name in suite.api.stream_names():
                suite.api.delete_stream(name)
    for name, seconds in best.items():
        print(f"  {name}: {rate(count, seconds):,.0f} rows/s ({seconds:.2f} s)")
    print_latency([changes])
    raw, table = rate(count, best["raw Direct Get ('>', 1 process)"]), rate(count, best["table read"])
    suite.summary.append(
        Summary(f"kv: table read of {count:,} keys vs raw Direct Get (rows/s)", table, raw, "rows/s",
                f">= {TARGET:g}x", table / raw >= TARGET)
    )  # fmt: skip
    print(f"  changes: p50 {changes.percentile(0.5):.2f} s, p99 {changes.percentile(0.99):.2f} s from put to row")
