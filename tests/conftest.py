"""Shared fixtures: real nats-server processes and partitioned test streams.

Servers run on free loopback ports with temporary stores. Every server is stopped by its
fixture (and dies with the test process anyway, through PR_SET_PDEATHSIG); the session ends
by checking that no server this run started is still alive. Helpers that test modules import are in
``helpers.py``.
"""

from __future__ import annotations

import fcntl
import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import (
    CLASS_ARCHIVES,
    PartitionedStream,
    add_messages,
    checkpoint_option,
    class_archive_path,
    spark_home,
)

from spark_jetstream.client import protocol
from spark_jetstream.client.connection import Connection, ConnectionOptions, close_all, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.groups.layout import member_consumer_config, partition_filters, partitioned_stream_config
from spark_jetstream.testing import EmbeddedCluster, EmbeddedServer

PYSPARK_DIR = Path(importlib.util.find_spec("pyspark").origin).parent
JVM_OPTIONS = f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {checkpoint_option(PYSPARK_DIR)}"
"""Every JVM the tests start (the session's, the jobs' and demos' drivers, executors, Connect servers) compiles with
C1 only: their runs are short, and C2's compiler threads took a third of a cold Spark process's CPU (measured:
11.8-13.6 -> 7.7-9.5 CPU seconds), CPU the other test processes need. They collect garbage in one thread: G1's
concurrent threads cost the typical query job about 5% more CPU (decision 0035). Their streaming checkpoints are
written without a process per file status (``helpers.checkpoint_option``). All change speed, not behaviour."""
os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_OPTIONS)


if "SPARK_HOME" not in os.environ:  # one a developer set is left alone
    os.environ["SPARK_HOME"] = str(spark_home(PYSPARK_DIR))

QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"
"""A JVM whose classpath is not the archive's runs without it: no warning in its output."""
_archive_failed: list[str] = []


def class_archive() -> Path | None:
    """Spark's classes as the suite's JVMs load them, archived for this PySpark and JDK (AppCDS, made once by
    ``jobs/class_archive.py``): a cold Spark process then takes 10-12 CPU seconds instead of 17-22 (measured
    2026-11-28). None while another test process makes it, or if making it failed."""
    import pyspark

    archive = class_archive_path(pyspark.__version__, os.environ.get("SPARK_HOME", ""))
    if archive is None or _archive_failed:
        return None
    if archive.exists():
        return archive
    with open(CLASS_ARCHIVES / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if archive.exists():
            return archive
        partial = archive.with_name(f".{archive.name}.{os.getpid()}")
        scratch = CLASS_ARCHIVES / f".scratch.{os.getpid()}"
        job = Path(__file__).parent / "jobs" / "class_archive.py"
        options = f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial} {QUIET_CDS}"
        done = subprocess.run([sys.executable, str(job), str(scratch)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "JAVA_TOOL_OPTIONS": options})  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
        if done.returncode != 0 or not partial.exists():
            _archive_failed.append(done.stderr[-2000:])
            partial.unlink(missing_ok=True)
            return None
        partial.replace(archive)
    return archive


def use_class_archive() -> None:
    """Start the JVMs of this test process from here on with ``class_archive`` (only under the suite's own
    ``JAVA_TOOL_OPTIONS``: one a developer set is left alone)."""
    if os.environ.get("JAVA_TOOL_OPTIONS") == JVM_OPTIONS and (archive := class_archive()) is not None:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{JVM_OPTIONS} -XX:SharedArchiveFile={archive} {QUIET_CDS}"


@pytest.fixture(autouse=True)
def _class_archive(request: pytest.FixtureRequest) -> None:
    """A slow test's JVMs start from the class archive once it exists (the session's JVM: the ``spark`` fixture)."""
    if request.node.get_closest_marker("slow") is not None:
        use_class_archive()


BULK_PARSERS = [protocol.PURE, *filter(None, [protocol.compiled_parsers()[0]])]
"""The implementations of the bulk handlers here: the pure-Python ones, and the compiled ones where they were built."""


@pytest.fixture(params=BULK_PARSERS, ids=lambda parsers: parsers.name)
def bulk_parsers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> protocol.BulkParsers:
    """Each implementation of the bulk handlers in turn, as the one the readers use (``protocol.BULK``): the tests
    that parse run on both (as aiohttp's parser tests do)."""
    monkeypatch.setattr(protocol, "BULK", request.param)
    return request.param


_started: list[tuple[int, str]] = []
"""Servers the fixtures started, as (pid, start time): pids wrap at 32,768 here during a full run, so a pid alone
may name another process by the end."""


def _process(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process, or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[-1].split()
    except FileNotFoundError:
        return None
    return fields[0], fields[19]


def _track(server: EmbeddedServer) -> EmbeddedServer:
    """Remember the server's process (again after a restart gave it a new one) for the check at the end."""
    if server.pid and (found := _process(server.pid)):
        _started.append((server.pid, found[1]))
    return server


_IO_FIXTURES = frozenset(
    {
        "nats_server",
        "nats_cluster",
        "isolated_cluster",
        "conn",
        "api",
        "make_stream",
        "spark",
        # module fixtures that start servers, clusters, virtualenvs or certificate tooling themselves
        "secured_server",
        "versioned_server",
        "pki",
        "plain_token_server",
        "operator_mode",
        "big_server",
        "own_server",
        "wheel",
    }
)


LONGEST_FIRST = (
    "test_spark_versions.py",
    "test_driver_kill.py",
    "test_server_versions.py",
    "test_cluster.py",  # idle
    "test_source.py",
    "test_silent_faults_query.py",
    "test_security.py",
    "test_connection.py",  # idle
    "test_sink.py",
    "test_first_run.py",
    "test_leader_change_query.py",
    "test_leader_changes.py",  # idle
    "test_faults.py",
    "test_speculation.py",
    "test_spark_connect.py",
    "test_silent_servers.py",  # idle
    "test_slow_servers.py",  # idle
    "test_exclusive.py",
    "test_pipelines.py",
    "test_notebooks.py",
    "test_read_modes.py",
    "test_atomic_writes.py",
    "test_api_errors.py",
    "test_groupless.py",
    "test_kv.py",
    "test_speedups.py",
    "test_batch.py",
    "test_pipeline.py",
    "test_large_messages.py",
    "test_kv_consumers.py",
    "test_shared_stream.py",
    "test_options.py",
    "test_groups.py",
)
"""The files that take longest, longest first (their walls in a whole run with ``-n 3``: 11-250 s each, measured
2026-11-28): each process takes the next file when it is done, so the short ones fill the end instead of one long
file running alone. The files that mostly wait (a frozen or killed server's timeouts: ``# idle``, at most a tenth of
their wall on a CPU) sit between busy ones, so that two processes seldom wait at once while a core idles. Only the
order changes; it holds because ``--no-loadscope-reorder`` (pyproject.toml) keeps xdist from sorting the files by
their number of tests, as it does by default (it did until 2026-11-29: the 250 s files started last)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fast tier, ``pytest -m "not slow"``, is the pure rules: a test that asks for a server, a
    cluster or a Spark session is slow without saying so (tests that start processes themselves carry
    the marker by hand). The longest files come first (``LONGEST_FIRST``)."""
    for item in items:
        if _IO_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(name="test")
    server.start()
    _track(server)
    yield server
    close_all()
    server.close()


@pytest.fixture(scope="module")
def isolated_cluster() -> Iterator[EmbeddedCluster]:
    """A 3-node cluster whose servers each run in a network namespace of their own, so that a test can cut one off
    (root only: tests run as root)."""
    if os.geteuid() != 0:
        pytest.skip("a partition needs network namespaces, which need root")
    cluster = EmbeddedCluster(3, name="sji", isolated=True).start()
    for server in cluster.servers:
        _track(server)
    yield cluster
    disconnect(ConnectionOptions(servers=tuple(s.url for s in cluster.servers)))
    cluster.close()


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(3)
    cluster.start()
    for server in cluster.servers:
        _track(server)
    yield cluster
    disconnect(ConnectionOptions(servers=tuple(s.url for s in cluster.servers)))
    for server in cluster.servers:
        _track(server)  # tests kill and restart servers: the processes being stopped now
    cluster.close()


@pytest.fixture(scope="module")
def cluster_api(nats_cluster: EmbeddedCluster) -> JetStreamApi:
    """A JetStream API client connected to every server of the module's cluster."""
    return JetStreamApi(connect(ConnectionOptions(servers=tuple(s.url for s in nats_cluster.servers))))


@pytest.fixture(scope="session")
def conn(nats_server: EmbeddedServer) -> Connection:
    return connect(ConnectionOptions(servers=(nats_server.url,)))


@pytest.fixture(scope="session")
def api(conn: Connection) -> JetStreamApi:
    return JetStreamApi(conn)


_names = itertools.count(1)


@pytest.fixture
def make_stream(api: JetStreamApi, conn: Connection) -> Iterator[Callable[..., PartitionedStream]]:
    """Factory: ``make_stream(count, partitions=4, headers=False)`` -> a filled ``PartitionedStream``
    (of ``retention``; ``direct=False``: without Direct Get, so queries pull; ``size``: payload sizes as in
    ``add_messages``) with a member consumer of ack policy ``consumers`` per partition."""
    created: list[str] = []

    def make(
        count: int,
        partitions: int = 4,
        headers: bool = False,
        seed: int = 7,
        consumers: str = "explicit",
        retention: str = "limits",
        direct: bool = True,
        size: Callable[[int], int] | None = None,
    ) -> PartitionedStream:
        n = next(_names)
        stream = PartitionedStream(name=f"T{n}_{os.getpid()}", group=f"g{n}", partitions=partitions)
        config = partitioned_stream_config(stream.name, f"ev{n}.*", partitions, retention=retention)
        api.create_stream({**config, "allow_direct": direct})
        created.append(stream.name)
        add_messages(conn, stream, count, headers, seed, size)
        for p in range(partitions):
            config = member_consumer_config(stream.group, str(p), partition_filters([p]), ack_policy=consumers)
            api.create_consumer(stream.name, config)
        return stream

    yield make
    for name in created:
        api.delete_stream(name)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail loudly if a server this run started outlived its fixture."""
    alive = []
    for pid, started in _started:
        found = _process(pid)
        if found is not None and found[1] == started and found[0] != "Z":  # the same process, not a reaped one
            alive.append(pid)
    if alive:
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in alive}
        print(f"\nnats-server processes left running by the tests: {commands}")
        session.exitstatus = 1


@pytest.fixture(scope="session")
def spark():
    """A local Spark session with 2 cores; a failed task is tried once more (``local[2,2]``)."""
    from pyspark.sql import SparkSession

    use_class_archive()
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("spark-jetstream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
