"""Leader changes under load: how long a streaming query stalls when a leader dies, and whether it fails.

python bench/leader_change.py [--rate 500] [--down 5] [--settle 10] [--rounds 1]

A 3-node cluster (``EmbeddedCluster``), a 4-partition R3 file stream, a publisher at ``--rate`` msg/s
(JetStream publishes with a ``Nats-Msg-Id``, retried through the faults, so nothing is lost), and a
streaming query (``local[2]``, 1 s trigger, ``maxMessagesPerTrigger=2000``, parquet sink). For each
fault, one after another (``--rounds`` times), the victim restarted on its store ``--down`` seconds later:

* ``none``: no fault, the baseline (a 1 s trigger commits new rows within about a trigger);
* ``stream leader``: SIGKILL of the stream's leader;
* ``consumer leader``: SIGKILL of the leader of member consumer ``g-0`` (moved off the stream and
  meta leaders first, so the fault is the consumer's alone);
* ``meta leader``: SIGTERM of the JetStream meta leader.

Measured per fault, from the moment the signal is sent: when the lost leader's successor answered
(``elected``: the stream or consumer info names another leader, or a surviving server's ``/jsz``
names a new meta leader), when the stream took writes again (``writable``: the publisher's first PubAck
after its longest silence, ``cluster_faults.writable_again``), when the batch holding the first message
stored then was committed (``new rows``, from the checkpoint's commit files), and the figure the target is
about: that commit after the stream took writes again (``recovery``). Also the longest time without any
commit around the fault, and whether the query failed (it is then restarted on its checkpoint for the next
fault, and counted). The table is printed; nothing is asserted: the machine is shared, and the numbers are
for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jetstream.client.connection import ConnectionOptions, close_all, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.tools.cluster_faults import (
    Publisher,
    commits,
    inject_fault,
    longest_commit_gap,
    wait_healthy,
    writable_again,
)
from spark_jetstream.tools.demo import QUIET_LOG4J
from spark_jetstream.tools.embedded import EmbeddedCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

STREAM = "LEAD"
GROUP = "g"
PARTITIONS = 4
MAX_PER_TRIGGER = 2000
NEW_ROWS_WAIT = 90.0
"""Seconds to wait for a batch with new rows after a fault before calling it stalled for good."""
FAULTS = ("none", "stream leader", "consumer leader", "meta leader")


# -- the query -----------------------------------------------------------------------------------


def start_query(spark: SparkSession, servers: str, work: Path) -> StreamingQuery:
    return (
        spark.readStream.format("jetstream")
        .option("servers", servers)
        .option("stream", STREAM)
        .option("group", GROUP)
        .option("maxMessagesPerTrigger", MAX_PER_TRIGGER)
        .load()
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


# -- the faults ----------------------------------------------------------------------------------


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

    @property
    def recovery(self) -> float | None:
        """From the stream taking writes again to the commit of the first message it then stored."""
        return None if self.new_rows is None or self.writable is None else self.new_rows - self.writable


def measure(args: argparse.Namespace) -> tuple[list[Result], int, int, str]:
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="leader-change-"))
    log_config = work / "log4j2.properties"
    log_config.write_text(QUIET_LOG4J)
    cluster = EmbeddedCluster(3, name="lead").start()
    results: list[Result] = []
    restarts = 0
    try:
        servers = [s.url for s in cluster.servers]
        api = JetStreamApi(connect(ConnectionOptions(servers=tuple(servers))))
        api.create_stream(partitioned_stream_config(STREAM, "lead.*", PARTITIONS, num_replicas=3, storage="file"))
        binary = cluster.servers[0].binary
        publisher = Publisher(servers, args.rate).start()
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("leader-change bench")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        query = start_query(spark, ",".join(servers), work)
        checkpoint = work / "cp"
        consumers = [f"{GROUP}-{p}" for p in range(PARTITIONS)]
        while len(commits(checkpoint)) < 3:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed at start: {query.exception()}")
            time.sleep(0.2)
        for fault in [f for _ in range(args.rounds) for f in FAULTS]:
            if not wait_healthy(api, STREAM, consumers):
                print("warning: the cluster did not become healthy again", file=sys.stderr)
            time.sleep(args.settle)
            injected = inject_fault(fault, api, cluster, STREAM, consumers, publisher, args.down, NEW_ROWS_WAIT)
            at = injected.at
            new_rows, writable, failed = None, None, "no"
            deadline = at + NEW_ROWS_WAIT
            while time.time() < deadline:
                if query.exception() is not None or not query.isActive:
                    failed = cause(str(query.exception() or "stopped"))
                    restarts += 1
                    query = start_query(spark, ",".join(servers), work)
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
                Result(fault, injected.victim_name, injected.led, injected.elected, writable, new_rows, gap, failed)
            )
            print(f"{fault}: {results[-1]}", flush=True)
        query.stop()
        publisher.stop()
        spark.stop()
        return results, restarts, publisher.retries, binary
    finally:
        close_all()
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)


def server_version(binary: str) -> str:
    import subprocess

    return subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.strip()


TARGET = 5.0
"""New rows committed within this many seconds of the stream taking writes again."""


def scenario(suite: Any) -> None:
    """``bench/run.py --only leader-change``: this script in a process of its own (it needs a cluster
    and a Spark session of its own), its table printed, and one summary row: the worst recovery (the stream
    taking writes again to the commit of the first message it then stored), against the no-fault baseline."""
    import subprocess

    from suite import Summary

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, __file__, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parent,
        check=False,
    )
    if done.returncode:
        sys.exit(f"leader-change failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    print("\n".join(lines[:-1]))
    rows = json.loads(lines[-1])
    recovery = [r["new_rows"] - r["writable"] for r in rows if r["new_rows"] is not None and r["writable"] is not None]
    after = recovery[1:] if rows and rows[0]["fault"] == "none" else recovery
    stalled = any(r["new_rows"] is None or r["failed"] != "no" for r in rows)
    worst = max(after, default=float("nan"))
    baseline = recovery[0] if recovery else float("nan")
    suite.summary.append(
        Summary(
            "leader change: stream writable to new rows committed, worst fault (s)",
            worst,
            baseline,
            "s",
            f"< {TARGET:g} s, no failure",
            worst < TARGET and not stalled,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=500, help="messages per second published throughout")
    parser.add_argument("--down", type=float, default=5.0, help="seconds before the victim is restarted")
    parser.add_argument("--rounds", type=int, default=1, help="times the sequence of faults is run")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds of steady state before each fault")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line, last")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    results, restarts, retries, binary = measure(args)

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    print(f"\n{server_version(binary)}, {args.rate} msg/s, victim restarted after {args.down:g} s")
    print(
        f"{'fault':<17}{'victim':<8}{'it led':<22}{'elected s':>10}{'writable s':>11}{'new rows s':>11}"
        f"{'recovery s':>11}{'no commit s':>12}  query failed"
    )
    for r in results:
        timings = f"{secs(r.elected):>10}{secs(r.writable):>11}{secs(r.new_rows):>11}{secs(r.recovery):>11}"
        timings += f"{r.gap:>12.1f}"
        print(f"{r.fault:<17}{r.victim:<8}{r.led:<22}{timings}  {r.failed}")
    print(f"query restarts: {restarts}; publishes retried through the faults: {retries}")
    if args.json:
        print(json.dumps([{**asdict(r), "recovery": r.recovery} for r in results]))


if __name__ == "__main__":
    main()
