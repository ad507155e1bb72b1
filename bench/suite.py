"""What the suite's scenarios share: the server and its connection, a Spark session per scenario, the
CPU and peak memory watched around each measurement, and the summary rows they report."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from common import (
    WARMUP_STREAM,
    Cpu,
    CpuWatch,
    SparkRun,
    create_stream,
    descendants,
    jvm_pid,
    mb,
    peak_rss_kb,
    reset_peak,
    run_spark,
    spark_master,
    status_kb,
)

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.tools.demo import QUIET_LOG4J

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SIZE = 100
"""Payload bytes of every message the suite publishes."""
READ_PARTITIONS = 4
WARMUP_MESSAGES = 10_000
NAIVE_FORMAT = "naive-jetstream"
POLL = 0.2
"""Seconds between polls of the processes' peak RSS."""


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
    monitor: str = ""
    """The server's monitoring endpoint (``http://127.0.0.1:<port>``)."""
    results: dict[str, object] = field(default_factory=dict)
    """What a scenario measured, by scenario, as plain data: ``--json`` writes it for ``bench/charts.py``."""

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
        peaks.driver_kb = max(peaks.driver_kb, peak_rss_kb(os.getpid()))
        if self.jvm is None:
            return
        peaks.jvm_kb = max(peaks.jvm_kb, peak_rss_kb(self.jvm))
        for pid, kind in python_kinds(self.jvm).items():
            kb = peak_rss_kb(pid)
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
        self.cpu_watch = CpuWatch(suite.monitor or None)
        self.cpu: Cpu | None = None

    def stop(self) -> Cpu:
        self.cpu = self.cpu_watch.stop()
        peaks = self.memory.stop()
        if self.memory.jvm is not None:  # only Spark measurements: the baselines' processes are not watched
            self.suite.peaks.append(peaks)
        return self.cpu


# -- spark -------------------------------------------------------------------------------------


def start_session(suite: Suite, scenario: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A session for one scenario (``spark_master()``), with an untimed warm-up query (JVM, Python workers)."""
    from pyspark.sql import SparkSession

    log_config = Path(suite.work, "log4j2.properties")
    log_config.write_text(QUIET_LOG4J)
    builder = (
        SparkSession.builder.master(spark_master())
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
