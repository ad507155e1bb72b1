"""``slow-server``: a live but slow server under a streaming read and a streaming write; neither query may fail.

A server of its own (one node: no replica to go to) holds a 4-partition stream with a backlog of ``BACKLOG``
messages, fed at ``RATE`` msg/s throughout by a publisher that records what was stored. Two queries of the scenario's
session run on it: a read through a group (Direct Get, ``maxMessagesPerTrigger`` ``MAX_PER_TRIGGER``) into parquet,
and a groupless read of the same stream written back into a second stream with the connector's sink (msg ids). After
``SETTLE`` s the server is capped at ``CPUS`` of a core (``EmbeddedServer.starve``: a cgroup v1 CPU quota) for
``STARVED`` s, then given its CPU back. It answers the connection's pings all along, each request seconds late.

Printed per query: the batches committed while the server was starved, the longest time without a commit, and
whether the query failed; then, once the publisher stopped and both queries caught up, whether the parquet output
holds every stored message once and the second stream every payload the writing query committed, once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from common import heading
from suite import Suite, Summary, start_session

from scenarios.leader_change import cause, not_exactly_once, planned_end
from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer, Publisher, commits, longest_commit_gap

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

STREAM, TARGET = "SLOW", "SLOWOUT"
PARTITIONS = 4
BACKLOG = 200_000
RATE = 200
MAX_PER_TRIGGER = 5_000
CPUS = 0.1
SETTLE = 15.0
STARVED = 60.0
DRAIN = 300.0
"""Seconds the queries get to catch up once the publisher stopped (a bound, not a measurement)."""


def start_read(spark: SparkSession, url: str, work: Path) -> StreamingQuery:
    rows = spark.readStream.format("jetstream").options(
        servers=url, stream=STREAM, group="g", maxMessagesPerTrigger=MAX_PER_TRIGGER
    )
    sink = rows.load().select("seq", "data").writeStream.format("parquet").option("path", str(work / "out"))
    return sink.option("checkpointLocation", str(work / "cp-read")).trigger(processingTime="1 second").start()


def start_write(spark: SparkSession, url: str, work: Path) -> StreamingQuery:
    rows = spark.readStream.format("jetstream").options(servers=url, stream=STREAM, maxMessagesPerTrigger=2_000)
    sink = rows.load().select("data").writeStream.format("jetstream")
    sink = sink.options(servers=url, subject=f"{TARGET.lower()}.rows", checkpointLocation=str(work / "cp-write"))
    return sink.trigger(processingTime="1 second").start()


def run(suite: Suite) -> None:
    heading(
        f"slow-server: one server capped at {CPUS:g} of a core for {STARVED:g} s under a streaming read (group, "
        f"Direct Get) and a streaming write; {BACKLOG:,} messages waiting, {RATE} msg/s published"
    )
    work = Path(suite.work, "slow-server")
    server = EmbeddedServer(name="slow").start()
    options = ConnectionOptions(servers=(server.url,))
    publisher: Publisher | None = None
    spark = start_session(suite, "slow-server")
    queries: dict[str, StreamingQuery] = {}
    try:
        api = JetStreamApi(connect(options))
        api.create_stream(partitioned_stream_config(STREAM, "slow.*", PARTITIONS, storage="file"))
        api.create_stream({"name": TARGET, "subjects": [f"{TARGET.lower()}.>"], "storage": "file"})
        publish_all(api.conn, ((f"slow.b{i % 1024}", b"%d" % i, None) for i in range(BACKLOG)))
        publisher = Publisher([server.url], RATE, prefix="slow", record=True).start()
        queries = {"read": start_read(spark, server.url, work), "write": start_write(spark, server.url, work)}
        time.sleep(SETTLE)
        began = time.time()
        server.starve(CPUS)
        try:
            time.sleep(STARVED)
        finally:
            server.starve(None)
        ended = time.time()
        publisher.stop()
        last = api.stream_info(STREAM)["state"]["last_seq"]
        deadline = time.monotonic() + DRAIN
        while time.monotonic() < deadline and not all(
            q.exception() is not None or (commits(work / f"cp-{n}") or [(0, 0)])[-1][1] >= last
            for n, q in queries.items()
        ):
            time.sleep(1)
        failures = {name: cause(str(q.exception())) for name, q in queries.items() if q.exception() is not None}
        for query in queries.values():
            query.stop()
        rows = [(n, commits(work / f"cp-{n}")) for n in queries]
        for name, done in rows:
            during = sum(began <= t <= ended for t, _ in done)
            gap = longest_commit_gap([t for t, _ in done], began, ended)
            print(
                f"  {name}: {during} batches committed while starved, longest time without a commit {gap:.1f} s, "
                f"failed: {failures.get(name, 'no')}"
            )
        published = publisher.messages or {}
        out = spark.read.parquet(str(work / "out")).select("seq").collect()
        seqs = sorted(row.seq for row in out)
        read_exact = seqs == list(range(1, last + 1)) and set(published) <= set(seqs)
        committed = commits(work / "cp-write")[-1][1]
        wrong = not_exactly_once(spark, server.url, STREAM, TARGET, 1, committed, planned_end(work / "cp-write"))
        print(f"  read: {len(seqs):,} rows of {last:,} stored, {'each once' if read_exact else 'NOT EXACT'}")
        print(f"  write: {wrong or f'each of the {committed:,} messages it committed once in {TARGET}'}")
        held = not failures and read_exact and not wrong
        suite.summary.append(
            Summary(
                f"slow server: {CPUS:g} core for {STARVED:g} s, queries failed (read, write)",
                float(len(failures)),
                0.0,
                "failed",
                "0, rows exact",
                held,
            )
        )
    finally:
        for query in queries.values():
            query.stop()
        if publisher is not None:
            publisher.stop()
        spark.stop()
        disconnect(options)
        server.close()
