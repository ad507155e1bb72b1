"""What a streaming query asks of the JetStream API: requests a second while caught up, and requests per micro-batch
while messages arrive at a steady rate, counted by kind, for each read mode with and without a group; and how soon one
message published after the idle spell is in a batch. Every request is counted as the server receives it (a
subscriber on ``$JS.API.>`` in the query's account: ``STREAM.MSG.GET``, ``CONSUMER.RESET``, ``DIRECT.GET`` and the pulls
(``CONSUMER.MSG.NEXT``) included, which the server's own ``/jsz`` ``api.total`` leaves out). Each mode has a server
of its own.

    python bench/api_load.py [--idle-seconds 30] [--busy-seconds 30] [--rate 100]

Run it against another tree (``PYTHONPATH=<checkout>``) for a before/after on the same machine.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import threading
import time

import nats
from nats.aio.msg import Msg
from pyspark.sql import SparkSession

from spark_jetstream.client.connection import Connection, ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config

try:
    from spark_jetstream.testing import EmbeddedServer
except ImportError:  # a tree from before the harness had its own package, for a before/after
    from spark_jetstream.tools.embedded import EmbeddedServer  # type: ignore[no-redef]

MODES = {
    "without a group, Direct Get": {},
    "without a group, through consumers": {"readMode": "pull"},
    "with a group, Direct Get": {"group": "g"},
    "with a group, pull": {"group": "g", "readMode": "pull"},
}
KINDS = 6  # the kinds shown per mode, most frequent first


def kind_of(subject: str) -> str:
    """``$JS.API.CONSUMER.INFO.IDLE.g-0`` -> ``CONSUMER.INFO``; ``$JS.API.DIRECT.GET.IDLE`` -> ``DIRECT.GET``."""
    tokens = subject.split(".")[2:]
    if tokens[:2] in (["STREAM", "MSG"], ["CONSUMER", "MSG"]):
        return ".".join(tokens[:3])
    return ".".join(tokens[:2]) if tokens[0] in ("STREAM", "CONSUMER", "DIRECT") else tokens[0]


class Counter:
    """Counts the JetStream API requests of the account by kind, from a client of its own on ``conn``'s loop."""

    def __init__(self, conn: Connection, url: str) -> None:
        self.conn = conn
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

        async def count(msg: Msg) -> None:
            with self.lock:
                self.counts[kind_of(msg.subject)] += 1

        async def subscribe() -> nats.NATS:
            client = await nats.connect(url)
            await client.subscribe("$JS.API.>", cb=count)
            await client.flush()
            return client

        self.client = conn.run(subscribe())

    def close(self) -> None:
        self.conn.run(self.client.close())

    def take(self) -> collections.Counter[str]:
        with self.lock:
            counts, self.counts = self.counts, collections.Counter()
        return counts


def shown(counts: collections.Counter[str], per: float) -> str:
    top = ", ".join(f"{kind} {n / per:.2f}" for kind, n in counts.most_common(KINDS))
    return f"{sum(counts.values()) / per:.2f} ({top})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--busy-seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="messages a second while busy")
    parser.add_argument("--mode", action="append", choices=list(MODES), help="only these read modes (default: all)")
    args = parser.parse_args()
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for mode, extra in MODES.items():
        if args.mode and mode not in args.mode:
            continue
        with EmbeddedServer(name="api-load") as server:
            options = ConnectionOptions(servers=(server.url,))
            api = JetStreamApi(connect(options))
            api.create_stream({**partitioned_stream_config("IDLE", "idle.*", 4), "allow_direct": True})
            publish_all(api.conn, ((f"idle.k{i % 64}", b"x" * 100, None) for i in range(2000)))
            counter = Counter(api.conn, server.url)
            checkpoint = tempfile.mkdtemp(prefix="api-load-")
            reader = spark.readStream.format("jetstream").options(servers=server.url, stream="IDLE", **extra)
            query = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
            query.processAllAvailable()
            time.sleep(5)  # past the query's switch to waiting
            counter.take()
            started = time.monotonic()
            time.sleep(args.idle_seconds)
            idle = counter.take()
            idle_for = time.monotonic() - started
            batches = len(query.recentProgress)
            published = time.monotonic()
            publish_all(api.conn, [("idle.k1", b"late", None)])
            while not any(p["numInputRows"] == 1 for p in query.recentProgress[batches - 1 :]):
                time.sleep(0.005)
            took = time.monotonic() - published
            time.sleep(3)
            counter.take()
            batch_ids = {p["batchId"] for p in query.recentProgress}
            begun, sent = time.monotonic(), 0
            while (now := time.monotonic()) < begun + args.busy_seconds:
                publish_all(api.conn, [(f"idle.k{sent % 64}", b"y" * 100, None)])
                sent += 1
                time.sleep(max(0.0, begun + sent / args.rate - now))
            time.sleep(2)
            busy = counter.take()
            planned = {p["batchId"] for p in query.recentProgress if p["numInputRows"]} - batch_ids
            query.stop()
            counter.close()
            disconnect(options)
        print(f"{mode}")
        print(f"  idle, requests/s:           {shown(idle, idle_for)}")
        print(f"  busy, requests per batch:   {shown(busy, max(1, len(planned)))} over {len(planned)} batches")
        print(f"  a message after idle, in a batch after {took:.2f} s")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
