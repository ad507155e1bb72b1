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
names a new meta leader), when the first batch holding rows published after the fault was committed
(``new rows``: the commit file of the first batch whose end offset passes the stream's last seq at the
fault, from the checkpoint), the longest time without any commit around the fault, and whether the
query failed (it is then restarted on its checkpoint for the next fault, and counted). The table is
printed; nothing is asserted: the machine is shared, and the numbers are for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats

from spark_jetstream.connection import ConnectionOptions, close_all, connect
from spark_jetstream.demo import QUIET_LOG4J
from spark_jetstream.embedded import EmbeddedCluster, EmbeddedServer
from spark_jetstream.groups import partitioned_stream_config
from spark_jetstream.jsapi import JetStreamApi

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


# -- the publisher -------------------------------------------------------------------------------


class Publisher:
    """Publishes ``rate`` msg/s from a thread of its own, each message retried until its PubAck comes
    (``Nats-Msg-Id`` makes a retry of a stored message a duplicate), and tracks the last acked seq."""

    def __init__(self, servers: list[str], rate: int) -> None:
        self.servers = servers
        self.rate = rate
        self.last_seq = 0
        self.published = 0
        self.retries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="publisher", daemon=True)

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _one(self, js: Any, index: int) -> None:
        headers = {"Nats-Msg-Id": f"lead-{index}"}
        payload = json.dumps({"i": index, "t": time.time()}).encode()
        while not self._stop.is_set():
            try:
                ack = await js.publish(f"lead.k{index % 211}", payload, timeout=2.0, headers=headers)
            except Exception:  # a leader change: the same message again, the msg id dedupes it
                self.retries += 1
                await asyncio.sleep(0.2)
                continue
            self.last_seq = max(self.last_seq, ack.seq)
            self.published += 1
            return

    async def _run(self) -> None:
        client = await nats.connect(servers=self.servers, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = client.jetstream()
        tick, per_tick, index = 0.02, max(1, round(self.rate * 0.02)), 0
        pending: set[asyncio.Task[None]] = set()
        next_tick = time.monotonic()
        while not self._stop.is_set():
            for _ in range(per_tick):
                task = asyncio.create_task(self._one(js, index))
                pending.add(task)
                task.add_done_callback(pending.discard)
                index += 1
            next_tick += tick
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
        await asyncio.gather(*pending, return_exceptions=True)
        await client.close()


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


def commits(checkpoint: Path) -> list[tuple[float, int]]:
    """(commit time, end seq) of every committed batch, in batch order."""
    done = []
    for path in (checkpoint / "commits").glob("[0-9]*"):
        batch = int(path.name)
        offsets = checkpoint / "offsets" / str(batch)
        if not offsets.exists():
            continue
        end = json.loads(offsets.read_text().strip().splitlines()[-1])
        done.append((batch, path.stat().st_mtime, int(end["seq"])))
    return [(at, seq) for _, at, seq in sorted(done)]


# -- the faults ----------------------------------------------------------------------------------


def meta_leader(servers: list[EmbeddedServer]) -> str | None:
    """The meta leader as the given servers' ``/jsz`` reports it."""
    for server in servers:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/jsz", timeout=1) as response:
                leader = json.load(response).get("meta_cluster", {}).get("leader")
        except OSError:
            continue
        if leader:
            return leader
    return None


def wait_healthy(api: JetStreamApi, consumers: list[str], wait: float = 60.0) -> None:
    """Every replica of the stream and of the member consumers current again."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            infos = [api.stream_info(STREAM)["cluster"]] + [api.consumer_info(STREAM, c)["cluster"] for c in consumers]
        except Exception:
            time.sleep(0.5)
            continue
        replicas = [c.get("replicas") or [] for c in infos]
        if all(c.get("leader") for c in infos) and all(
            len(r) == 2 and all(x.get("current") for x in r) for r in replicas
        ):
            return
        time.sleep(0.5)
    print("warning: the cluster did not become healthy again", file=sys.stderr)


def move_leader(api: JetStreamApi, tokens: tuple[str, ...], info: Any, avoid: set[str], names: list[str]) -> None:
    """Step a group's leader down until it sits on a server not in ``avoid`` (best effort)."""
    for _ in range(10):
        if info()["cluster"].get("leader") not in avoid:
            return
        preferred = next(name for name in names if name not in avoid)
        with contextlib.suppress(Exception):  # a group still settling: ask again
            api.call(tokens, {"placement": {"preferred": preferred}}, "leader step-down")
        time.sleep(1.5)


def leads(api: JetStreamApi, cluster: EmbeddedCluster, consumers: list[str], name: str) -> str:
    """What ``name`` leads: meta, stream, member consumers."""
    roles = ["meta"] if meta_leader(cluster.servers) == name else []
    roles += ["stream"] if api.stream_info(STREAM)["cluster"].get("leader") == name else []
    roles += [c for c in consumers if api.consumer_info(STREAM, c)["cluster"].get("leader") == name]
    return ",".join(roles) or "-"


@dataclass
class Result:
    fault: str
    victim: str
    led: str
    elected: float | None
    new_rows: float | None
    gap: float
    failed: str


def run_fault(
    fault: str, api: JetStreamApi, cluster: EmbeddedCluster, consumers: list[str], publisher: Publisher, down: float
) -> tuple[float, int, str, str, threading.Thread | None, list[float | None]]:
    """Inject ``fault``; returns the fault's time and the stream's last seq then, the victim and what it led,
    and a thread that records when a successor answered (into the list) and restarts the victim after
    ``down`` s."""
    names = [s.name for s in cluster.servers]
    by_name = {s.name: s for s in cluster.servers}
    meta = meta_leader(cluster.servers) or ""
    stream_leader = api.stream_info(STREAM)["cluster"]["leader"]
    if fault == "none":
        return time.time(), publisher.last_seq, "-", "-", None, [None]
    if fault == "consumer leader":
        move_leader(
            api,
            ("CONSUMER", "LEADER", "STEPDOWN", STREAM, consumers[0]),
            lambda: api.consumer_info(STREAM, consumers[0]),
            {meta, stream_leader},
            names,
        )
        victim = by_name[api.consumer_info(STREAM, consumers[0])["cluster"]["leader"]]
    elif fault == "stream leader":
        victim = by_name[stream_leader]
    else:
        victim = by_name[meta]
    led = leads(api, cluster, consumers, victim.name)
    elected: list[float | None] = [None]
    at, last_seq = time.time(), publisher.last_seq
    assert victim.process is not None
    victim.process.send_signal(signal.SIGTERM if fault == "meta leader" else signal.SIGKILL)

    def successor() -> str | None:
        survivors = [s for s in cluster.servers if s is not victim]
        if fault == "meta leader":
            return meta_leader(survivors)
        info = api.stream_info(STREAM) if fault == "stream leader" else api.consumer_info(STREAM, consumers[0])
        return info["cluster"].get("leader")

    def watch() -> None:
        restart_at = at + down
        while time.time() < at + NEW_ROWS_WAIT:
            if elected[0] is None:
                try:
                    leader = successor()
                except Exception:
                    leader = None
                if leader and leader != victim.name:
                    elected[0] = time.time() - at
            if victim.process is not None and victim.process.poll() is not None:
                victim.process = None
            if victim.process is None and time.time() >= restart_at:
                victim.start()
            if elected[0] is not None and victim.process is not None:
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, name="watch", daemon=True)
    watcher.start()
    return at, last_seq, victim.name, led, watcher, elected


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
            wait_healthy(api, consumers)
            time.sleep(args.settle)
            at, last_seq, victim_name, led, watcher, elected = run_fault(
                fault, api, cluster, consumers, publisher, args.down
            )
            new_rows, failed = None, "no"
            deadline = at + NEW_ROWS_WAIT
            while time.time() < deadline:
                if query.exception() is not None or not query.isActive:
                    failed = cause(str(query.exception() or "stopped"))
                    restarts += 1
                    query = start_query(spark, ",".join(servers), work)
                newer = [t for t, seq in commits(checkpoint) if t > at and seq > last_seq]
                if newer:
                    new_rows = newer[0] - at
                    break
                time.sleep(0.1)
            if watcher is not None:
                watcher.join(NEW_ROWS_WAIT)
            times = [t for t, _ in commits(checkpoint)]
            window = [t for t in times if at - 5 <= t <= at + (new_rows or NEW_ROWS_WAIT)]
            before = [t for t in times if t <= at]
            edges = ([before[-1]] if before else [at]) + [t for t in window if t > at]
            gap = max((b - a for a, b in itertools.pairwise(edges)), default=0.0)
            results.append(Result(fault, victim_name, led, elected[0], new_rows, gap, failed))
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
"""Issue 23's target: new rows committed within this many seconds of the new leader's election."""


def scenario(suite: Any) -> None:
    """``bench/run.py --only leader-change``: this script in a process of its own (it needs a cluster
    and a Spark session of its own), its table printed, and one summary row: the worst time from a
    successor's election to the first committed batch with new rows, against the no-fault baseline."""
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
    after = [r["new_rows"] - (r["elected"] or 0.0) for r in rows if r["fault"] != "none" and r["new_rows"] is not None]
    stalled = any(r["new_rows"] is None or r["failed"] != "no" for r in rows)
    worst = max(after, default=float("nan"))
    baseline = next(r["new_rows"] for r in rows if r["fault"] == "none")
    suite.summary.append(
        Summary(
            "leader change: election to new rows, worst fault (s)",
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
        f"{'fault':<17}{'victim':<8}{'it led':<22}{'elected s':>10}{'new rows s':>11}{'no commit s':>12}  query failed"
    )
    for r in results:
        timings = f"{secs(r.elected):>10}{secs(r.new_rows):>11}{r.gap:>12.1f}"
        print(f"{r.fault:<17}{r.victim:<8}{r.led:<22}{timings}  {r.failed}")
    print(f"query restarts: {restarts}; publishes retried through the faults: {retries}")
    if args.json:
        print(json.dumps([asdict(r) for r in results]))


if __name__ == "__main__":
    main()
