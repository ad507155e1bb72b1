"""Benchmark: a bounded batch read through consumers (a stream without Direct Get) against Direct Get, on one stream.

One run starts a real nats-server (file store in a temp dir), creates a stream as clients make it by default
(``{"name": ..., "subjects": [...]}``: no partition transform, ``allow_direct`` false), publishes ``--messages``
messages of ``--size`` bytes to 1,024 interleaved subjects, and reads the whole stream with
``spark.read.format("jetstream")`` into the ``noop`` sink in a warm ``local[2]`` session: with ``allow_direct`` off
(read through an ephemeral consumer per Spark partition) and on (Direct Get), each with the default plan (one
Spark partition: the stream has no partitions) and with ``minPartitions=2`` (both cores). Every read must count
exactly ``--messages`` rows; each case prints the best and the median of ``--runs`` runs and the load average.

Run it from the repository root::

    python bench/batch_read_paths.py --messages 400000 --size 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import SUBJECTS, heading, publish, start_spark

from spark_jetstream.client.connection import ConnectionOptions, close_all, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.tools.embedded import EmbeddedServer

STREAM = "PLAIN"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    with EmbeddedServer(name="bench") as server:
        conn = connect(ConnectionOptions(servers=(server.url,)))
        api = JetStreamApi(conn)
        api.create_stream({"name": STREAM, "subjects": ["ev.>"]})
        payload = os.urandom(args.size)
        batch = ((f"ev.k{i % SUBJECTS}", payload, None) for i in range(args.messages))
        seconds = publish(conn, "benchmark", batch, args.messages)
        print(f"published {args.messages:,} x {args.size} B in {seconds:.1f}s", flush=True)
        spark, _ = start_spark()

        def read(options: dict[str, str]) -> float:
            reader = spark.read.format("jetstream").option("servers", server.url).option("stream", STREAM)
            df = reader.options(**options).load()
            began = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            took = time.perf_counter() - began
            counted = reader.options(**options).load().count()
            if counted != args.messages:
                raise SystemExit(f"FAILED: read {counted:,} of {args.messages:,} messages with {options}")
            return took

        def allow_direct(on: bool) -> None:
            config = {**api.stream_info(STREAM)["config"], "allow_direct": on}
            api.call(("STREAM", "UPDATE", STREAM), config, "Updating the stream")

        read({})  # warm-up: the Python workers start, nothing is measured
        cases = [
            ("consumers (allow_direct off)", False, {}),
            ("consumers, minPartitions=2", False, {"minPartitions": "2"}),
            ("Direct Get (allow_direct on)", True, {}),
            ("Direct Get, minPartitions=2", True, {"minPartitions": "2"}),
        ]
        heading(f"batch read of {args.messages:,} x {args.size} B, no partition transform, local[2], into noop")
        print(f"  {'path':<34} {'best rows/s':>12} {'median rows/s':>14} {'load avg (1 min)':>17}")
        for label, direct, options in cases:
            allow_direct(direct)
            times = [read(options) for _ in range(args.runs)]
            load = os.getloadavg()[0]
            best, median = args.messages / min(times), args.messages / statistics.median(times)
            print(f"  {label:<34} {best:>12,.0f} {median:>14,.0f} {load:>17.2f}", flush=True)
        leftover = api.consumer_names(STREAM)
        print(f"consumers left on the stream: {leftover or 'none'}")
        spark.stop()
        close_all()


if __name__ == "__main__":
    main()
