"""The benchmark suite: one command that sets up its own server and data and prints one table.

The machines are shared and noisy, so every figure is a ratio against a baseline measured in the
same run, on the same nats-server (``EmbeddedServer``, file store in a temp dir) and the same data.
Each scenario is one module of ``bench/scenarios/`` that owns its measurement; those using Spark get a
``local[2]`` SparkSession of their own (stopped at their end) and an untimed warm-up query first:

* ``read``: ``--messages`` on 4 partitions, ``availableNow`` into ``noop``, default and ``ackPolicy=none``,
  against the raw pull loop and the naive nats-py source of ``bench/baseline/``.
* ``scaling``: the same read with ``members`` 1, 2, 4, 8 on 8 partitions, and the raw pull loop.
* ``groupless``: a streaming read without a group next to the grouped one on the same stream (with Direct Get, and
  a stream with a client's defaults): rows/s and the driver's requests per micro-batch, counted by the server.
* ``latency``: ``--rate`` msg/s for ``--latency-seconds`` read into ``foreachBatch``, publish to sink,
  against the naive source.
* ``write``: the Spark writer with and without msg ids against the raw pipelined publisher.
* ``memory``: a Python worker's peak RSS with ``maxMessagesPerTrigger`` ``--messages``/10 and ``--messages``.
* ``large-messages``: ``--large-mb`` MB each of 1 MB, 200 KB and 10 KB messages read and written, against raw
  loops and a no-I/O Python source; the workers' peak RSS.
* ``shapes``: ``--shape-messages`` per stream shape, streaming and batch, by read mode, against raw Direct Get
  and pull loops and a no-I/O Python source.
* ``first-batch``: ``load()`` plus the first batch in fresh processes, against a no-I/O source and ``rate``
  (``--first-batch-rounds``).
* ``cold-job``: an ``availableNow`` job over ``--cold-messages`` in a fresh process, against the raw Direct Get loop.
* ``leader-change``: a query on a 3-node cluster of its own through leader faults (``--leader-rounds``).
* ``slow-server``: a streaming read and a streaming write on a server of their own capped at a tenth of a core for a
  minute (root: a cgroup v1 CPU quota): no failed query, rows exact.
* ``kv``: a KV bucket of ``--messages`` keys read as a table against the raw Direct Get loop, and its changes
  streamed at ``--rate`` puts/s (p50/p99 from put to row).
* ``pull-reader``: the pinned pull reader against the raw pull loop, outside Spark (``--pull-partitions``,
  ``--pull-subjects``).
* ``parser``: the readers' parse of deliveries into rows and their record batches, on bytes alone (no server's or
  Spark's share), CPU per message.
* ``chaos``: two streaming queries (a jetstream sink, a parquet sink), each in a driver of its own on a Spark
  standalone cluster, on a 3-node cluster of their own through random faults of every kind (servers killed, frozen,
  cut off, starved; leaders stepped down; Spark Workers and drivers lost) for ``--chaos-minutes``, drawn from
  ``--seed``: every message exactly once, ack floors at the checkpoints, no failed query, nothing grown. Root only.
* ``fuzz``: the compiled bulk handlers against their pure twins under a coverage-guided fuzzer (atheris, with ASan
  and UBSan where clang is), ``--fuzz-seconds`` per handler; ``bench/fuzz.py`` alone does the same.

Peak RSS (VmHWM, reset with ``/proc/<pid>/clear_refs`` when a measurement starts and polled) is
recorded per measurement for this driver process, the Spark JVM and the Python processes under it.
The CPU other processes used meanwhile is printed per measurement: a high share means the figure
is noisy.

Run it from the repository root. ``--quick`` makes the sizes smaller, not the list shorter: without ``--only`` it
still runs every scenario, as root the 30-minute chaos run included, so pick scenarios for a smoke run of a few
minutes. ``--json FILE`` also writes the results as JSON, which ``bench/charts.py`` draws from::

    python bench/run.py
    python bench/run.py --quick --only read,latency
    python bench/run.py --only shapes --json docs/benchmarks-data/shapes.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import (
    MASTER_ENV,
    PROCESSES_ENV,
    SUBJECTS,
    WARMUP_STREAM,
    create_stream,
    processes,
    publish,
    server_version,
    spark_master,
    warmup_messages,
)
from scenarios import (
    chaos,
    cold_job,
    first_batch,
    fuzz,
    groupless,
    kv,
    large_messages,
    latency,
    leader_change,
    memory,
    parser,
    pull_reader,
    read,
    scaling,
    shapes,
    slow_server,
    write,
)
from suite import READ_PARTITIONS, SIZE, WARMUP_MESSAGES, Suite, print_peaks, print_summary

from spark_jetstream.client.connection import ConnectionOptions, close_all, connect
from spark_jetstream.testing import EmbeddedServer

NAIVE_DIR = Path(__file__).resolve().parent / "baseline"

RUNNERS: dict[str, Callable[[Suite], None]] = {
    "read": read.run,
    "scaling": scaling.run,
    "groupless": groupless.run,
    "latency": latency.run,
    "write": write.run,
    "memory": memory.run,
    "large-messages": large_messages.run,
    "shapes": shapes.run,
    "first-batch": first_batch.run,
    "cold-job": cold_job.run,
    "leader-change": leader_change.run,
    "slow-server": slow_server.run,
    "pull-reader": pull_reader.run,
    "parser": parser.run,
    "kv": kv.run,
    "fuzz": fuzz.run,
    "chaos": chaos.run,
}
SCENARIOS = tuple(RUNNERS)


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
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios: {', '.join(SCENARIOS)}"
    )
    parser.add_argument("--messages", type=int, default=None, help="messages per scenario (1,000,000; quick 100,000)")
    parser.add_argument("--latency-seconds", type=float, default=None, help="publishing time of the latency run")
    parser.add_argument("--rate", type=int, default=5000, help="msg/s published during the latency run")
    parser.add_argument("--large-mb", type=int, default=None, help="MB of payload per message size of large-messages")
    parser.add_argument("--shape-messages", type=int, default=None, help="messages per stream shape (400,000)")
    parser.add_argument("--cold-messages", type=int, default=None, help="messages of cold-job (3,000,000)")
    parser.add_argument("--first-batch-rounds", type=int, default=3, help="interleaved rounds of first-batch (3)")
    parser.add_argument("--leader-rounds", type=int, default=1, help="rounds of leader-change's faults (1)")
    parser.add_argument(
        "--leader-faults",
        default="",
        help="leader-change's faults to inject, separated by ';' (e.g. 'none;stream leader, frozen'); all by default",
    )
    parser.add_argument("--pull-partitions", type=int, default=4, help="partitions (members) of pull-reader (4)")
    parser.add_argument("--pull-subjects", type=int, default=SUBJECTS, help="subjects of pull-reader (1,024)")
    parser.add_argument("--storage", choices=("file", "memory"), default="file", help="storage of every stream")
    parser.add_argument("--master", default="local[2]", help="Spark master of every session (local[2])")
    parser.add_argument(
        "--processes", type=int, default=None, help="processes of the raw loops (default: the master's task slots)"
    )
    parser.add_argument("--min-partitions", type=int, default=8, help="shapes: the minPartitions variant's (8)")
    parser.add_argument(
        "--shape-batches", type=int, default=8, help="shapes: streaming reads in this many batches (8; 1: one batch)"
    )
    parser.add_argument("--shapes", default="", help="shapes: only the stream shapes whose names contain this")
    parser.add_argument(
        "--curve-shape",
        default="no transform, Direct Get",
        help="shapes: the scaling curve's shape, a part of its name ('none': no curve)",
    )
    parser.add_argument("--fuzz-seconds", type=float, default=None, help="fuzz: seconds per handler (60; quick 15)")
    parser.add_argument("--chaos-minutes", type=float, default=30.0, help="chaos: minutes of faults (30)")
    parser.add_argument(
        "--seed", type=int, default=None, help="chaos: the seed its faults are drawn from (default: random, printed)"
    )
    parser.add_argument("--naive-dir", type=Path, default=NAIVE_DIR, help="directory holding naive_source.py")
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the run's results to this file (read by bench/charts.py)"
    )
    args = parser.parse_args(argv)
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.latency_seconds = args.latency_seconds or (15.0 if args.quick else 60.0)
    args.large_mb = args.large_mb or (200 if args.quick else 1000)
    args.shape_messages = args.shape_messages or (100_000 if args.quick else 400_000)
    args.cold_messages = args.cold_messages or (300_000 if args.quick else 3_000_000)
    args.fuzz_seconds = args.fuzz_seconds or (15.0 if args.quick else 60.0)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.only if s not in SCENARIOS]
    if unknown or not args.only:
        parser.error(f"--only takes scenarios of {', '.join(SCENARIOS)}; unknown: {', '.join(unknown)}")
    if args.messages < 10 or args.rate < 1 or args.latency_seconds <= 0:
        parser.error("--messages must be at least 10, --rate and --latency-seconds positive")
    if min(args.first_batch_rounds, args.leader_rounds, args.pull_partitions, args.pull_subjects) < 1:
        parser.error("--first-batch-rounds, --leader-rounds, --pull-partitions and --pull-subjects must be positive")
    return args


def warn_if_workers_import_another_package() -> None:
    """Spark's Python workers start in the driver's working directory and import ``spark_jetstream`` from it first: a
    checkout there without the compiled handlers makes them pure while this process runs the installed package."""
    import spark_jetstream
    from spark_jetstream.client import protocol

    here = Path.cwd() / "spark_jetstream"
    if here.is_dir() and Path(spark_jetstream.__file__).parent.resolve() != here.resolve():
        print(
            f"warning: Spark's workers will import {here} (this directory's checkout), not the package this process "
            f"imported ({Path(spark_jetstream.__file__).parent}, {protocol.BULK.name} handlers): run from another "
            "directory to measure the installed package"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A run in the background ignores SIGINT: SIGTERM ends it as Ctrl-C does, through every finally that stops what
    # it started (servers, a Spark cluster, drivers, network namespaces).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    warn_if_workers_import_another_package()
    os.environ[MASTER_ENV] = args.master  # every process of the run, spawned raw loops and fresh jobs included
    if args.processes:
        os.environ[PROCESSES_ENV] = str(args.processes)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = tempfile.mkdtemp(prefix="bench-suite-")
    began = time.perf_counter()
    started_at = datetime.datetime.now(datetime.UTC)
    loads = [os.getloadavg()[0]]
    versions: dict[str, str] = {}
    try:
        os.makedirs(os.path.join(work, "nats"))
        with EmbeddedServer(name="bench", store_dir=os.path.join(work, "nats")) as server:
            address = ("127.0.0.1", server.port)
            conn = connect(ConnectionOptions(servers=(server.url,)))
            suite = Suite(args, server.url, address, conn, work, monitor=f"http://127.0.0.1:{server.monitor_port}")
            try:
                import pyspark

                versions = {
                    "nats-server": server_version(address),
                    "pyspark": pyspark.__version__,
                    "python": platform.python_version(),
                }
                print(
                    f"nats-server {server_version(address)}, PySpark {pyspark.__version__}, {os.cpu_count()} cores, "
                    f"Spark master {spark_master()}, raw loops in {processes()} processes, "
                    f"Python {platform.python_version()}; {args.messages:,} messages, {args.storage} storage; "
                    f"scenarios {', '.join(args.only)}; seed {args.seed}"
                )
                create_stream(conn, WARMUP_STREAM, "warm.*", READ_PARTITIONS, args.storage)
                publish(conn, "warm-up", warmup_messages(WARMUP_MESSAGES, SIZE), WARMUP_MESSAGES)
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
    if args.json:
        write_json(args, suite, started_at, time.perf_counter() - began, loads, versions)
    return 0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        return ""


def write_json(
    args: argparse.Namespace,
    suite: Suite,
    started_at: datetime.datetime,
    seconds: float,
    loads: list[float],
    versions: dict[str, str],
) -> None:
    """The run as plain data: when, on what, under which load, and what each scenario measured (``suite.results``)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = ""
    run = {
        "command": shlex.join(["python", "bench/run.py", *sys.argv[1:]]),
        "started": started_at.isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "commit": commit,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        },
        "versions": versions,
        "storage": args.storage,
        "master": spark_master(),
        "load_1min": {"start": loads[0], "end": loads[-1], "min": min(loads), "max": max(loads)},
        "results": suite.results,
        "summary": [
            {"scenario": s.scenario, "connector": s.connector, "baseline": s.baseline, "unit": s.unit, "met": s.met}
            for s in suite.summary
        ],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(run, indent=1) + "\n")
    print(f"results written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
