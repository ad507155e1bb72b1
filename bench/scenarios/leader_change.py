"""``leader-change``: how long a streaming query stalls when a leader dies under load, and whether it fails.

A 3-node cluster of its own (``EmbeddedCluster``), a 4-partition R3 file stream, a publisher at ``RATE`` msg/s
(JetStream publishes with a ``Nats-Msg-Id``, retried through the faults, so nothing is lost), and a streaming
query (the scenario's ``local[2]`` session, 1 s trigger, ``maxMessagesPerTrigger=2000``, parquet sink). For each
fault, one after another (``--leader-rounds`` times), ``SETTLE`` s of steady state first and the victim restarted
on its store ``DOWN`` s later:

* ``none``: no fault, the baseline (a 1 s trigger commits new rows within about a trigger);
* ``stream leader``: SIGKILL of the stream's leader;
* ``stream leader, catching up``: the same while the query still reads a burst of ``BURST`` messages published
  ``CATCH_UP`` s before (at ``MAX_PER_TRIGGER`` a trigger it is about 14,000 behind when the leader dies: a pipeline
  started on a stream that holds 20,000 messages, as the issue's was);
* ``consumer leader``: SIGKILL of the leader of member consumer ``g-0`` (moved off the stream and
  meta leaders first, so the fault is the consumer's alone);
* ``meta leader``: SIGTERM of the JetStream meta leader;
* ``stream leader, frozen``, ``query connection, frozen``, ``task connections, frozen``: the stream's leader, the
  server of the streaming reader's connection, the server of most task connections, frozen with SIGSTOP for
  ``FROZEN`` s and then thawed (SIGCONT): no connection closes, nothing answers (a paused VM, a silent partition);
* ``stream leader, partitioned``, ``query connection, partitioned``: the same servers cut off from the cluster and
  from Spark for ``FROZEN`` s (each server runs in a network namespace of its own, ``EmbeddedCluster(isolated=True)``;
  its link goes down: packets dropped both ways, no reset), then healed. Needs root; without it these are left out.
* ``write target, frozen``: the leader of the stream a second streaming query writes into (``TARGET``: it reads the
  stream from its last seq, groupless, and writes each row's payload with the connector's sink), frozen for
  ``FROZEN`` s. Its *writable* is the target's new leader's election, its *new rows* the first commit of the writing
  query after that (a commit means its rows were stored), and the target must hold each row written exactly once.

Measured per fault, from the moment the signal is sent: when the lost leader's successor answered
(``elected``: the stream or consumer info names another leader, or a surviving server's ``/jsz``
names a new meta leader), when the stream took writes again (``writable``: the publisher's first PubAck
after its longest silence, ``cluster_faults.writable_again``), when the batch holding the first message
stored then was committed (``new rows``, from the checkpoint's commit files), and the figure the target is
about: that commit after the stream took writes again (``recovery``). Also the longest time without any
commit around the fault, and whether the query failed (it is then restarted on its checkpoint for the next
fault, and counted). The summary row is the worst recovery after a fault against the no-fault baseline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from common import heading
from suite import Suite, Summary, start_session

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import (
    EmbeddedCluster,
    Publisher,
    commits,
    inject_fault,
    longest_commit_gap,
    wait_healthy,
    writable_again,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

STREAM = "LEAD"
TARGET = "LEADOUT"
"""The stream ``write target, frozen``'s query writes into."""
GROUP = "g"
PARTITIONS = 4
MAX_PER_TRIGGER = 2000
RATE = 500
"""Messages per second published throughout."""
DOWN = 5.0
"""Seconds before the victim is restarted."""
SETTLE = 10.0
"""Seconds of steady state before each fault."""
NEW_ROWS_WAIT = 90.0
"""Seconds to wait for a batch with new rows after a fault before calling it stalled for good."""
BURST = 20_000
"""Messages published at once before ``stream leader, catching up``."""
CATCH_UP = 4.0
"""Seconds from the burst to ``stream leader, catching up``'s fault."""
FROZEN = 20.0
"""Seconds a frozen server stays frozen before it is thawed."""
FAULTS = (
    "none",
    "stream leader",
    "stream leader, catching up",
    "consumer leader",
    "meta leader",
    "stream leader, frozen",
    "query connection, frozen",
    "task connections, frozen",
    "stream leader, partitioned",
    "query connection, partitioned",
    "write target, frozen",
)
GOAL = 5.0
"""New rows committed within this many seconds of the stream taking writes again."""


@dataclass
class Result:
    fault: str
    victim: str
    led: str
    elected: float | None
    writable: float | None
    new_rows: float | None
    gap: float
    failed: str
    behind: int = 0
    """Messages stored but not yet committed by the query when the fault came."""

    @property
    def recovery(self) -> float | None:
        """From the stream taking writes again to the commit of the first message it then stored."""
        return None if self.new_rows is None or self.writable is None else self.new_rows - self.writable


def start_query(spark: SparkSession, servers: str, work: Path) -> StreamingQuery:
    source = spark.readStream.format("jetstream").options(
        servers=servers, stream=STREAM, group=GROUP, maxMessagesPerTrigger=MAX_PER_TRIGGER
    )
    return (
        source.load()
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "cp"))
        .trigger(processingTime="1 second")
        .start()
    )


def cause(text: str) -> str:
    """The connector's error in a failed query's exception (Spark wraps it in pages of stack trace)."""
    found = re.findall(r"spark_jetstream\.errors\.(\w+): ([^\n]+)", text) or re.findall(
        r"(\w+(?:Error|Exception)): ([^\n]+)", text
    )
    return f"{found[-1][0]}: {found[-1][1]}"[:200] if found else text.strip().splitlines()[0][:200]


def chosen(suite: Suite) -> list[str]:
    """The faults ``--leader-faults`` names (all by default), in ``FAULTS``' order."""
    wanted = suite.args.leader_faults
    return [f for f in FAULTS if not wanted or f in [w.strip() for w in wanted.split(";")]]


def measure(suite: Suite, rounds: int) -> tuple[list[Result], int, int]:
    """The faults ``rounds`` times on a cluster of their own; the results, query restarts and publish retries."""
    work = Path(suite.work, "leader-change")
    isolated = os.geteuid() == 0  # a partition needs network namespaces
    cluster = EmbeddedCluster(3, name="lead", isolated=isolated).start()
    servers = [s.url for s in cluster.servers]
    urls = ",".join(servers)
    options = ConnectionOptions(servers=tuple(servers))
    results: list[Result] = []
    restarts = 0
    publisher: Publisher | None = None
    spark: SparkSession | None = None
    try:
        api = JetStreamApi(connect(options))
        api.create_stream(partitioned_stream_config(STREAM, "lead.*", PARTITIONS, num_replicas=3, storage="file"))
        api.create_stream({"name": TARGET, "subjects": [f"{TARGET.lower()}.>"], "num_replicas": 3, "storage": "file"})
        publisher = Publisher(servers, RATE).start()
        spark = start_session(suite, "leader-change")
        query = start_query(spark, urls, work)
        checkpoint = work / "cp"
        consumers = [f"{GROUP}-{p}" for p in range(PARTITIONS)]
        while len(commits(checkpoint)) < 3:
            if query.exception() is not None:
                raise SystemExit(f"FAILED: the leader-change query failed at start: {query.exception()}")
            time.sleep(0.2)
        faults = [f for f in chosen(suite) if isolated or not f.endswith("partitioned")]
        for fault in [f for _ in range(rounds) for f in faults]:
            if not wait_healthy(api, STREAM, consumers):
                print("  warning: the cluster did not become healthy again")
            catching_up = fault.endswith("catching up")
            if catching_up:
                time.sleep(SETTLE)
                publish_all(api.conn, ((f"{STREAM.lower()}.b{i % 211}", b"x" * 100, None) for i in range(BURST)))
            if fault.startswith("write target"):
                results.append(write_target_fault(spark, api, cluster, urls, publisher, work, len(results)))
                print(f"  {fault}: {results[-1]}", flush=True)
                continue
            time.sleep(CATCH_UP if catching_up else SETTLE)
            behind = publisher.last_seq - (commits(checkpoint)[-1][1] if commits(checkpoint) else 0)
            kind, frozen, partitioned = fault.split(",")[0], fault.endswith("frozen"), fault.endswith("partitioned")
            injected = inject_fault(
                kind,
                api,
                cluster,
                STREAM,
                consumers,
                publisher,
                FROZEN if frozen or partitioned else DOWN,
                NEW_ROWS_WAIT,
                signal.SIGSTOP if frozen else None,
                partitioned,
            )
            at = injected.at
            new_rows, writable, failed = None, None, "no"
            deadline = at + NEW_ROWS_WAIT
            while time.time() < deadline:
                if query.exception() is not None or not query.isActive:
                    failed = cause(str(query.exception() or "stopped"))
                    restarts += 1
                    query = start_query(spark, urls, work)
                again = writable_again(publisher, injected)
                newer = [t for t, seq in commits(checkpoint) if again and t > at and seq >= again[1]]
                if again and newer and time.time() > again[0] + 1.0:  # a longer stall would have shown by now
                    writable, new_rows = again[0] - at, newer[0] - at
                    break
                time.sleep(0.1)
            if injected.watcher is not None:
                injected.watcher.join(NEW_ROWS_WAIT)
            gap = longest_commit_gap([t for t, _ in commits(checkpoint)], at, at + (new_rows or NEW_ROWS_WAIT))
            results.append(
                Result(
                    fault, injected.victim_name, injected.led, injected.elected, writable, new_rows, gap, failed, behind
                )
            )
            print(f"  {fault}: {results[-1]}", flush=True)
            print(slow_batches(query, at, at + (new_rows or NEW_ROWS_WAIT)), flush=True)
        query.stop()
        return results, restarts, publisher.retries
    finally:
        if publisher is not None:
            publisher.stop()
        if spark is not None:
            spark.stop()
        disconnect(options)
        cluster.close()


def slow_batches(query: StreamingQuery, since: float, until: float) -> str:
    """Where the query's batches that ended in ``[since, until]`` spent more than a second: each phase over 0.2 s."""
    lines = []
    for progress in query.recentProgress:
        ended = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
        durations = dict(progress.durationMs)
        ended += durations.get("triggerExecution", 0) / 1000
        if since <= ended <= until + 1 and durations.get("triggerExecution", 0) > 1000:
            phases = ", ".join(
                f"{k} {v / 1000:.1f}" for k, v in durations.items() if v > 200 and k != "triggerExecution"
            )
            lines.append(f"    batch {progress.batchId} ended +{ended - since:.1f} s, took "
                         f"{durations['triggerExecution'] / 1000:.1f} s: {phases}")  # fmt: skip
    return "\n".join(lines) or "    (no batch took over 1 s)"


def start_write_query(spark: SparkSession, servers: str, checkpoint: Path, first_seq: int) -> StreamingQuery:
    rows = (
        spark.readStream.format("jetstream")
        .options(servers=servers, stream=STREAM, startingPosition=first_seq, maxMessagesPerTrigger=MAX_PER_TRIGGER)
        .load()
    )
    sink = (
        rows.select("data")
        .writeStream.format("jetstream")
        .options(
            servers=servers,
            subject=f"{TARGET.lower()}.rows",
            commitBucketReplicas=3,
            checkpointLocation=str(checkpoint),
        )
    )
    return sink.trigger(processingTime="1 second").start()


def write_target_fault(
    spark: SparkSession, api: JetStreamApi, cluster: EmbeddedCluster, servers: str, publisher: Publisher, work: Path,
    n: int,
) -> Result:  # fmt: skip
    """``write target, frozen``: a query writing the stream's new messages into ``TARGET`` while the target's leader
    freezes; then whether the target holds each message the query committed exactly once."""
    api.purge_stream(TARGET)
    checkpoint, first = work / f"cp-write-{n}", api.stream_info(STREAM)["state"]["last_seq"] + 1
    query, restarts, failed = start_write_query(spark, servers, checkpoint, first), 0, "no"
    deadline = time.time() + NEW_ROWS_WAIT
    while len(commits(checkpoint)) < 3 and time.time() < deadline and query.exception() is None:
        time.sleep(0.2)
    if not wait_healthy(api, TARGET, [], 60):
        print("  warning: the target stream did not become healthy")
    time.sleep(SETTLE)
    injected = inject_fault("stream leader", api, cluster, TARGET, [], publisher, FROZEN, NEW_ROWS_WAIT, signal.SIGSTOP)
    at, new_rows = injected.at, None
    while time.time() < at + NEW_ROWS_WAIT:
        if query.exception() is not None or not query.isActive:
            failed, restarts = cause(str(query.exception() or "stopped")), restarts + 1
            query = start_write_query(spark, servers, checkpoint, first)
        if injected.elected is not None:
            newer = [t for t, _ in commits(checkpoint) if t > at + injected.elected]
            if newer:
                new_rows = newer[0] - at
                break
        time.sleep(0.1)
    if injected.watcher is not None:
        injected.watcher.join(NEW_ROWS_WAIT)
    gap = longest_commit_gap([t for t, _ in commits(checkpoint)], at, at + (new_rows or NEW_ROWS_WAIT))
    query.stop()
    committed, planned = commits(checkpoint)[-1][1], planned_end(checkpoint)
    if (wrong := not_exactly_once(spark, servers, STREAM, TARGET, first, committed, planned)) and failed == "no":
        failed = wrong
    elected, restarted = injected.elected, f" ({restarts} restarts)" if restarts else ""
    return Result("write target, frozen", injected.victim_name, injected.led, elected, elected, new_rows, gap,
                  failed + restarted)  # fmt: skip


def planned_end(checkpoint: Path) -> int:
    """The end seq of the last batch the query planned (committed or not: a stop can cut one short)."""
    last = max((checkpoint / "offsets").glob("[0-9]*"), key=lambda path: int(path.name))
    return int(json.loads(last.read_text().strip().splitlines()[-1])["seq"])


def not_exactly_once(
    spark: SparkSession, servers: str, stream: str, target: str, first: int, committed: int, planned: int
) -> str:
    """'' when ``target`` holds the payload of each of ``stream``'s messages ``first`` to ``committed`` once, and
    nothing else but the stream's messages up to ``planned`` (the batch the stop cut short wrote part of its rows:
    a restart would write them again under the same msg ids); else what differs."""

    def payloads(**options: str | int) -> list[bytes]:
        reader = spark.read.format("jetstream").options(servers=servers, **options)
        return [bytes(row.data) for row in reader.load().select("data").collect()]

    written = payloads(stream=target)
    must = set(payloads(stream=stream, startingPosition=first, endingPosition=committed))
    may = set(payloads(stream=stream, startingPosition=first, endingPosition=planned))
    doubled, missing, foreign = len(written) - len(set(written)), len(must - set(written)), len(set(written) - may)
    if doubled or missing or foreign:
        return f"target not exact: {doubled} doubled, {missing} committed and missing, {foreign} not from the stream"
    return ""


def print_results(results: list[Result]) -> None:
    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    print(
        f"  {'fault':<28}{'behind':>7} {'victim':<8}{'it led':<22}{'elected s':>10}{'writable s':>11}"
        f"{'new rows s':>11}{'recovery s':>11}{'no commit s':>12}  query failed"
    )
    for r in results:
        timings = f"{secs(r.elected):>10}{secs(r.writable):>11}{secs(r.new_rows):>11}{secs(r.recovery):>11}"
        print(f"  {r.fault:<28}{r.behind:>7,} {r.victim:<8}{r.led:<22}{timings}{r.gap:>12.1f}  {r.failed}")


def run(suite: Suite) -> None:
    rounds = suite.args.leader_rounds
    heading(
        f"leader-change: 3-node cluster, {RATE} msg/s, victim restarted after {DOWN:g} s (thawed or healed after "
        f"{FROZEN:g} s), {rounds} round(s) of {', '.join(chosen(suite))}"
    )
    results, restarts, retries = measure(suite, rounds)
    print_results(results)
    print(f"  query restarts: {restarts}; publishes retried through the faults: {retries}")
    baselines = [r.recovery for r in results if r.fault == "none" and r.recovery is not None]
    after = [r.recovery for r in results if r.fault != "none" and r.recovery is not None]
    stalled = any(r.recovery is None or r.failed != "no" for r in results)
    worst = max(after, default=float("nan"))
    suite.summary.append(
        Summary(
            "leader change: stream writable to new rows committed, worst fault (s)",
            worst,
            baselines[0] if baselines else float("nan"),
            "s",
            f"< {GOAL:g} s, no failure",
            worst < GOAL and not stalled,
        )
    )
