"""The benchmark suite: one command that sets up its own server and data and prints one table.

The machines are shared and noisy, so every figure is a ratio against a baseline measured in the
same run, on the same nats-server (``EmbeddedServer``, file store in a temp dir) and the same data.
Each scenario gets a ``local[2]`` SparkSession of its own (stopped at its end, so Python workers
never carry memory from one scenario into the next) and an untimed warm-up query first:

* ``read``: ``--messages`` x 100 B on a 4-partition stream, ``trigger(availableNow=True)`` into
  the ``noop`` sink (``bench/stream_read.py``), by default and with ``ackPolicy=none``, each
  against the raw pull loop draining the same member consumers in 2 processes (explicit-ack or
  AckNone ones), and against the naive PySpark source of ``shared/bench/naive_source.py``
  (nats-py ``fetch()``, one partition) on the same stream; each contender runs once per round,
  ``READ_ROUNDS`` rounds, best kept (the raw loops while the idle Spark session stays up: minutes
  apart, this machine's speed drifts more than an idle JVM costs).
* ``scaling``: the same read with ``members`` 1, 2, 4, 8 on an 8-partition stream
  (``bench/scaling.py``), and the raw pull loop on the 8 member consumers.
* ``latency``: a steady ``--rate`` msg/s for ``--latency-seconds`` into a 4-partition stream while a
  query with the default trigger reads it into ``foreachBatch``; a row's latency is the time after
  ``collect()`` in ``foreachBatch`` minus the publish time carried in its payload. The naive
  source, measured the same way on a stream of its own, is the baseline.
* ``write``: the contenders of ``bench/write.py`` (Spark writer with and without msg ids against a
  raw pipelined publisher doing the same server work), each run ``WRITE_ROUNDS`` times in turn,
  best kept.
* ``memory``: a 1-partition stream read with ``maxMessagesPerTrigger`` ``--messages``/10 and
  ``--messages`` (one task reading everything): the executor Python worker's peak RSS should not
  grow with the batch, since the reader streams Arrow batches of ``recordBatchSize`` rows and each
  pull asks for at most ``pullMaxBytes``.

Peak RSS (VmHWM, reset with ``/proc/<pid>/clear_refs`` when a measurement starts and polled) is
recorded per measurement for this driver process, the Spark JVM and the Python processes under it.
The CPU other processes used meanwhile is printed per measurement: a high share means the figure
is noisy.

Run it from the repository root (``--quick``: a smoke run of a few minutes)::

    python bench/run.py
    python bench/run.py --quick --only read,latency
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import first_batch
from pull_reader import STREAM, SUBJECTS, messages, server_version
from scaling import Cpu, CpuWatch, Measured, mapping_text, measure, print_spark_table
from stream_read import (
    PARALLEL,
    WARMUP_STREAM,
    SparkRun,
    create_stream,
    descendants,
    jvm_pid,
    publish,
    run_baseline_parallel,
    run_spark,
    warmup_messages,
)
from write import STREAM as WRITE_STREAM
from write import SUBJECTS as WRITE_SUBJECTS
from write import Run as WriteRun
from write import raw_publish, timed, warmup_rows, writer_ids

from spark_jetstream.connection import Connection, ConnectionOptions, close_all, connect
from spark_jetstream.demo import QUIET_LOG4J
from spark_jetstream.embedded import EmbeddedServer
from spark_jetstream.jsapi import JetStreamApi
from spark_jetstream.publish import Message, publish_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCENARIOS = ("read", "scaling", "latency", "write", "memory", "first-batch")
FIRST_BATCH_MESSAGES = 100_000
FIRST_BATCH_TARGET = 1.3  # load() plus the first batch, against a Python source that does no I/O
NAIVE_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench"
NAIVE_FORMAT = "naive-jetstream"
READ_PARTITIONS = 4
SCALING_PARTITIONS = 8
SCALING_MEMBERS = (1, 2, 4, 8)
WARMUP_MESSAGES = 10_000
SIZE = 100
WRITE_WINDOW = 4000
WRITE_TASKS = 2
WRITE_ROUNDS = 2
"""Every write contender runs this many times in turn and keeps its best (writes take seconds, and
one slow run on this shared machine moved a ratio by 0.15)."""
READ_ROUNDS = 3
"""Rounds of the read contenders, each contender once per round, best kept: the connector's
1,000,000-row read took 18.6-26.6 s in the rounds of one hour on this machine, the naive source
66-106 s."""

RAW_TARGET = 0.8
NAIVE_TARGETS = (4.0, 5.0)
"""Read vs the naive source: by default, and with ``ackPolicy=none`` (the issue's 5x for an ack-none mode)."""
LATENCY_P50_TARGET = 1.0
LATENCY_P99_TARGET = 2.0
WRITE_TARGET = 0.8
MEMORY_TARGET = 1.2
"""Worker peak RSS at 10x the batch at most this many times the smaller batch's: bounded, not growing with it."""

POLL = 0.2
"""Seconds between polls of the processes' peak RSS."""
TICK = 0.01
"""Seconds between the latency publisher's sends."""
PRIMING = 200
"""Messages published and read before the latency measurement starts (not measured)."""
STAMP = struct.Struct("<dc")
"""Latency payloads start with the publish time (``time.time()``) and a marker: P priming, M measured."""


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """One line of the final table: the connector's figure against a baseline of the same run."""

    scenario: str
    connector: float
    baseline: float
    unit: str
    target: str = "-"
    met: bool | None = None

    @property
    def ratio(self) -> float:
        return self.connector / self.baseline if self.baseline else float("nan")


@dataclass
class Peaks:
    """Peak RSS in KiB during one measurement, by process."""

    label: str
    driver_kb: int = 0
    jvm_kb: int = 0
    processes: dict[int, tuple[str, int]] = field(default_factory=dict)
    """pid -> (kind, peak KiB) for the Python processes under the JVM."""
    started_kb: dict[int, int] = field(default_factory=dict)
    """pid -> RSS when the measurement started, for the processes alive then (e.g. warm reused workers)."""

    def kind(self, kind: str) -> list[int]:
        return [kb for name, kb in self.processes.values() if name == kind]

    def growth(self, kind: str) -> int | None:
        """The largest peak above its RSS at the start among the ``kind`` processes alive at the start."""
        started = self.started_kb
        grown = [kb - started[pid] for pid, (name, kb) in self.processes.items() if name == kind and pid in started]
        return max(grown) if grown else None


@dataclass
class Suite:
    """What the scenarios share: the server, a connection, sizes, and what they report."""

    args: argparse.Namespace
    url: str
    address: tuple[str, int]
    conn: Connection
    work: str
    summary: list[Summary] = field(default_factory=list)
    peaks: list[Peaks] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def api(self) -> JetStreamApi:
        return JetStreamApi(self.conn)

    def checkpoint(self, name: str) -> str:
        return os.path.join(self.work, "checkpoints", name)

    def fresh_stream(self, name: str, subject: str, partitions: int) -> None:
        if name in self.api.stream_names():
            self.api.delete_stream(name)
        create_stream(self.conn, name, subject, partitions, self.args.storage)


# -- memory ------------------------------------------------------------------------------------


def status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def reset_peak(pid: int) -> None:
    """Reset VmHWM to the current RSS, so it measures from now (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def python_kinds(jvm: int) -> dict[int, str]:
    """The Python processes under the JVM by kind: ``worker`` (runs the tasks: forked by the daemon of
    ``pyspark.worker``), ``source runner`` (the driver side of a streaming Python source), ``planner``
    (forked by the daemons of the data source planning modules), ``daemon`` or ``other``."""
    kinds: dict[int, str] = {}
    for pid in descendants(jvm):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                args = cmdline.read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue
        if "pyspark.daemon" in args:  # python -m pyspark.daemon <module>; forked children keep the command line
            module = args[-1] if args[-1] else args[-2]
            if parent == jvm:
                kinds[pid] = "daemon"
            else:
                kinds[pid] = "worker" if module == "pyspark.worker" else "planner"
        elif any(arg.endswith("python_streaming_source_runner") for arg in args):
            kinds[pid] = "source runner"
        else:
            kinds[pid] = "other"
    return kinds


class MemoryWatch:
    """Peak RSS of this process, the Spark JVM and the Python processes under it, from now to ``stop()``.

    Peaks are reset at the start and polled every ``POLL`` s, so a process that ends meanwhile
    counts with its last seen peak."""

    def __init__(self, label: str, spark: SparkSession | None) -> None:
        self.peaks = Peaks(label)
        self.jvm = jvm_pid(spark) if spark is not None else None
        for pid in [os.getpid(), *([self.jvm, *descendants(self.jvm)] if self.jvm else [])]:
            reset_peak(pid)
            self.peaks.started_kb[pid] = status_kb(pid, "VmRSS:")
        self._done = threading.Event()
        self._poller = threading.Thread(target=self._run, name="memory-watch", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        peaks = self.peaks
        peaks.driver_kb = max(peaks.driver_kb, status_kb(os.getpid(), "VmHWM:"))
        if self.jvm is None:
            return
        peaks.jvm_kb = max(peaks.jvm_kb, status_kb(self.jvm, "VmHWM:"))
        for pid, kind in python_kinds(self.jvm).items():
            kb = status_kb(pid, "VmHWM:")
            if kb:
                peaks.processes[pid] = (kind, max(kb, peaks.processes.get(pid, (kind, 0))[1]))

    def _run(self) -> None:
        while not self._done.wait(POLL):
            self._poll()

    def stop(self) -> Peaks:
        self._done.set()
        self._poller.join()
        self._poll()
        return self.peaks


class Measurement:
    """CPU and memory watched around one measured run."""

    def __init__(self, suite: Suite, label: str, spark: SparkSession | None) -> None:
        self.suite, self.label = suite, label
        self.memory = MemoryWatch(label, spark)
        self.cpu_watch = CpuWatch()
        self.cpu: Cpu | None = None

    def stop(self) -> Cpu:
        self.cpu = self.cpu_watch.stop()
        peaks = self.memory.stop()
        if self.memory.jvm is not None:  # only Spark measurements: the baselines' processes are not watched
            self.suite.peaks.append(peaks)
        return self.cpu


# -- spark -------------------------------------------------------------------------------------


def start_session(suite: Suite, scenario: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A ``local[2]`` session for one scenario, with an untimed warm-up query (JVM, Python workers)."""
    from pyspark.sql import SparkSession

    log_config = Path(suite.work, "log4j2.properties")
    log_config.write_text(QUIET_LOG4J)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"bench suite: {scenario}")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000000")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    began = time.perf_counter()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    started = time.perf_counter() - began
    warm = run_spark(spark, suite.url, WARMUP_STREAM, f"warm-{scenario}", suite.checkpoint(f"warm-{scenario}"), None)
    if warm.messages != WARMUP_MESSAGES:
        raise SystemExit(f"FAILED: the {scenario} warm-up query read {warm.messages:,} of {WARMUP_MESSAGES:,}")
    print(f"  SparkSession {started:.1f} s, warm-up query {warm.seconds:.1f} s (neither measured)", flush=True)
    return spark


def available_now(spark: SparkSession, frame_source: str, options: dict[str, str], checkpoint: str) -> SparkRun:
    """``run_spark`` for any source format: one ``availableNow`` query into ``noop``, rows from its progress."""
    reader = spark.readStream.format(frame_source)
    for key, value in options.items():
        reader = reader.option(key, value)
    query_builder = reader.load().writeStream.format("noop").trigger(availableNow=True)
    began = time.perf_counter()
    query = query_builder.option("checkpointLocation", checkpoint).start()
    try:
        query.awaitTermination()
    except Exception as exc:
        raise SystemExit(f"FAILED: the {frame_source} query failed:\n{exc}") from None
    seconds = time.perf_counter() - began
    progress = sorted((dict(p) for p in query.recentProgress), key=lambda p: p["batchId"])
    return SparkRun(sum(p["numInputRows"] or 0 for p in progress), seconds, progress)


def register_naive(spark: SparkSession, naive_dir: Path) -> None:
    """Register the naive source from its own directory; the workers find it on their PYTHONPATH
    (``spark.executorEnv.PYTHONPATH``, set when the session was built)."""
    if str(naive_dir) not in sys.path:
        sys.path.insert(0, str(naive_dir))
    import naive_source  # type: ignore[import-not-found]

    naive_source.register(spark)


# -- output ------------------------------------------------------------------------------------


def heading(title: str) -> None:
    load = os.getloadavg()
    print(f"\n== {title} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds else 0.0


def print_rows(rows: Sequence[tuple[str, int, float, int | None, Cpu | None]]) -> None:
    """contender, messages, seconds, batches, CPU."""
    width = max(34, *(len(row[0]) for row in rows))
    print(f"  {'contender':<{width}} {'messages':>10} {'batches':>7} {'seconds':>8} {'rows/s':>9} {'other CPU':>9}")
    for name, count, seconds, batches, cpu in rows:
        other = f"{cpu.other_share:.0%}" if cpu else "-"
        print(
            f"  {name:<{width}} {count:>10,} {'-' if batches is None else batches:>7} {seconds:>8.2f} "
            f"{rate(count, seconds):>9,.0f} {other:>9}"
        )


def mb(kb: int | float) -> str:
    return f"{kb / 1024:,.0f}" if kb else "-"


def print_peaks(peaks: list[Peaks]) -> None:
    print(
        f"| {'measurement':<40} | driver Python MB | Spark JVM MB | Python workers: n, max MB, sum MB "
        "| worker growth MB | source runner MB |"
    )
    print(f"|{'-' * 42}|---:|---:|---:|---:|---:|")
    for p in peaks:
        workers = p.kind("worker")
        runners = p.kind("source runner")
        work = f"{len(workers)}, {mb(max(workers))}, {mb(sum(workers))}" if workers else "-"
        growth = p.growth("worker")
        print(
            f"| {p.label:<40} | {mb(p.driver_kb)} | {mb(p.jvm_kb)} | {work} | "
            f"{'-' if growth is None else f'{growth / 1024:+,.0f}'} | {mb(max(runners)) if runners else '-'} |"
        )


def figure(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "MB":
        return f"{value / 1024:,.0f} MB"
    return f"{value:,.0f} {unit}"


def print_summary(summary: list[Summary]) -> None:
    print("| scenario | connector | baseline | ratio | target | met? |")
    print("|---|---:|---:|---:|---|---|")
    for s in summary:
        met = "-" if s.met is None else ("yes" if s.met else "**no**")
        print(
            f"| {s.scenario} | {figure(s.connector, s.unit)} | {figure(s.baseline, s.unit)} | {s.ratio:.2f} "
            f"| {s.target} | {met} |"
        )


# -- scenarios ---------------------------------------------------------------------------------


def scenario_read(suite: Suite) -> None:
    args = suite.args
    heading(f"read: {args.messages:,} x {SIZE} B, {READ_PARTITIONS} partitions, availableNow into noop")
    suite.fresh_stream(STREAM, "ev.*", READ_PARTITIONS)
    took = publish(suite.conn, "read", messages(args.messages, SIZE), args.messages)
    print(f"  published in {took:.1f} s", flush=True)
    naive = args.naive_dir if (args.naive_dir / "naive_source.py").is_file() else None
    conf = {"spark.executorEnv.PYTHONPATH": str(naive)} if naive else {}
    spark = start_session(suite, "read", conf)
    best: dict[str, tuple[int, float, int | None, Cpu]] = {}  # contender -> its fastest round

    def keep(name: str, round_: int, count: int, seconds: float, batches: int | None, cpu: Cpu) -> None:
        print(f"  round {round_}, {name}: {rate(count, seconds):,.0f} rows/s", flush=True)
        if name not in best or seconds < best[name][1]:
            best[name] = (count, seconds, batches, cpu)

    naive_name = "spark naive source (nats-py fetch)"
    # contender -> (group, extra source options, the raw pull loop on the same member consumers)
    connectors = {
        "spark jetstream": ("bench", {}, f"raw pull loop ({PARALLEL} processes)"),
        "spark jetstream, ackPolicy=none": (
            "bench-none",
            {"ackPolicy": "none"},
            f"raw pull loop, AckNone consumers ({PARALLEL} processes)",
        ),
    }
    try:
        if naive is not None:
            register_naive(spark, naive)
            options = {"servers": suite.url, "stream": WARMUP_STREAM}
            available_now(spark, NAIVE_FORMAT, options, suite.checkpoint("naive-warm"))  # warms nats-py imports
        else:
            suite.notes.append(f"read: no naive source at {args.naive_dir}: that comparison was skipped")
        for round_ in range(1, READ_ROUNDS + 1):  # every contender once per round: the machine's speed drifts
            for name, (group, extra, _) in connectors.items():
                watch = Measurement(suite, f"read: {name}, round {round_}", spark)
                group = group if round_ == 1 else f"{group}-r{round_}"  # new member consumers each round
                run = run_spark(spark, suite.url, STREAM, group, suite.checkpoint(f"{group}-{round_}"), None, extra)
                cpu = watch.stop()
                if run.messages != args.messages:
                    raise SystemExit(f"FAILED: {name} read {run.messages:,} of {args.messages:,}")
                keep(name, round_, run.messages, run.seconds, run.batches, cpu)
            if naive is not None:
                watch = Measurement(suite, f"read: naive source, round {round_}", spark)
                options = {"servers": suite.url, "stream": STREAM}
                nrun = available_now(spark, NAIVE_FORMAT, options, suite.checkpoint(f"naive-{round_}"))
                cpu = watch.stop()
                if nrun.messages != args.messages:
                    raise SystemExit(f"FAILED: the naive source read {nrun.messages:,} of {args.messages:,}")
                keep(naive_name, round_, nrun.messages, nrun.seconds, nrun.batches, cpu)
            for group, _, raw_name in connectors.values():  # Spark stays up, idle
                watch = Measurement(suite, f"read: {raw_name}, round {round_}", spark)
                consumers = [f"{group}-{p}" for p in range(READ_PARTITIONS)]  # made by the round-1 query
                seconds, count = run_baseline_parallel(suite.conn, suite.address, consumers, args.messages)
                cpu = watch.stop()
                if count != args.messages:
                    raise SystemExit(f"FAILED: the {raw_name} read {count:,} of {args.messages:,}")
                keep(raw_name, round_, count, seconds, None, cpu)
    finally:
        spark.stop()
    print_rows([(name, *figures) for name, figures in best.items()])
    naive_rate = rate(*best[naive_name][:2]) if naive_name in best else None
    for (name, (_, extra, raw_name)), naive_target in zip(connectors.items(), NAIVE_TARGETS, strict=True):
        connector, raw = rate(*best[name][:2]), rate(*best[raw_name][:2])
        mode = "read" + "".join(f" {key}={value}" for key, value in extra.items())
        suite.summary.append(
            Summary(
                f"{mode}: connector vs raw pull (rows/s)",
                connector,
                raw,
                "rows/s",
                f">= {RAW_TARGET:g}x",
                connector / raw >= RAW_TARGET,
            )
        )
        if naive_rate is not None:
            suite.summary.append(
                Summary(
                    f"{mode}: connector vs naive source (rows/s)",
                    connector,
                    naive_rate,
                    "rows/s",
                    f">= {naive_target:g}x",
                    connector / naive_rate >= naive_target,
                )
            )
    suite.api.delete_stream(STREAM)


def scenario_scaling(suite: Suite) -> None:
    args = suite.args
    heading(f"scaling: members {SCALING_MEMBERS} on {SCALING_PARTITIONS} partitions, {args.messages:,} x {SIZE} B")
    suite.fresh_stream(STREAM, "ev.*", SCALING_PARTITIONS)
    took = publish(suite.conn, "scaling", messages(args.messages, SIZE), args.messages)
    print(f"  published in {took:.1f} s", flush=True)
    for members in SCALING_MEMBERS:
        print(f"  {members} members, member:partitions {mapping_text(members, SCALING_PARTITIONS)}")
    spark: SparkSession | None = start_session(suite, "scaling")
    best: dict[int, Measured] = {}
    try:
        assert spark is not None
        for members in SCALING_MEMBERS:
            watch = Measurement(suite, f"scaling: {members} members", spark)
            group = f"scale{members}"
            best[members] = measure(spark, suite.url, members, group, suite.checkpoint("scaling"), args.messages)
            watch.stop()
            print(f"  {members} members: {best[members].rate:,.0f} rows/s", flush=True)
        spark.stop()
        spark = None
        most = max(SCALING_MEMBERS)
        consumers = [f"scale{most}-{m}" for m in range(most)]
        watch = Measurement(suite, "scaling: raw pull baseline", None)
        seconds, count = run_baseline_parallel(suite.conn, suite.address, consumers, args.messages)
        cpu = watch.stop()
        if count != args.messages:
            raise SystemExit(f"FAILED: the raw pull baseline read {count:,} of {args.messages:,}")
    finally:
        if spark is not None:
            spark.stop()
    print_spark_table(best, list(best.values()))
    print_rows([(f"raw pull loop, {most} consumers, {PARALLEL} processes", count, seconds, None, cpu)])
    fewest = min(SCALING_MEMBERS)
    suite.summary.append(
        Summary(f"scaling: {most} vs {fewest} member(s) (rows/s)", best[most].rate, best[fewest].rate, "rows/s")
    )
    suite.summary.append(
        Summary(f"scaling: {most} members vs raw pull (rows/s)", best[most].rate, rate(count, seconds), "rows/s")
    )
    suite.api.delete_stream(STREAM)


@dataclass
class LatencyRun:
    """What the ``foreachBatch`` sink saw: per measured row, seconds from publish to sink and to the store."""

    contender: str
    to_sink: list[float] = field(default_factory=list)
    to_store: list[float] = field(default_factory=list)
    primed: int = 0
    batches: int = 0
    first_publish: float = 0.0
    last_publish: float = 0.0
    last_sink: float = 0.0
    progress: list[dict[str, Any]] = field(default_factory=list)

    def sink(self, rows: list[Any]) -> None:
        now = time.time()
        measured = 0
        for data, stored_us in rows:
            published, mark = STAMP.unpack_from(data)
            if mark == b"P":
                self.primed += 1
                continue
            self.to_sink.append(now - published)
            self.to_store.append(stored_us / 1e6 - published)
            measured += 1
        if measured:
            self.batches += 1
            self.last_sink = now

    def percentile(self, q: float) -> float:
        ordered = sorted(self.to_sink)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def rows_per_s(self) -> float:
        """Rows into the sink per second, from the first publish to the last row's arrival."""
        return rate(len(self.to_sink), self.last_sink - self.first_publish)

    @property
    def published_per_s(self) -> float:
        return rate(len(self.to_sink), self.last_publish - self.first_publish)


class SteadyPublisher(threading.Thread):
    """Publishes ``count`` messages at ``rate`` msg/s, each payload starting with its publish time."""

    def __init__(self, conn: Connection, prefix: str, rate: int, count: int, mark: bytes = b"M") -> None:
        super().__init__(name="steady-publisher", daemon=True)
        self.conn, self.prefix, self.rate, self.count, self.mark = conn, prefix, rate, count, mark
        self.sent = 0
        self.began = self.ended = 0.0
        self.error: BaseException | None = None
        self.padding = os.urandom(max(0, SIZE - STAMP.size))

    def batch(self, first: int, end: int) -> Iterator[Message]:
        for i in range(first, end):  # runs on the connection's loop thread, right before the send
            yield f"{self.prefix}.k{i % SUBJECTS}", STAMP.pack(time.time(), self.mark) + self.padding, None

    def run(self) -> None:
        try:
            self.began = time.time()
            start = time.monotonic()
            while self.sent < self.count:
                due = min(self.count, int((time.monotonic() - start) * self.rate) + 1)
                if due > self.sent:
                    stored = publish_all(self.conn, self.batch(self.sent, due)).count
                    if stored != due - self.sent:
                        raise RuntimeError(f"stored {stored} of {due - self.sent} messages")
                    self.sent = due
                time.sleep(TICK)
            self.ended = time.time()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def measure_latency(
    suite: Suite, spark: SparkSession, contender: str, source: str, options: dict[str, str], stream: str, prefix: str
) -> LatencyRun:
    """Run a default-trigger query into ``foreachBatch`` while publishing steadily; latencies per row."""
    from pyspark.sql import functions as F

    args = suite.args
    result = LatencyRun(contender)
    lock = threading.Lock()

    def sink(frame: Any, batch_id: int) -> None:
        rows = frame.select("data", F.unix_micros("timestamp")).collect()
        with lock:
            result.sink(rows)

    reader = spark.readStream.format(source)
    for key, value in options.items():
        reader = reader.option(key, value)
    checkpoint = suite.checkpoint(f"latency-{stream}")
    query = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
    try:
        priming = SteadyPublisher(suite.conn, prefix, 1000, PRIMING, b"P")
        priming.run()
        deadline = time.monotonic() + 120
        while result.primed < PRIMING:  # workers and callback server busy once before measuring
            if query.exception() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: {contender}: priming rows not read ({query.exception()})")
            time.sleep(0.05)
        count = int(args.rate * args.latency_seconds)
        last = query.lastProgress
        first_batch = last["batchId"] + 1 if last else 0  # the measured batches' progress only
        watch = Measurement(suite, f"latency: {contender}", spark)
        publisher = SteadyPublisher(suite.conn, prefix, args.rate, count)
        publisher.start()
        publisher.join()
        if publisher.error is not None:
            raise SystemExit(f"FAILED: the latency publisher failed: {publisher.error}")
        result.first_publish, result.last_publish = publisher.began, publisher.ended
        deadline = time.monotonic() + 60
        while len(result.to_sink) < count:
            if query.exception() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: {contender} read {len(result.to_sink):,} of {count:,} ({query.exception()})")
            time.sleep(0.05)
        cpu = watch.stop()
        result.progress = [dict(p) for p in query.recentProgress if p["batchId"] >= first_batch]
    finally:
        query.stop()
    if len(result.to_sink) != count:
        raise SystemExit(f"FAILED: {contender} read {len(result.to_sink):,} rows, {count:,} were published")
    print(f"  {contender}: {count:,} rows, other CPU {cpu.other_share:.0%}", flush=True)
    return result


def print_latency(runs: list[LatencyRun]) -> None:
    print(
        f"  {'contender':<26} {'rows':>8} {'rows/s':>7} {'batches':>7} {'p50 s':>6} {'p90 s':>6} {'p99 s':>6} "
        f"{'max s':>6} {'stored p50 ms':>13} {'published/s':>11}"
    )
    for r in runs:
        stored = statistics.median(r.to_store) * 1000 if r.to_store else float("nan")
        print(
            f"  {r.contender:<26} {len(r.to_sink):>8,} {r.rows_per_s:>7,.0f} {r.batches:>7} {r.percentile(0.5):>6.2f} "
            f"{r.percentile(0.9):>6.2f} {r.percentile(0.99):>6.2f} {max(r.to_sink):>6.2f} {stored:>13.1f} "
            f"{r.published_per_s:>11,.0f}"
        )


LATENCY_DURATIONS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


def print_latency_durations(runs: list[LatencyRun]) -> None:
    """Where a micro-batch's time goes: mean ``durationMs`` over the batches that had rows."""
    print("\n  mean durationMs of the batches with rows:")
    print(f"  {'contender':<26} {'batches':>7} {'trigger':>8} " + " ".join(f"{key:>13}" for key in LATENCY_DURATIONS))
    for r in runs:
        active = [p for p in r.progress if (p.get("numInputRows") or 0) > 0]
        if not active:
            continue
        means = {
            key: statistics.fmean(p["durationMs"].get(key, 0) for p in active)
            for key in ("triggerExecution", *LATENCY_DURATIONS)
        }
        print(
            f"  {r.contender:<26} {len(active):>7} {means['triggerExecution']:>8,.0f} "
            + " ".join(f"{means[key]:>13,.0f}" for key in LATENCY_DURATIONS)
        )


def scenario_latency(suite: Suite) -> None:
    args = suite.args
    heading(
        f"latency: {args.rate:,} msg/s for {args.latency_seconds:g} s, {READ_PARTITIONS} partitions, "
        "default trigger into foreachBatch"
    )
    suite.fresh_stream("LAT", "lat.*", READ_PARTITIONS)
    naive = args.naive_dir if (args.naive_dir / "naive_source.py").is_file() else None
    if naive is not None:
        suite.fresh_stream("LATNAIVE", "latn.*", READ_PARTITIONS)
    conf = {"spark.executorEnv.PYTHONPATH": str(naive)} if naive else {}
    spark = start_session(suite, "latency", conf)
    runs: list[LatencyRun] = []
    try:
        options = {"servers": suite.url, "stream": "LAT", "group": "latency"}
        runs.append(measure_latency(suite, spark, "spark jetstream", "jetstream", options, "LAT", "lat"))
        if naive is not None:
            register_naive(spark, naive)
            options = {"servers": suite.url, "stream": "LATNAIVE"}
            runs.append(measure_latency(suite, spark, "naive source", NAIVE_FORMAT, options, "LATNAIVE", "latn"))
    finally:
        spark.stop()
    print_latency(runs)
    print_latency_durations(runs)
    connector = runs[0]
    base = runs[1] if len(runs) > 1 else None
    for name, q, target in (("p50", 0.5, LATENCY_P50_TARGET), ("p99", 0.99, LATENCY_P99_TARGET)):
        value = connector.percentile(q)
        suite.summary.append(
            Summary(
                f"latency {name}, publish to foreachBatch (vs naive)",
                value,
                base.percentile(q) if base else float("nan"),
                "s",
                f"< {target:g} s",
                value < target,
            )
        )
    suite.api.delete_stream("LAT")
    if naive is not None:
        suite.api.delete_stream("LATNAIVE")


def scenario_write(suite: Suite) -> None:
    args = suite.args
    n = args.messages
    heading(f"write: {n:,} x {SIZE} B, window {WRITE_WINDOW}, {WRITE_TASKS} Spark tasks (bench/write.py)")
    spark = start_session(suite, "write")
    # nats-server was started from a helper thread with a preexec_fn, which closes py4j's connection
    # of this thread: give the new JVM thread the active session back (see bench/write.py).
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[attr-defined]
    api, storage, address = suite.api, args.storage, suite.address
    runs: dict[str, tuple[WriteRun, Cpu]] = {}
    try:
        from pyspark.sql import functions as F

        def spark_write(count: int, **options: str) -> Callable[[], None]:
            def work() -> None:
                frame = spark.range(0, count, 1, WRITE_TASKS).select(
                    F.concat(F.lit("bench.k"), (F.col("id") % WRITE_SUBJECTS).cast("string")).alias("subject"),
                    F.lpad(F.col("id").cast("string"), SIZE, "x").alias("data"),
                )
                writer = frame.write.format("jetstream").option("servers", suite.url)
                writer.option("publishWindow", str(WRITE_WINDOW)).options(**options).mode("append").save()

            return work

        warm = warmup_rows(n)
        timed(suite.conn, api, storage, "warm-up", warm, spark_write(warm))
        payload = os.urandom(SIZE)
        contenders: list[tuple[str, Callable[[], object]]] = [
            ("raw", lambda: raw_publish(address, n, SIZE, WRITE_WINDOW, None)),
            ("raw+ids", lambda: raw_publish(address, n, SIZE, WRITE_WINDOW, writer_ids())),
            (
                "publish_all",
                lambda: publish_all(
                    suite.conn, ((f"bench.k{i % WRITE_SUBJECTS}", payload, None) for i in range(n)), WRITE_WINDOW
                ),
            ),
            ("spark", spark_write(n)),
            ("spark-noids", spark_write(n, deduplicate="false")),
        ]
        for round_ in range(1, WRITE_ROUNDS + 1):
            for name, work in contenders:
                driver = spark if name.startswith("spark") else None
                watch = Measurement(suite, f"write: {name}, round {round_}", driver)
                run = timed(suite.conn, api, storage, name, n, work)  # type: ignore[arg-type]
                cpu = watch.stop()
                print(f"  round {round_}, {name}: {run.rate:,.0f} msgs/s", flush=True)
                if name not in runs or run.rate > runs[name][0].rate:
                    runs[name] = (run, cpu)
    finally:
        spark.stop()
        if WRITE_STREAM in api.stream_names():
            api.delete_stream(WRITE_STREAM)
    print_rows([(name, run.messages, run.seconds, None, cpu) for name, (run, cpu) in runs.items()])
    for connector, baseline, what in (
        ("spark", "raw+ids", "write exactly-once: spark vs raw+ids (msgs/s)"),
        ("spark-noids", "raw", "write no ids: spark-noids vs raw (msgs/s)"),
    ):
        mine, theirs = runs[connector][0].rate, runs[baseline][0].rate
        suite.summary.append(
            Summary(what, mine, theirs, "msgs/s", f">= {WRITE_TARGET:g}x", mine / theirs >= WRITE_TARGET)
        )


def scenario_memory(suite: Suite) -> None:
    args = suite.args
    n = args.messages
    small = max(1, n // 10)
    heading(f"memory: {n:,} x {SIZE} B on 1 partition, maxMessagesPerTrigger {small:,} vs {n:,}")
    suite.fresh_stream("MEM", "mem.*", 1)
    payload = os.urandom(SIZE)
    publish(suite.conn, "memory", ((f"mem.k{i % SUBJECTS}", payload, None) for i in range(n)), n)
    worker_peaks: dict[int, int] = {}
    growth: dict[int, int] = {}
    rows: list[tuple[str, int, float, int | None, Cpu | None]] = []
    for limit in (small, n):
        spark = start_session(suite, f"memory{limit}")  # fresh workers: no memory carried over
        try:
            label = f"memory: maxMessagesPerTrigger {limit:,}"
            watch = Measurement(suite, label, spark)
            run = run_spark(spark, suite.url, "MEM", f"mem{limit}", suite.checkpoint(f"mem{limit}"), limit)
            cpu = watch.stop()
        finally:
            spark.stop()
        if run.messages != n:
            raise SystemExit(f"FAILED: the memory read with batches of {limit:,} read {run.messages:,} of {n:,}")
        rows.append((f"maxMessagesPerTrigger {limit:,}", run.messages, run.seconds, run.batches, cpu))
        workers = suite.peaks[-1].kind("worker")
        worker_peaks[limit] = max(workers) if workers else 0
        growth[limit] = suite.peaks[-1].growth("worker") or 0
    print_rows(rows)
    for limit, kb in worker_peaks.items():
        print(
            f"  batches of {limit:>9,}: Python worker peak RSS {mb(kb)} MB, "
            f"{growth[limit] / 1024:+,.0f} MB over the warm worker's RSS at the start"
        )
    suite.summary.append(
        Summary(
            f"memory: worker peak RSS, batch {n:,} vs {small:,}",
            worker_peaks[n] * 1.0,
            worker_peaks[small] * 1.0,
            "MB",
            f"<= {MEMORY_TARGET:g}x",
            worker_peaks[n] <= MEMORY_TARGET * worker_peaks[small],
        )
    )
    suite.api.delete_stream("MEM")


def scenario_first_batch(suite: Suite) -> None:
    """Time to the first batch in a fresh process (bench/first_batch.py), 100,000 messages waiting:
    the connector against a Python source that does no I/O (every Python source's floor) and Spark's
    ``rate`` source, three interleaved rounds, medians."""
    heading(f"first batch: load() + first batch in a fresh process, {FIRST_BATCH_MESSAGES:,} messages waiting")
    suite.fresh_stream("FIRST", "first.*", 4)
    payload, count = b"x" * SIZE, FIRST_BATCH_MESSAGES
    publish(suite.conn, "first-batch", ((f"first.k{i % SUBJECTS}", payload, None) for i in range(count)), count)
    runs = first_batch.measure(suite.url, "FIRST", FIRST_BATCH_MESSAGES, rounds=3, log=False)
    first_batch.print_table(runs)
    connector, floor = first_batch.together(runs["jetstream"]), first_batch.together(runs["python-noio"])
    suite.summary.append(
        Summary(
            "first batch: connector vs no-I/O Python source (s)",
            connector,
            floor,
            "s",
            f"<= {FIRST_BATCH_TARGET:g}x",
            connector / floor <= FIRST_BATCH_TARGET,
        )
    )
    suite.api.delete_stream("FIRST")


RUNNERS: dict[str, Callable[[Suite], None]] = {
    "read": scenario_read,
    "scaling": scenario_scaling,
    "latency": scenario_latency,
    "write": scenario_write,
    "memory": scenario_memory,
    "first-batch": scenario_first_batch,
}


def stop_jvm() -> None:
    """End the Spark JVM and wait for it: it exits when its stdin pipe from this process closes,
    which would otherwise happen only as this process exits, leaving it running a moment longer."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None or proc.stdin is None:
        return
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except Exception:
        print(f"WARNING: the Spark JVM (pid {proc.pid}) did not exit within 30 s")


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smoke-run sizes: 100,000 messages, 15 s of latency")
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios of {SCENARIOS}")
    parser.add_argument("--messages", type=int, default=None, help="messages per scenario (1,000,000; quick 100,000)")
    parser.add_argument("--latency-seconds", type=float, default=None, help="publishing time of the latency run")
    parser.add_argument("--rate", type=int, default=5000, help="msg/s published during the latency run")
    parser.add_argument("--storage", choices=("file", "memory"), default="file", help="storage of every stream")
    parser.add_argument("--naive-dir", type=Path, default=NAIVE_DIR, help="directory holding naive_source.py")
    args = parser.parse_args(argv)
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.latency_seconds = args.latency_seconds or (15.0 if args.quick else 60.0)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.only if s not in SCENARIOS]
    if unknown or not args.only:
        parser.error(f"--only takes scenarios of {', '.join(SCENARIOS)}; unknown: {', '.join(unknown)}")
    if args.messages < 10 or args.rate < 1 or args.latency_seconds <= 0:
        parser.error("--messages must be at least 10, --rate and --latency-seconds positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = tempfile.mkdtemp(prefix="bench-suite-")
    began = time.perf_counter()
    try:
        os.makedirs(os.path.join(work, "nats"))
        with EmbeddedServer(name="bench", store_dir=os.path.join(work, "nats")) as server:
            address = ("127.0.0.1", server.port)
            conn = connect(ConnectionOptions(servers=(server.url,)))
            suite = Suite(args, server.url, address, conn, work)
            try:
                import pyspark

                print(
                    f"nats-server {server_version(address)}, PySpark {pyspark.__version__}, {os.cpu_count()} cores, "
                    f"Python {platform.python_version()}; {args.messages:,} messages, {args.storage} storage; "
                    f"scenarios {', '.join(args.only)}"
                )
                create_stream(conn, WARMUP_STREAM, "warm.*", READ_PARTITIONS, args.storage)
                publish(conn, "warm-up", warmup_messages(WARMUP_MESSAGES, SIZE), WARMUP_MESSAGES)
                loads = [os.getloadavg()[0]]
                for name in args.only:
                    RUNNERS[name](suite)
                    loads.append(os.getloadavg()[0])
            finally:
                close_all()
    finally:
        if "pyspark" in sys.modules:
            stop_jvm()
        shutil.rmtree(work, ignore_errors=True)

    print("\n== peak RSS per measurement (VmHWM reset at its start)")
    print_peaks(suite.peaks)
    print(
        f"\n== summary: {args.messages:,} messages, {args.storage} storage, {time.perf_counter() - began:,.0f} s, "
        f"1-min load average {min(loads):.2f}..{max(loads):.2f} between scenarios"
    )
    print_summary(suite.summary)
    for note in suite.notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
