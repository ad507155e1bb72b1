"""Benchmark: the Spark writer against raw pipelined publishing, on the same server in the same run.

One run starts a real nats-server (``EmbeddedServer``, file store in a temp dir) and a ``local[2]``
SparkSession, then stores ``--messages`` messages of ``--size`` bytes on 1,024 subjects
``bench.k<i % 1024>`` several times, each time into a freshly created stream ``WBENCH``:

* ``raw``: a minimal raw-protocol publisher on a blocking socket (no nats-py): ``PUB`` commands
  written in chunks, up to ``--window`` messages ahead of their PubAcks, every PubAck read and
  checked. ``raw+ids`` does the same with a ``Nats-Msg-Id`` header per message (what exactly-once
  costs the server: it keeps every id of the duplicate window), shaped like the Spark writer's
  (``<32 hex digits>:<partition>:<row>``, see ``writer_ids``) so both store the same bytes.
* ``publish_all``: ``spark_jetstream.client.publish.publish_all`` (nats-py connection, one process).
* ``spark``: ``spark.range(n)`` with a ``--size``-byte string ``data`` column written by
  ``df.write.format("jetstream")`` (2 tasks), msg ids on (the default); ``spark-noids`` with
  ``deduplicate=false``. Timed from ``save()`` to its return; an untimed write of a fifth of
  ``--messages`` first warms up the Python workers and the JVM's JIT (a 20,000-row warm-up left
  the first measured write up to 40% slower than the next, hot-spot compilation included).

Every contender must leave exactly ``--messages`` messages in the stream. It prints msgs/s per
contender and the ratios of the Spark writer to the raw publisher doing the same server work
(``spark`` / ``raw+ids``, ``spark-noids`` / ``raw``).

Run it from the repository root::

    python bench/write.py --messages 1000000
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from common import SUBJECTS, RawSocket, server_version

from spark_jetstream.client.connection import Connection, ConnectionOptions, close_all, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.tools.embedded import EmbeddedServer

STREAM = "WBENCH"
TARGET_RATIO = 0.7


@dataclass(frozen=True)
class Run:
    contender: str
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def fresh_stream(api: JetStreamApi, storage: str) -> None:
    if STREAM in api.stream_names():
        api.delete_stream(STREAM)
    api.create_stream({"name": STREAM, "subjects": ["bench.>"], "storage": storage})


def warmup_rows(messages: int) -> int:
    """Rows of the untimed warm-up write (see the module doc)."""
    return max(20_000, messages // 5)


def writer_ids() -> str:
    """A msg id prefix as long as the Spark writer's for a batch write (``<save id>:<partition>:``)."""
    return f"{uuid.uuid4().hex}:0:"


def raw_publish(address: tuple[str, int], count: int, size: int, window: int, ids: str | None) -> int:
    """Publish ``count`` messages pipelined on a raw socket (msg ids ``<ids><i>`` unless ``ids`` is None).

    Returns the PubAcks that said stored."""
    raw = RawSocket(address)
    try:
        raw.handshake()
        sock, buf = raw.sock, raw.buf
        inbox = b"_INBOX.wbench"
        sock.sendall(b"SUB " + inbox + b".* 1\r\n")
        payload = os.urandom(size)
        subjects = [f"bench.k{k}".encode() for k in range(SUBJECTS)]
        chunk = max(1, window // 2)
        sent = acked = 0
        while acked < count:
            if sent < count and sent - acked <= window - chunk:
                commands = []
                for i in range(sent, min(count, sent + chunk)):
                    reply = b"%s.%d" % (inbox, i)
                    if ids is None:
                        commands.append(b"PUB %s %s %d\r\n%s\r\n" % (subjects[i % SUBJECTS], reply, size, payload))
                    else:
                        header = b"NATS/1.0\r\nNats-Msg-Id: %s%d\r\n\r\n" % (ids.encode(), i)
                        total = len(header) + size
                        commands.append(
                            b"HPUB %s %s %d %d\r\n%s%s\r\n"
                            % (subjects[i % SUBJECTS], reply, len(header), total, header, payload)
                        )
                sock.sendall(b"".join(commands))
                sent += len(commands)
                continue
            pos = raw.pos
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                raw.fill()
                continue
            if buf.startswith(b"MSG ", pos) or buf.startswith(b"HMSG ", pos):
                parts = buf[pos:eol].split()
                start = eol + 2
                end = start + int(parts[-1])
                if len(buf) < end + 2:
                    raw.fill()
                    continue
                raw.pos = end + 2
                if parts[0] == b"HMSG" or b'"error"' in buf[start:end]:
                    raise RuntimeError(f"publish failed: {bytes(buf[start:end])[:200]!r}")
                acked += 1
            elif buf.startswith(b"PING", pos):
                raw.pos = eol + 2
                sock.sendall(b"PONG\r\n")
            elif buf.startswith(b"-ERR", pos):
                raise ConnectionError(bytes(buf[pos:eol]).decode(errors="replace"))
            else:
                raw.pos = eol + 2
        return acked
    finally:
        raw.close()


def timed(conn: Connection, api: JetStreamApi, storage: str, name: str, expected: int, work: Callable[[], None]) -> Run:
    fresh_stream(api, storage)
    began = time.perf_counter()
    work()
    seconds = time.perf_counter() - began
    stored = api.stream_info(STREAM)["state"]["messages"]
    if stored != expected:
        raise SystemExit(f"FAILED: {name} left {stored:,} messages in the stream, expected {expected:,}")
    return Run(name, expected, seconds)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=4000, help="messages ahead of their PubAcks (all contenders)")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions (tasks) of the write")
    parser.add_argument("--storage", choices=("file", "memory"), default="file")
    parser.add_argument("--repeat", type=int, default=1, help="measure every contender this many times")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    store = tempfile.mkdtemp(prefix="wbench-")
    server = EmbeddedServer(name="wbench", store_dir=store).start()
    spark = None
    try:
        conn = connect(ConnectionOptions(servers=(server.url,)))
        api = JetStreamApi(conn)
        address = ("127.0.0.1", server.port)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("spark-jetstream-write-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        # Starting nats-server from a helper thread resets py4j's connection of this thread (see
        # tests/test_sink.py): give its new JVM thread the active session back.
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)

        def frame(n: int):
            return spark.range(0, n, 1, args.partitions).select(
                F.concat(F.lit("bench.k"), (F.col("id") % SUBJECTS).cast("string")).alias("subject"),
                F.lpad(F.col("id").cast("string"), args.size, "x").alias("data"),
            )

        def spark_write(n: int, **options: str) -> Callable[[], None]:
            def work() -> None:
                (
                    frame(n)
                    .write.format("jetstream")
                    .option("servers", server.url)
                    .option("publishWindow", str(args.window))
                    .options(**options)
                    .mode("append")
                    .save()
                )

            return work

        warm = warmup_rows(args.messages)
        print(f"warm-up: {timed(conn, api, args.storage, 'warm-up', warm, spark_write(warm)).seconds:.2f}s")
        n, size, window = args.messages, args.size, args.window
        payload = os.urandom(size)
        runs: list[Run] = []
        for _ in range(args.repeat):
            contenders: list[tuple[str, Callable[[], None]]] = [
                ("raw", lambda: raw_publish(address, n, size, window, None)),
                ("raw+ids", lambda: raw_publish(address, n, size, window, writer_ids())),
                (
                    "publish_all",
                    lambda: publish_all(conn, ((f"bench.k{i % SUBJECTS}", payload, None) for i in range(n)), window),
                ),
                ("spark", spark_write(n)),
                ("spark-noids", spark_write(n, deduplicate="false")),
            ]
            for name, work in contenders:
                runs.append(timed(conn, api, args.storage, name, n, work))
                print(f"  {name:<12} {runs[-1].seconds:7.2f}s {runs[-1].rate:>10,.0f} msgs/s", flush=True)

        best = {
            name: max(r.rate for r in runs if r.contender == name) for name in dict.fromkeys(r.contender for r in runs)
        }
        print()
        print(
            f"{n:,} messages x {size} bytes, {args.storage} storage, window {window}, {args.partitions} Spark tasks; "
            f"nats-server {server_version(address)}, Python {platform.python_version()}, {os.cpu_count()} cores"
        )
        print(f"| contender | msgs/s (best of {args.repeat}) |")
        print("|---|---:|")
        for name, rate in best.items():
            print(f"| {name} | {rate:,.0f} |")
        exactly_once = best["spark"] / best["raw+ids"]
        plain = best["spark-noids"] / best["raw"]
        print()
        print(f"spark / raw+ids (exactly-once, same server work): {exactly_once:.2f}")
        print(f"spark-noids / raw (no msg ids):                   {plain:.2f}")
        print(f"spark / raw (exactly-once vs the plainest publish): {best['spark'] / best['raw']:.2f}")
        met = exactly_once >= TARGET_RATIO and plain >= TARGET_RATIO
        print(f"target >= {TARGET_RATIO}x: {'met' if met else 'NOT met'}")
        return 0
    finally:
        if spark is not None:
            spark.stop()
        close_all()
        server.close()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
