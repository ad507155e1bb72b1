"""What every benchmark scenario shares: stream set-up, the processes' CPU and peak memory, the measured Spark
read, and table printing.

One definition each, so every scenario of the suite (``bench/run.py``) measures the same way: peak RSS is VmHWM
from ``/proc/<pid>/status`` (``peak_rss_kb``), CPU is ticks from ``/proc/stat`` and ``/proc/<pid>/stat``
(``CpuWatch``), a Spark read is one ``availableNow`` query into ``noop`` with rows counted from its progress
(``run_spark``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import Message, publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import descendants

MASTER_ENV, PROCESSES_ENV = "SPARK_JETSTREAM_BENCH_MASTER", "SPARK_JETSTREAM_BENCH_PROCESSES"
"""Where ``bench/run.py --master/--processes`` leave their values for every process of the run."""


def spark_master() -> str:
    """The Spark master of every session of the run (``--master``; ``local[2]`` by default)."""
    return os.environ.get(MASTER_ENV, "local[2]")


def processes() -> int:
    """The raw loops' processes (``--processes``): by default as many as the master runs tasks at once."""
    given = os.environ.get(PROCESSES_ENV)
    if given:
        return int(given)
    cores = re.match(r"^local\[(\d+|\*)", spark_master())
    if cores is None:
        return 2
    return os.cpu_count() or 2 if cores.group(1) == "*" else int(cores.group(1))


if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STREAM = "BENCH"
GROUP = "bench"
SUBJECTS = 1024
"""Messages go to ``ev.k<i % SUBJECTS>``: interleaved subjects, as a partitioned stream sees them."""
WARMUP_STREAM = "WARMUP"

RECV_SIZE = 1 << 20
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1}\r\nPING\r\n'
TICKS = os.sysconf("SC_CLK_TCK")


# -- set-up ------------------------------------------------------------------------------------


class RawSocket:
    """A blocking socket with a receive buffer: just enough NATS protocol for a pull loop."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pos = 0

    def close(self) -> None:
        self.sock.close()

    def fill(self) -> None:
        """Drop what was parsed, then append the next chunk from the socket."""
        del self.buf[: self.pos]
        self.pos = 0
        chunk = self.sock.recv(RECV_SIZE)
        if not chunk:
            raise ConnectionError("nats-server closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        """The next control line, without its CRLF."""
        while (eol := self.buf.find(b"\r\n", self.pos)) < 0:
            self.fill()
        line = bytes(self.buf[self.pos : eol])
        self.pos = eol + 2
        return line

    def handshake(self) -> dict[str, object]:
        """Read INFO, send CONNECT and PING, wait for PONG; return the server's INFO."""
        info_line = self.line()
        if not info_line.startswith(b"INFO "):
            raise ConnectionError(f"expected INFO, got {info_line[:80]!r}")
        self.sock.sendall(CONNECT)
        while (line := self.line()) != b"PONG":
            if line.startswith(b"-ERR"):
                raise ConnectionError(line.decode(errors="replace"))
        return json.loads(info_line[5:])


def server_version(address: tuple[str, int]) -> str:
    raw = RawSocket(address)
    try:
        return str(raw.handshake().get("version", "?"))
    finally:
        raw.close()


def create_stream(conn: Connection, name: str, subject: str, partitions: int, storage: str) -> None:
    JetStreamApi(conn).create_stream(partitioned_stream_config(name, subject, partitions, storage=storage))


def messages(count: int, size: int, distinct: int = SUBJECTS) -> Iterator[Message]:
    subjects = [f"ev.k{k}" for k in range(distinct)]
    payload = os.urandom(size)
    for i in range(count):
        yield subjects[i % distinct], payload, None


def warmup_messages(count: int, size: int) -> Iterator[Message]:
    payload = os.urandom(size)
    for i in range(count):
        yield f"warm.k{i % SUBJECTS}", payload, None


def publish(conn: Connection, what: str, batch: Iterator[Message], expected: int) -> float:
    began = time.perf_counter()
    published = publish_all(conn, batch)
    took = time.perf_counter() - began
    if published.count != expected:
        raise SystemExit(f"FAILED: published {published.count:,} of {expected:,} {what} messages")
    return took


# -- processes and their peak memory -------------------------------------------------------------


def jvm_pid(spark: SparkSession) -> int | None:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    except Exception:
        return None


def status_kb(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS:``, ``VmHWM:``); 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def peak_rss_kb(pid: int) -> int:
    """VmHWM (peak resident set) of a live process, in KiB; 0 when the process is gone."""
    return status_kb(pid, "VmHWM:")


def reset_peak(pid: int) -> None:
    """Reset VmHWM to the current RSS, so it measures from now (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


# -- CPU -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cpu:
    """CPU used during a measurement: by this benchmark's processes (in cores) and by others (share of all cores)."""

    own_cores: float
    other_share: float
    seconds: dict[str, float] = field(default_factory=dict)
    """CPU seconds by kind of process (``KINDS``): where a measurement's CPU went."""
    sent: int | None = None
    """Messages the server sent meanwhile (its ``/varz`` ``out_msgs``), where the watch was given its monitor."""


KINDS = ("nats-server", "JVM", "Python workers", "planner", "this process")
"""The benchmark's processes by what they do: the server, Spark's JVM, the executors' Python workers (reads run
there), the Python processes the JVM starts to plan a Python source, and this (driver) process."""


def process_kind(pid: int) -> str:
    """Which of ``KINDS`` process ``pid`` is, from its command line."""
    if pid == os.getpid():
        return "this process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().split(b"\0")
    except OSError:
        return "Python workers"
    text = b" ".join(words)
    if b"nats-server" in words[0]:
        return "nats-server"
    if words[0].endswith(b"java"):
        return "JVM"
    if b"pyspark.daemon" in text or b"pyspark.worker" in text:
        return "Python workers"
    return "planner"  # python_streaming_source_runner, plan_data_source_read and the like


def busy_ticks() -> int:
    """Non-idle CPU ticks of the whole machine since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    return sum(fields) - fields[3] - fields[4]  # without idle and iowait


def own_ticks() -> dict[tuple[int, int], int]:
    """CPU ticks (utime + stime) of this process and each live descendant (nats-server, JVM, Python
    workers), by (pid, start time)."""
    ticks: dict[tuple[int, int], int] = {}
    for pid in [os.getpid(), *descendants(os.getpid())]:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])
    return ticks


class CpuWatch:
    """CPU used from now to ``stop()``: by this benchmark's processes, and by the rest of the machine.

    The benchmark's processes are polled every ``POLL`` seconds, so one that ends meanwhile counts
    with its last seen CPU time: Spark's Python daemon does not wait for its workers, whose time
    then shows up in no parent's ``cutime``."""

    POLL = 0.5

    def __init__(self, monitor: str | None = None) -> None:
        self.monitor = monitor
        self.sent = _out_msgs(monitor)
        self.began = time.perf_counter()
        self.busy = busy_ticks()
        self.first = own_ticks()
        self.last = dict(self.first)
        self.kinds = {key: process_kind(key[0]) for key in self.first}
        self._done = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="cpu-watch", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._done.wait(self.POLL):
            self._update()

    def _update(self) -> None:
        ticks = own_ticks()
        for key in ticks.keys() - self.kinds.keys():
            self.kinds[key] = process_kind(key[0])
        self.last.update(ticks)

    def stop(self) -> Cpu:
        self._done.set()
        self._poller.join()
        self._update()
        wall = time.perf_counter() - self.began
        seconds = dict.fromkeys(KINDS, 0.0)
        for key, ticks in self.last.items():
            seconds[self.kinds[key]] += (ticks - self.first.get(key, 0)) / TICKS
        own = sum(seconds.values())
        other = max(0.0, (busy_ticks() - self.busy) / TICKS - own)
        sent = None if self.sent is None else _out_msgs(self.monitor) - self.sent  # type: ignore[operator]
        return Cpu(own / wall, other / wall / (os.cpu_count() or 1), seconds, sent)


def _out_msgs(monitor: str | None) -> int | None:
    """How many messages the server at ``monitor`` (its monitoring URL) has sent to clients so far."""
    if not monitor:
        return None
    with urllib.request.urlopen(f"{monitor}/varz", timeout=10) as answer:
        return int(json.load(answer)["out_msgs"])


# -- the measured Spark read ---------------------------------------------------------------------


@dataclass
class SparkRun:
    messages: int
    seconds: float
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def batches(self) -> int:
        return len(self.progress)


def run_spark(
    spark: SparkSession,
    url: str,
    stream: str,
    group: str | None,
    checkpoint: str,
    max_per_trigger: int | None,
    options: dict[str, str] | None = None,
) -> SparkRun:
    """One ``availableNow`` query into the noop sink; return its rows, time and batch progress.

    ``group`` None reads without a group; ``options`` are further source options (e.g. ``members``)."""
    reader = spark.readStream.format("jetstream").option("servers", url).option("stream", stream)
    if group is not None:
        reader = reader.option("group", group)
    if max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(max_per_trigger))
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.format("noop").trigger(availableNow=True)
    writer = writer.option("checkpointLocation", checkpoint)
    began = time.perf_counter()
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:  # StreamingQueryException: report the connector's error as is
        raise SystemExit(f"FAILED: the Spark query on {stream} failed:\n{exc}") from None
    seconds = time.perf_counter() - began
    progress = sorted((dict(p) for p in query.recentProgress), key=lambda p: p["batchId"])
    ids = [p["batchId"] for p in progress]
    if ids and ids != list(range(ids[0], ids[0] + len(ids))):
        print(f"WARNING: batch ids of {stream} are not contiguous: {ids[:5]}..{ids[-5:]}")
    if ids and ids[0] != 0:
        print(f"WARNING: progress of {stream} starts at batch {ids[0]}: earlier batches are not counted")
    return SparkRun(sum(p["numInputRows"] or 0 for p in progress), seconds, progress)


# -- tables ------------------------------------------------------------------------------------


def heading(title: str) -> None:
    load = os.getloadavg()
    print(f"\n== {title} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds else 0.0


def mb(kb: int | float) -> str:
    return f"{kb / 1024:,.0f}" if kb else "-"


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


# -- fresh processes -----------------------------------------------------------------------------

BENCH_DIR = Path(__file__).resolve().parent


def in_fresh_process(function: str, *args: str) -> dict[str, Any]:
    """``function`` (``"scenarios.<module>.<name>"``) called with ``args`` in a new Python process run from
    ``bench/``, as a job or a first query runs: what it returns, as JSON. A failure ends the benchmark with the end
    of its stderr."""
    module, name = function.rsplit(".", 1)
    code = f"import json, sys; from {module} import {name}; print(json.dumps({name}(*sys.argv[1:])))"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=BENCH_DIR, check=False
    )
    if done.returncode:
        raise SystemExit(f"FAILED: {function}{args} failed in its process:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh_session(**conf: str) -> SparkSession:
    """The session of a fresh process (``spark_master()``): no UI, errors only in the log."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spark_master()).config("spark.ui.enabled", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
