"""``chaos``: two streaming queries on a Spark standalone cluster through random faults of every kind for
``--chaos-minutes``; then whether every message arrived exactly once, the ack floors equal the checkpoints, and
nothing grew with the batch count.

All on this machine, as root (network namespaces, a cgroup v1 CPU quota):

* a 3-node cluster, each server in a network namespace of its own (``EmbeddedCluster(isolated=True)``), holding the
  4-partition R3 file stream ``CHAOS`` and the R3 file stream ``CHAOS_OUT``, both deduplicating msg ids for
  ``DUPLICATE_WINDOW`` s (a publish retried through a long fault must still find its first copy);
* a Spark standalone Master and two Workers on hosts of their own (``spark_standalone.StandaloneCluster``) with
  ``WORKER_CORES`` cores each, and each query's app ``APP_CORES`` one-core executors, which the Master spreads over
  both Workers: a lost Worker leaves each query an executor, and the other Worker has the cores to take the lost
  executors at once (with Workers only as large as the apps, an app whose executors had both landed on the lost
  Worker waited 100 s for its replacement: measured, seed 2);
* two queries, each in a driver process of its own (``bench/chaos_job.py``, stopped through a stop file): ``a`` reads
  ``CHAOS`` through group ``ga`` (Direct Get) and writes each payload into ``CHAOS_OUT`` with the connector's
  exactly-once sink; ``b`` reads it through group ``gb`` with ``readMode=pull`` into parquet (``seq``, ``subject``,
  ``data``). A driver that exits on its own is a failed query: counted, and started again on its checkpoint;
* a publisher (``cluster_faults.Publisher``: msg ids, retried until acked, every stored message recorded) at ``RATE``
  msg/s, ``BURST`` times that for ``BURST_SECONDS`` now and then;
* a nemesis drawing from ``random.Random(--seed)`` one to three overlapping faults at a time out of ``KINDS``, each on
  a target not already under a fault, with pauses between: a server SIGKILLed and restarted on its store, frozen
  (SIGSTOP), cut off (its link down), cut off from one other server only (both still reach the third and every
  client: a replica falls behind while its server still leads consumers), starved of CPU (``CPUS`` of a core); the
  leader of a stream, of a member consumer, of the meta group stepped down; a Spark Worker lost with its executors and
  Python workers (every process of its tree) and a new Worker started on its host ``WORKER_DOWN`` s later; a driver
  killed (its process tree) and started again on its checkpoint. Each fault is healed at its end, and each round ends
  once the cluster is healthy.

After ``--chaos-minutes`` the nemesis stops (healing whatever is under a fault), the publisher drains, both queries get
``CATCH_UP`` s to commit through the stream's last seq, and the drivers are stopped. Printed: the fault schedule (kind,
target, start and end in seconds from the run's start); per fault and query, the seconds from its end, and from its
start where a majority of the servers stayed up, to the next committed batch holding new rows (its end seq past the
stream's last seq at that moment); the longest time without new rows while a majority was up; failed queries and
restarts; every recorded message exactly once in ``CHAOS_OUT`` (by payload) and in the parquet output (by seq); each
member consumer's ack floor against its query's last committed offset; RSS, threads and open files of every process,
and the servers' connections, subscriptions, consumers and KV keys, once the queries ran a few batches and at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import BENCH_DIR, fresh_session, heading, status_kb
from suite import Suite, Summary, python_kinds

from scenarios.leader_change import cause
from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.connection_options import DEFAULT_REQUEST_TIMEOUT
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import JetStreamError
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import (
    EmbeddedCluster,
    EmbeddedServer,
    Publisher,
    StandaloneCluster,
    commits,
    descendants,
    kill_tree,
    meta_leader,
    spark_home,
    wait_healthy,
)
from spark_jetstream.tools.demo import QUIET_LOG4J

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STREAM, TARGET = "CHAOS", "CHAOS_OUT"
TARGET_SUBJECT = "chaos_out.rows"
PARTITIONS = 4
QUERIES = {"a": "ga", "b": "gb"}
"""Query -> its group."""
CONSUMERS = [f"{group}-{p}" for group in QUERIES.values() for p in range(PARTITIONS)]
DUPLICATE_WINDOW = 600.0
RATE = 200
"""Messages per second published, outside bursts."""
BURST = 5
BURST_SECONDS = (2.0, 6.0)
BURST_EVERY = (20.0, 60.0)
"""Seconds between bursts (drawn)."""
WORKER_CORES, APP_CORES = 4, 2
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Every Spark JVM compiles with C1 only and collects in one thread: CPU the servers and Python workers need."""
CPUS = 0.1
"""Cores a starved server gets."""
WORKER_DOWN = 10.0
KINDS: dict[str, tuple[float, float]] = {
    "server killed": (3.0, 8.0),
    "server frozen": (5.0, 30.0),
    "server partitioned": (5.0, 30.0),
    "servers cut apart": (5.0, 30.0),
    "server starved": (30.0, 60.0),
    "stream leader step-down": (0.0, 0.0),
    "consumer leader step-down": (0.0, 0.0),
    "meta leader step-down": (0.0, 0.0),
    "worker lost": (WORKER_DOWN, WORKER_DOWN),
    "driver killed": (1.0, 5.0),
}
"""Each kind of fault and the range its length is drawn from (seconds until it is healed)."""
OUTAGES = ("server killed", "server frozen", "server partitioned")
"""Faults that take a server out of the cluster: two at once leave no majority."""
SPREAD = 10.0
"""Seconds between the starts of a round's faults, at most (drawn)."""
PAUSE = (5.0, 20.0)
"""Seconds between rounds (drawn)."""
ACCOUNTS = {
    "accounts": {
        "APP": {"jetstream": "enabled", "users": [{"user": "app", "password": "app"}]},
        "SYS": {"users": [{"user": "sys", "password": "sys"}]},
    },
    "system_account": "SYS",
    "no_auth_user": "app",
}
"""The servers' accounts: clients without credentials land in ``APP``; the meta leader obeys a step-down from the
system account only (from any other it is ignored, unanswered)."""
HARNESS_TIMEOUT = 5.0
"""Seconds the run's own API calls (leaders, step-downs, health) wait: a group without a majority answers no one."""
WARM_BATCHES = 10
"""Batches each query commits before the nemesis starts (the first resource snapshot)."""
START_WAIT = 300.0
HEAL_WAIT = 300.0
"""Seconds the nemesis gets to heal every fault once told to stop (a bound)."""
CATCH_UP = 600.0
"""Seconds the queries get to commit through the stream's last seq once the publisher stopped (a bound)."""
MAJORITY_GRACE = DEFAULT_REQUEST_TIMEOUT
"""A query failing within this many seconds after a majority of the servers came back failed for the documented
reason (no meta or stream leader within the request deadline), not for a bug."""
PROCESS_FIGURES = ("processes", "RSS MB", "threads", "open files")
GROWTH = {"processes": 1, "RSS MB": 256, "threads": 32, "open files": 32, "connections": 4, "subscriptions": 64}
"""What a figure may grow by from the first snapshot to the last, on top of half of itself (a leak grows with the
batch count: hundreds of batches); consumers, KV buckets and KV keys may not grow at all."""


def restart_server(server: EmbeddedServer, tries: int = 3) -> None:
    """Start a killed server again on its store; a start that failed (a port taken meanwhile) is tried again."""
    for attempt in range(tries):
        try:
            server.start(wait=60)
            return
        except JetStreamError:
            server.kill()
            if attempt == tries - 1:
                raise


def log_line(path: Path, began: float, text: str) -> None:
    line = f"  [{time.time() - began:7.1f} s] {text}"
    print(line, flush=True)
    with open(path, "a") as log:
        log.write(line + "\n")


@dataclass
class Fault:
    """One fault of the schedule: times are ``time.time()``, seqs the publisher's last acked seq then."""

    kind: str
    target: str
    start: float
    seq_at_start: int
    end: float | None = None
    seq_at_end: int = 0
    note: str = ""


class Driver:
    """One query's driver process, started with a session of its own; killed (its whole tree) and started again on
    its checkpoint; a driver that exits on its own is a failure, recorded and started again by ``check``."""

    def __init__(self, name: str, command: list[str], work: Path, env: dict[str, str]) -> None:
        self.name, self.command, self.work, self.env = name, command, work, env
        self.checkpoint = work / f"cp-{name}"
        self.log = work / f"driver-{name}.log"
        self.stop_file = work / f"stop-{name}"
        self.process: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.down = False
        """Killed on purpose and not started again yet."""
        self.kills = 0
        self.failures: list[tuple[float, str]] = []
        self._log_from = 0

    def start(self) -> Driver:
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command, env=self.env, cwd=self.work, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        return self

    def output(self) -> str:
        """What the current process wrote so far."""
        with open(self.log, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")

    def check(self) -> str | None:
        """If the driver exited without being told to: why, after starting it again."""
        with self.lock:
            if self.down or self.process is None or self.process.poll() is None or self.stop_file.exists():
                return None
            why = f"exit {self.process.returncode}: {cause(self.output())}"
            self.failures.append((time.time(), why))
            kill_tree(self.process)  # what it may have left
            self.start()
            return why

    def kill(self) -> None:
        with self.lock:
            self.down = True
            if self.process is not None:
                kill_tree(self.process)

    def restart(self) -> None:
        with self.lock:
            self.start()
            self.down, self.kills = False, self.kills + 1

    def stop(self, wait: float = 120.0) -> bool:
        """Tell the query to stop; whether it did within ``wait`` s (the tree is killed anyway)."""
        self.stop_file.touch()
        process = self.process
        if process is None:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
        stopped = process.returncode == 0
        kill_tree(process)
        return stopped


# -- processes and server-side state, at the start and at the end ---------------------------------------------------


def _is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0")[0].endswith(b"java")
    except OSError:
        return False


def _under_jvm(jvm: int, prefix: str) -> dict[int, str]:
    """The Python processes under a Spark JVM, by kind (``suite.python_kinds``)."""
    return {pid: f"{prefix} {kind}" for pid, kind in python_kinds(jvm).items()}


def process_roles(cluster: EmbeddedCluster, spark: StandaloneCluster, drivers: Iterable[Driver]) -> dict[int, str]:
    """Every process of the run by role: servers, the Master and Workers, executors and their Python processes,
    drivers (Python, JVM, the Python processes under the JVM)."""
    roles = {server.pid: "nats-server" for server in cluster.servers if server.pid}
    if spark.master is not None:
        roles[spark.master.pid] = "spark master"
    for worker in spark.workers:
        if worker is not None:
            roles[worker.pid] = "spark worker"
            for jvm in filter(_is_java, descendants(worker.pid)):
                roles[jvm] = "executor JVM"
                roles.update(_under_jvm(jvm, "executor"))
    for driver in drivers:
        if driver.process is not None and driver.process.poll() is None:
            roles[driver.process.pid] = "driver Python"
            for jvm in filter(_is_java, descendants(driver.process.pid)):
                roles[jvm] = "driver JVM"
                roles.update(_under_jvm(jvm, "driver"))
    return roles


def process_figures(roles: dict[int, str]) -> dict[str, dict[str, int]]:
    """Per role: processes, RSS MB, threads and open files, summed over its processes (``/proc/<pid>``)."""
    figures: dict[str, Counter[str]] = {}
    for pid, role in roles.items():
        try:
            files = len(os.listdir(f"/proc/{pid}/fd"))
            with open(f"/proc/{pid}/stat") as stat:
                zombie = stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue  # ended meanwhile
        counts = figures.setdefault(f"{role} (zombie)" if zombie else role, Counter())
        counts["processes"] += 1
        counts["RSS MB"] += status_kb(pid, "VmRSS:") // 1024
        counts["threads"] += status_kb(pid, "Threads:")  # a count, read the same way
        counts["open files"] += files
    return {role: dict(counts) for role, counts in sorted(figures.items())}


def _monitor(server: EmbeddedServer, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{server.monitor}{path}", timeout=5) as response:
        return json.load(response)


def _streams(server: EmbeddedServer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The server's ``/jsz`` with streams and consumers, and the streams it holds."""
    jsz = _monitor(server, "/jsz?accounts=true&streams=true&consumers=true")
    return jsz, [s for account in jsz.get("account_details") or [] for s in account.get("stream_detail") or []]


def leads(server: EmbeddedServer) -> str:
    """What ``server`` leads as its own ``/jsz`` says (meta, streams, consumers), for the schedule."""
    try:
        jsz, streams = _streams(server)
    except OSError:
        return "?"
    led = ["meta"] if jsz.get("meta_cluster", {}).get("leader") == server.name else []
    for stream in streams:
        groups = [stream, *(stream.get("consumer_detail") or [])]
        led += [group["name"] for group in groups if (group.get("cluster") or {}).get("leader") == server.name]
    return ",".join(led) or "nothing"


def server_figures(cluster: EmbeddedCluster) -> dict[str, dict[str, int]]:
    """Per server, from its monitoring endpoint: the messages it stores, client connections, subscriptions,
    consumers, KV buckets and keys."""
    figures = {}
    for server in cluster.servers:
        jsz, streams = _streams(server)
        buckets = [s for s in streams if s["name"].startswith("KV_")]
        figures[server.name] = {
            "store MB": jsz.get("bytes", 0) // (1 << 20),
            "connections": _monitor(server, "/connz")["num_connections"],
            "subscriptions": _monitor(server, "/subsz")["num_subscriptions"],
            "consumers": jsz.get("consumers", 0),
            "KV buckets": len(buckets),
            "KV keys": sum(s["state"].get("num_subjects", 0) for s in buckets),
        }
    return figures


@dataclass
class Snapshot:
    """The run's processes (by role) and servers (by name), as figures."""

    processes: dict[str, dict[str, int]]
    servers: dict[str, dict[str, int]]
    batches: int
    """Batches both queries committed by then."""


def all_servers(figures: dict[str, dict[str, int]]) -> dict[str, int]:
    """The servers' figures summed: clients move between servers as faults come and go."""
    return dict(sum((Counter(server) for server in figures.values()), Counter()))


def growth(first: Snapshot, last: Snapshot) -> list[str]:
    """Every figure of ``last`` grown past what ``GROWTH`` allows over ``first``: by role, and all servers'."""
    grown = []
    for where, before, after in [
        *((role, first.processes.get(role, {}), figures) for role, figures in last.processes.items()),
        ("all servers", all_servers(first.servers), all_servers(last.servers)),
    ]:
        for key, value in after.items():
            if key == "threads" and where.endswith("JVM"):
                continue  # Spark's pools (block manager: two of up to 100 threads each) fill and idle out: not a leak
            if key == "store MB" or (key == "RSS MB" and where == "nats-server"):
                continue  # the run stores what it publishes: a server's memory grows with its store (printed)
            start = before.get(key, 0)
            if value > start + (start // 2 + GROWTH[key] if key in GROWTH else 0):
                grown.append(f"{where} {key} {start} -> {value}")
    return grown


def print_snapshots(first: Snapshot, last: Snapshot) -> None:
    print(f"  processes (first snapshot after {first.batches} batches, last after {last.batches}): start -> end")
    for role in sorted(first.processes.keys() | last.processes.keys()):
        before, after = first.processes.get(role, {}), last.processes.get(role, {})
        shown = ", ".join(f"{key} {before.get(key, 0):,} -> {after.get(key, 0):,}" for key in PROCESS_FIGURES)
        print(f"    {role:<24} {shown}")
    print("  servers: start -> end")
    servers = [(name, first.servers[name], last.servers[name]) for name in last.servers]
    for name, before, after in [*servers, ("all servers", all_servers(first.servers), all_servers(last.servers))]:
        print(f"    {name:<24} " + ", ".join(f"{key} {before[key]:,} -> {value:,}" for key, value in after.items()))


# -- the run ------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the run saw, for the report."""

    faults: list[Fault] = field(default_factory=list)
    bursts: list[tuple[float, float]] = field(default_factory=list)
    chaos: tuple[float, float] = (0.0, 0.0)
    checkpoints: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    failures: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)
    caught_up: bool = False
    stopped: dict[str, bool] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)
    record: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    retries: int = 0
    exactness: list[str] = field(default_factory=list)
    """What differs from exactly once (nothing: exact)."""
    counts: str = ""


class Chaos:
    """The run: clusters, drivers, publisher, nemesis; ``run`` does it all and ``close`` ends every process."""

    def __init__(self, suite: Suite) -> None:
        self.suite, self.seed = suite, suite.args.seed
        self.work = Path(suite.work, "chaos")
        self.work.mkdir(parents=True)
        self.log_path = self.work / "chaos.log"
        self.began = time.time()
        self.outcome = Outcome()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.busy: set[str] = set()
        self.cluster = EmbeddedCluster(3, name="chaos", isolated=True)
        for server in self.cluster.servers:
            server.extra.update(ACCOUNTS)
        self.urls = [server.url for server in self.cluster.servers]
        self.options = ConnectionOptions(servers=tuple(self.urls), request_timeout=HARNESS_TIMEOUT)
        self.system = ConnectionOptions(servers=tuple(self.urls), request_timeout=HARNESS_TIMEOUT, user="sys",
                                        password="sys")  # fmt: skip
        env = {"JAVA_TOOL_OPTIONS": JVM_OPTIONS}
        self.spark = StandaloneCluster(self.work, cores=WORKER_CORES, memory=f"{WORKER_CORES}g", env=env)
        self.publisher = Publisher(self.urls, RATE, prefix="chaos", record=True)
        self.drivers = {name: self._driver(name) for name in QUERIES}
        self.api: JetStreamApi | None = None
        self.publishing = False
        self.threads: list[threading.Thread] = []

    def log(self, text: str) -> None:
        log_line(self.log_path, self.began, text)

    def _driver(self, name: str) -> Driver:
        log4j = self.work / "log4j2.properties"
        log4j.write_text(QUIET_LOG4J)
        command = [sys.executable, str(BENCH_DIR / "chaos_job.py"), "--query", name, "--master", self.spark.url,
                   "--servers", ",".join(self.urls), "--stream", STREAM, "--checkpoint", str(self.work / f"cp-{name}"),
                   "--stop-file", str(self.work / f"stop-{name}"), "--log4j", str(log4j), "--cores", str(APP_CORES),
                   "--out", str(self.work / "out"), "--target-subject", TARGET_SUBJECT]  # fmt: skip
        env = {**os.environ, "JAVA_TOOL_OPTIONS": JVM_OPTIONS, "SPARK_HOME": spark_home(),
               "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}  # fmt: skip
        return Driver(name, command, self.work, env)

    # -- set-up and supervision ------------------------------------------------------------------------------------

    def set_up(self) -> None:
        self.cluster.start()
        self.api = JetStreamApi(connect(self.options))
        window = int(DUPLICATE_WINDOW * 1e9)
        self.api.create_stream(partitioned_stream_config(STREAM, "chaos.*", PARTITIONS, num_replicas=3,
                                                         storage="file", duplicate_window=window))  # fmt: skip
        self.api.create_stream({"name": TARGET, "subjects": ["chaos_out.>"], "num_replicas": 3, "storage": "file",
                                "duplicate_window": window, "allow_direct": True})  # fmt: skip
        self.spark.start()
        self.publisher.start()
        self.publishing = True
        for driver in self.drivers.values():
            driver.start()
        self.log(f"cluster, streams, Spark cluster ({self.spark.url}), publisher and both drivers started")

    def supervise(self) -> None:
        """Start again any driver that exited on its own (a failed query)."""
        for driver in self.drivers.values():
            if (why := driver.check()) is not None:
                self.log(f"query {driver.name} FAILED ({why}); its driver was started again")

    def wait_for(self, done: Callable[[], bool], seconds: float) -> bool:
        """Supervise the drivers until ``done()`` or ``seconds`` passed; whether it was done."""
        deadline = time.time() + seconds
        while not done():
            if time.time() > deadline:
                return False
            self.supervise()
            time.sleep(0.5)
        return True

    def committed(self, name: str) -> list[tuple[float, int]]:
        return commits(self.drivers[name].checkpoint) if (self.drivers[name].checkpoint / "commits").exists() else []

    def snapshot(self) -> Snapshot:
        roles = process_roles(self.cluster, self.spark, self.drivers.values())
        batches = sum(len(self.committed(name)) for name in QUERIES)
        return Snapshot(process_figures(roles), server_figures(self.cluster), batches)

    # -- the nemesis -------------------------------------------------------------------------------------------

    def server(self, name: str) -> EmbeddedServer:
        return next(server for server in self.cluster.servers if server.name == name)

    def leader(self, group: str) -> str | None:
        """The server leading ``stream <name>``, ``consumer <name>`` or ``meta`` (None: none now)."""
        assert self.api is not None
        kind, _, name = group.partition(" ")
        try:
            if kind == "meta":
                return meta_leader(self.cluster.servers)
            info = self.api.stream_info(name) if kind == "stream" else self.api.consumer_info(STREAM, name)
            return info["cluster"].get("leader")
        except Exception:
            return None

    def pick(self, kind: str, pick: float) -> str | None:
        """The target of a ``kind`` fault: the candidate ``pick`` (0..1) points at, or the next one not under a fault
        (a step-down's leader not either); None: none."""
        if kind == "servers cut apart":  # two servers that no longer reach each other, both reaching the third
            candidates = [f"{a.name}+{b.name}" for a, b in itertools.combinations(self.cluster.servers, 2)]
        elif kind.startswith("server"):
            candidates = [server.name for server in self.cluster.servers]
        elif kind == "worker lost":
            candidates = [f"worker{index}" for index in range(len(self.spark.hosts))]
        elif kind == "driver killed":
            candidates = [f"driver {name}" for name in QUERIES]
        elif kind.startswith("stream"):
            candidates = [f"stream {STREAM}", f"stream {TARGET}"]
        elif kind.startswith("consumer"):
            candidates = [f"consumer {consumer}" for consumer in CONSUMERS]
        else:
            candidates = ["meta"]
        first, step_down = int(pick * len(candidates)), kind.endswith("step-down")
        for target in candidates[first:] + candidates[:first]:
            leader = self.leader(target) if step_down else None
            with self.lock:
                parts = target.split("+")
                if any(part in self.busy for part in parts) or leader in self.busy or (step_down and leader is None):
                    continue
                self.busy.update(parts)
                return target
        return None

    def pause(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    def inject(self, fault: Fault, seconds: float) -> None:
        """Inject ``fault``, keep it ``seconds`` (less once the run stops) and heal it."""
        assert self.api is not None
        kind, target = fault.kind, fault.target
        if kind.endswith("step-down"):
            group, _, name = target.partition(" ")
            asset = {"meta": (), "stream": (name,), "consumer": (STREAM, name)}[group]
            tokens = (group.upper(), "LEADER", "STEPDOWN", *asset)
            fault.note = f"led by {self.leader(target)}"
            api = JetStreamApi(connect(self.system)) if group == "meta" else self.api
            api.call(tokens, None, kind)
            return
        if kind == "worker lost":
            index = int(target.removeprefix("worker"))
            self.spark.lose_worker(index)
            try:
                self.pause(seconds)
            finally:
                self.spark.start_worker(index)
            return
        if kind == "driver killed":
            driver = self.drivers[target.removeprefix("driver ")]
            driver.kill()
            try:
                self.pause(seconds)
            finally:
                driver.restart()
            return
        if kind == "servers cut apart":
            one, other = (self.server(name) for name in target.split("+"))
            fault.note = f"led {leads(one)}; {leads(other)}"
            self.cluster.cut_between(one, other)
            try:
                self.pause(seconds)
            finally:
                self.cluster.cut_between(one, other, cut=False)
            return
        server = self.server(target)
        fault.note = f"led {leads(server)}"
        heal: Callable[[], object]
        if kind == "server killed":
            server.kill()
            heal = partial(restart_server, server)
        elif kind == "server frozen":
            server.freeze()
            heal = server.thaw
        elif kind == "server partitioned":
            self.cluster.partition(server)
            heal = partial(self.cluster.partition, server, cut=False)
        else:
            server.starve(CPUS)
            heal = partial(server.starve, None)
        try:
            self.pause(seconds)
        finally:
            heal()

    def fault(self, fault: Fault, seconds: float) -> None:
        try:
            self.inject(fault, seconds)
        except Exception as exc:
            fault.note += f"; error: {exc}"[:160]
        finally:
            fault.end, fault.seq_at_end = time.time(), self.publisher.last_seq
            with self.lock:
                self.busy.difference_update(fault.target.split("+"))
            self.log(f"end   {fault.kind} {fault.target} ({fault.note})")

    def nemesis(self) -> None:
        """Rounds of one to three overlapping faults, drawn from the seed, until the run stops."""
        assert self.api is not None
        rng = random.Random(self.seed)
        while not self.stopping.is_set():
            plan = []
            for _ in range(rng.randint(1, 3)):
                kind = rng.choice(list(KINDS))
                plan.append((rng.uniform(0, SPREAD), kind, rng.uniform(*KINDS[kind]), rng.random()))
            pause, running = rng.uniform(*PAUSE), []
            for delay, kind, seconds, pick in plan:
                if self.stopping.wait(delay):
                    break
                target = self.pick(kind, pick)
                if target is None:
                    self.log(f"no target for {kind}: every one is under a fault")
                    continue
                fault = Fault(kind, target, time.time(), self.publisher.last_seq)
                self.outcome.faults.append(fault)
                self.log(f"start {kind} {target}" + (f" for {seconds:.0f} s" if seconds else ""))
                running.append(threading.Thread(target=self.fault, args=(fault, seconds), name="fault", daemon=True))
                running[-1].start()
            for thread in running:
                thread.join()
            healthy = wait_healthy(self.api, STREAM, CONSUMERS, 120) and wait_healthy(self.api, TARGET, [], 60)
            if not healthy:
                self.log("WARNING: the cluster did not become healthy within 180 s of the round's end")
            self.stopping.wait(pause)

    def bursts(self) -> None:
        """``BURST`` times the rate for a few seconds now and then, until the run stops."""
        rng = random.Random(f"bursts-{self.seed}")
        while not self.stopping.wait(rng.uniform(*BURST_EVERY)):
            began, seconds = time.time(), rng.uniform(*BURST_SECONDS)
            self.publisher.rate = RATE * BURST
            self.stopping.wait(seconds)
            self.publisher.rate = RATE
            self.outcome.bursts.append((began, time.time()))

    # -- the whole run -----------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        outcome = self.outcome
        self.set_up()
        api = self.api
        assert api is not None
        if not self.wait_for(lambda: all(len(self.committed(n)) >= WARM_BATCHES for n in QUERIES), START_WAIT):
            raise SystemExit(f"FAILED: the chaos queries did not commit {WARM_BATCHES} batches in {START_WAIT:g} s")
        outcome.snapshots.append(self.snapshot())
        began = time.time()
        self.log(f"both queries committed {WARM_BATCHES} batches: the nemesis starts (seed {self.seed})")
        self.threads = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (self.nemesis, self.bursts)]
        for thread in self.threads:
            thread.start()
        self.wait_for(lambda: time.time() - began > self.suite.args.chaos_minutes * 60, float("inf"))
        self.log("the nemesis stops, healing what is under a fault")
        self.stop_nemesis()
        outcome.chaos = (began, time.time())
        self.publisher.stop(drain=60)
        last = api.stream_info(STREAM)["state"]["last_seq"]
        self.log(f"publisher stopped ({self.publisher.published:,} messages, last seq {last:,}); catching up")

        def caught_up() -> bool:
            return all(last_end(self.committed(name)) >= last for name in QUERIES)

        outcome.caught_up = self.wait_for(caught_up, CATCH_UP)
        self.log("both queries committed the stream's last seq" if outcome.caught_up else "the queries fell behind")

        def floors_settled() -> bool:  # a floor moves on the idle query's next trigger
            ends = {group: last_end(self.committed(name)) for name, group in QUERIES.items()}
            outcome.floors = {c: api.consumer_info(STREAM, c)["ack_floor"]["stream_seq"] for c in CONSUMERS}
            return all(floor == ends[c.split("-")[0]] for c, floor in outcome.floors.items())

        self.wait_for(floors_settled, 60)
        outcome.snapshots.append(self.snapshot())
        outcome.stopped = {name: driver.stop() for name, driver in self.drivers.items()}
        outcome.checkpoints = {name: self.committed(name) for name in QUERIES}
        outcome.failures = {name: driver.failures for name, driver in self.drivers.items()}
        outcome.kills = {name: driver.kills for name, driver in self.drivers.items()}
        outcome.record = dict(self.publisher.messages or {})
        outcome.retries = self.publisher.retries
        self.log("drivers stopped; checking the outputs")
        quiet = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={self.work / 'log4j2.properties'}",
                 "spark.ui.showConsoleProgress": "false"}  # fmt: skip
        outcome.exactness, outcome.counts = check_outputs(
            fresh_session(**quiet), ",".join(self.urls), self.work / "out", outcome.record
        )
        return outcome

    def keep_logs(self) -> Path:
        """Copy the run's logs (this run's, the drivers', Spark's, the servers') out of the work dir, which goes."""
        kept = Path(tempfile.mkdtemp(prefix=f"bench-chaos-{self.seed}-"))
        for path in [*self.work.glob("*.log"), *self.work.glob("worker*/app-*/*/std*")]:
            target = kept / path.relative_to(self.work)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        for server in self.cluster.servers:
            if Path(server.dir, "server.log").exists():
                shutil.copy(Path(server.dir, "server.log"), kept / f"{server.name}.log")
        return kept

    def stop_nemesis(self) -> None:
        """Stop the nemesis and the bursts, and wait until every fault is healed."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(HEAL_WAIT)

    def close(self) -> None:
        self.stop_nemesis()  # before the processes end: a fault's heal would start a server, Worker or driver again
        for driver in self.drivers.values():
            driver.stop_file.touch()
            if driver.process is not None:
                kill_tree(driver.process)
        if self.publishing:
            self.publisher.stop(drain=0)
        self.spark.close()
        disconnect(self.options)
        disconnect(self.system)
        self.cluster.close()


# -- the checks ---------------------------------------------------------------------------------------------------


def check_outputs(
    spark: SparkSession, urls: str, parquet: Path, record: dict[int, tuple[str, bytes]]
) -> tuple[list[str], str]:
    """Whether ``CHAOS_OUT`` holds each recorded payload once and nothing else of the stream's twice, and the parquet
    output each recorded seq once with its subject and payload (read in ``spark``, stopped then: the jetstream batch
    read, and the parquet read through the sink's log, which leaves out files of batches that never committed)."""
    try:
        stored = _rows(spark, urls, STREAM, "seq", "subject", "data")
        stream = {row.seq: (row.subject, bytes(row.data)) for row in stored}
        written = Counter(bytes(row.data) for row in _rows(spark, urls, TARGET, "data"))
        rows = spark.read.parquet(str(parquet)).select("seq", "subject", "data").collect()
    finally:
        spark.stop()
    problems = []
    if lost := [seq for seq, message in record.items() if stream.get(seq) != message]:
        problems.append(f"{len(lost)} recorded messages not in the stream as published (e.g. seq {lost[0]})")
    unrecorded = len(stream.keys() - record.keys())  # stored, then the publisher gave up on its PubAck
    payloads = {payload: seq for seq, (_, payload) in stream.items()}
    missing = [seq for seq, (_, payload) in record.items() if written[payload] == 0]
    doubled = [payloads.get(p, -1) for p, n in written.items() if n > 1]
    foreign = sum(n for p, n in written.items() if p not in payloads)
    if missing or doubled or foreign:
        problems.append(f"{TARGET}: {len(missing)} missing (e.g. seq {missing[:5]}), {len(doubled)} doubled "
                        f"(e.g. seq {doubled[:5]}), {foreign} not from the stream")  # fmt: skip
    seqs = Counter(row.seq for row in rows)
    missing = sorted(record.keys() - seqs.keys())
    doubled = sorted(seq for seq, n in seqs.items() if n > 1)
    wrong = sorted(row.seq for row in rows if stream.get(row.seq) != (row.subject, bytes(row.data)))
    if missing or doubled or wrong:
        problems.append(f"parquet: {len(missing)} missing (e.g. seq {missing[:5]}), {len(doubled)} doubled "
                        f"(e.g. seq {doubled[:5]}), {len(wrong)} not as stored (e.g. seq {wrong[:5]})")  # fmt: skip
    counts = (f"{len(record):,} messages recorded, {len(stream):,} in {STREAM} ({unrecorded} stored but not "
              f"recorded), {sum(written.values()):,} in {TARGET}, {len(rows):,} parquet rows")  # fmt: skip
    return problems, counts


def _rows(spark: SparkSession, urls: str, stream: str, *columns: str) -> list[Any]:
    return spark.read.format("jetstream").options(servers=urls, stream=stream).load().select(*columns).collect()


def last_end(commits_: list[tuple[float, int]]) -> int:
    """The end seq of the last committed batch (0: none)."""
    return commits_[-1][1] if commits_ else 0


def majority_down(faults: list[Fault]) -> list[tuple[float, float]]:
    """When two or more servers were out at once (killed, frozen, cut off)."""
    outages = [f for f in faults if f.kind in OUTAGES]
    edges = sorted([(f.start, 1) for f in outages] + [(f.end or f.start, -1) for f in outages])
    windows, out, since = [], 0, 0.0
    for at, step in edges:
        out += step
        if out == 2 and step == 1:
            since = at
        elif out == 1 and step == -1:
            windows.append((since, at))
    return windows


def overlap(a: float, b: float, windows: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for start, end in windows)


def new_rows_after(commits_: list[tuple[float, int]], at: float, seq: int) -> float | None:
    """Seconds from ``at`` to the first commit after it whose batch ends past ``seq`` (None: none)."""
    return next((t - at for t, end in commits_ if t > at and end > seq), None)


def new_row_commits(commits_: list[tuple[float, int]]) -> list[float]:
    """When the batches holding rows (their end past the previous batch's) committed."""
    times, last = [], 0
    for t, end in commits_:
        if end > last:
            times.append(t)
            last = end
    return times


def longest_without_new_rows(times: list[float], began: float, ended: float, down: list[tuple[float, float]]) -> float:
    """The longest time in ``[began, ended]`` between batches with new rows, less any time a majority was down."""
    edges = [max([t for t in times if t <= began], default=began), *(t for t in times if began < t <= ended), ended]
    return max((b - a - overlap(a, b, down) for a, b in itertools.pairwise(edges)), default=0.0)


def report(outcome: Outcome, began: float) -> tuple[bool, float, float]:
    """Print the schedule and the checks; whether the run passed, the worst recovery from a fault's end and the
    median time between batches with new rows before the nemesis started."""
    down = majority_down(outcome.faults)
    start, end = outcome.chaos

    def at(t: float | None) -> str:
        return "-" if t is None else f"{t - began:7.1f}"

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    print(f"\n  chaos from {start - began:.1f} to {end - began:.1f} s; a majority of the servers down: "
          + (", ".join(f"{a - began:.1f}-{b - began:.1f} s" for a, b in down) or "never"))  # fmt: skip
    print("  bursts at " + (", ".join(f"{a - began:.0f}-{b - began:.0f} s" for a, b in outcome.bursts) or "-"))
    print(f"  {'fault':<26}{'target':<18}{'start s':>8}{'end s':>8}  new rows after its end (start) s: a, b   note")
    worst = []
    for f in outcome.faults:
        survived = overlap(f.start, f.end or f.start, down) == 0
        cells = []
        for name in QUERIES:
            after_end = new_rows_after(outcome.checkpoints[name], f.end or f.start, f.seq_at_end)
            after_start = new_rows_after(outcome.checkpoints[name], f.start, f.seq_at_start) if survived else None
            cells.append(f"{secs(after_end)} ({secs(after_start)})")
            if after_end is not None and f.target != f"driver {name}":  # a new driver's start: a Spark app's
                worst.append(after_end)
        print(f"  {f.kind:<26}{f.target:<18}{at(f.start)}{at(f.end)}  {', '.join(cells):<30} {f.note}")
    unhealed = [f for f in outcome.faults if f.end is None]
    gaps = {
        name: longest_without_new_rows(new_row_commits(outcome.checkpoints[name]), start, end, down) for name in QUERIES
    }
    print("  longest time without new rows while a majority was up: "
          + ", ".join(f"{name} {gap:.1f} s" for name, gap in gaps.items()))  # fmt: skip

    unexpected = []
    for name, failures in outcome.failures.items():
        for t, why in failures:
            expected = any(a <= t <= b + MAJORITY_GRACE for a, b in down)
            print(f"  query {name} failed at {t - began:.1f} s{' (a majority was down)' if expected else ''}: {why}")
            if not expected:
                unexpected.append(name)
    failed = sum(map(len, outcome.failures.values()))
    restarts = ", ".join(
        f"{n} {outcome.kills[n] + len(outcome.failures[n])} ({outcome.kills[n]} killed)" for n in QUERIES
    )
    print(f"  failed queries: {failed} ({len(unexpected)} not while a majority was down); query restarts: {restarts}")
    print(f"  publishes retried: {outcome.retries:,}; {outcome.counts}")
    for problem in outcome.exactness:
        print(f"  NOT EXACT: {problem}")

    ends = {group: last_end(outcome.checkpoints[name]) for name, group in QUERIES.items()}
    off = {c: f for c, f in outcome.floors.items() if f != ends[c.split("-")[0]]}
    print(f"  last committed offsets: {', '.join(f'{g} {s:,}' for g, s in ends.items())}; ack floors "
          + ("equal them" if not off and outcome.floors else f"OFF: {off or 'not read'}"))  # fmt: skip

    first, last = outcome.snapshots[0], outcome.snapshots[-1]
    print_snapshots(first, last)
    grown = growth(first, last)
    for item in grown:
        print(f"  GREW: {item}")

    before = [[t for t in new_row_commits(outcome.checkpoints[name]) if t < start] for name in QUERIES]
    warm = [b - a for times in before for a, b in itertools.pairwise(times)]
    passed = (
        not outcome.exactness and not off and bool(outcome.floors) and not unexpected and not grown and not unhealed
        and outcome.caught_up and all(outcome.stopped.values())
    )  # fmt: skip
    problems = [
        *(["not exact"] if outcome.exactness else []),
        *(["ack floors off the checkpoints"] if off or not outcome.floors else []),
        *([f"{len(unexpected)} failed queries"] if unexpected else []),
        *(["growth"] if grown else []),
        *([f"{len(unhealed)} faults not healed"] if unhealed else []),
        *(["the queries did not catch up"] if not outcome.caught_up else []),
        *([f"driver {n} did not stop when told" for n, ok in outcome.stopped.items() if not ok]),
    ]
    print(f"  {'PASS' if passed else 'FAIL: ' + '; '.join(problems)}")
    return passed, max(worst, default=float("nan")), statistics.median(warm) if warm else float("nan")


def timeline(outcome: Outcome, began: float, passed: bool) -> dict[str, Any]:
    """The run over time, seconds from its start (``--json``, for ``bench/charts.py``): each fault's kind, target,
    start and end, and each query's committed batches (commit time, end seq)."""
    return {
        "passed": passed,
        "chaos": [outcome.chaos[0] - began, outcome.chaos[1] - began],
        "faults": [
            {"kind": f.kind, "target": f.target, "start": f.start - began, "end": (f.end or outcome.chaos[1]) - began}
            for f in outcome.faults
        ],
        "committed": {
            name: [[at - began, seq] for at, seq in batches] for name, batches in outcome.checkpoints.items()
        },
    }


def run(suite: Suite) -> None:
    args = suite.args
    heading(
        f"chaos: {args.chaos_minutes:g} min of faults drawn from seed {args.seed} (repeat: --only chaos --seed "
        f"{args.seed} --chaos-minutes {args.chaos_minutes:g}); 3-node cluster, 2 Spark Workers, 2 queries, "
        f"{RATE} msg/s with {BURST}x bursts"
    )
    if os.geteuid() != 0:
        suite.notes.append("chaos left out: it needs root (network namespaces, a cgroup CPU quota)")
        return
    chaos = Chaos(suite)
    kept: Path | None = None
    try:
        outcome = chaos.run()
        passed, worst, baseline = report(outcome, chaos.began)
        suite.results["chaos"] = timeline(outcome, chaos.began, passed)
        if not passed:
            kept = chaos.keep_logs()
    except BaseException:
        kept = chaos.keep_logs()
        raise
    finally:
        chaos.close()
        if kept is not None:
            print(f"  logs kept in {kept}")
        print(f"  chaos took {time.time() - chaos.began:.0f} s in all")
    suite.summary.append(
        Summary(
            "chaos: fault's end to new rows committed, worst, both queries (s)",
            worst,
            baseline,
            "s",
            "exact, floors = checkpoints, no failure, no growth",
            passed,
        )
    )
