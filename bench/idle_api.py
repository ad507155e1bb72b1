"""What an idle streaming query costs the server: JetStream API requests a second while caught up (the server's own
count, ``/jsz`` ``api.total``; it counts neither ``STREAM.MSG.GET`` nor ``CONSUMER.RESET``), and how soon one message
published after the idle spell is in a batch. Each read mode, with and without a group, on a server of its own.

    python bench/idle_api.py [--idle-seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request

from pyspark.sql import SparkSession

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer

MODES = {
    "without a group, Direct Get": {},
    "without a group, pull": {"readMode": "pull"},
    "with a group, Direct Get": {"group": "g"},
    "with a group, pull": {"group": "g", "readMode": "pull"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(f"{'read':<30} {'API requests/s idle':>20} {'a message after idle, in a batch after':>40}")
    for mode, extra in MODES.items():
        with EmbeddedServer(name="idle-api") as server:
            options = ConnectionOptions(servers=(server.url,))
            api = JetStreamApi(connect(options))
            api.create_stream({**partitioned_stream_config("IDLE", "idle.*", 4), "allow_direct": True})
            publish_all(api.conn, ((f"idle.k{i % 64}", b"x" * 100, None) for i in range(2000)))

            def api_total(server: EmbeddedServer = server) -> int:
                with urllib.request.urlopen(f"{server.monitor}/jsz") as answer:
                    return int(json.load(answer)["api"]["total"])

            checkpoint = tempfile.mkdtemp(prefix="idle-api-")
            reader = spark.readStream.format("jetstream").options(servers=server.url, stream="IDLE", **extra)
            query = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
            query.processAllAvailable()
            time.sleep(5)  # past the query's switch to waiting
            before, started = api_total(), time.monotonic()
            time.sleep(args.idle_seconds)
            rate = (api_total() - before - 1) / (time.monotonic() - started)
            batches = len(query.recentProgress)
            published = time.monotonic()
            publish_all(api.conn, [("idle.k1", b"late", None)])
            while not any(p["numInputRows"] == 1 for p in query.recentProgress[batches - 1 :]):
                time.sleep(0.005)
            took = time.monotonic() - published
            query.stop()
            disconnect(options)
        print(f"{mode:<30} {rate:>20.2f} {took:>38.2f} s")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
