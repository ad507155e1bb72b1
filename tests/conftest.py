"""Shared fixtures: real nats-server processes and partitioned test streams.

Servers run on free loopback ports with temporary stores. Every server is stopped by its
fixture (and dies with the test process anyway, through PR_SET_PDEATHSIG); the session ends
by checking that no server this run started is still alive.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spark_jetstream.client.connection import Connection, ConnectionOptions, close_all, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import (
    member_consumer_config,
    member_consumer_name,
    partition_filters,
    partitioned_stream_config,
)
from spark_jetstream.tools.embedded import EmbeddedCluster, EmbeddedServer

_started: list[tuple[int, str]] = []
"""Servers the fixtures started, as (pid, start time): pids wrap at 32,768 here during a full run, so a pid alone
may name another process by the end."""


def fnv1a_32(data: bytes) -> int:
    """The hash behind the server's ``{{partition(N, ...)}}`` transform (test oracle)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


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
        "conn",
        "api",
        "make_stream",
        "spark",
        "active_session",
        # module fixtures that start servers, clusters, virtualenvs or certificate tooling themselves
        "secured_server",
        "old_server_binary",
        "pki",
        "plain_token_server",
        "operator_mode",
        "big_server",
        "own_server",
        "wheel",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fast tier, ``pytest -m "not slow"``, is the pure rules: a test that asks for a server, a
    cluster or a Spark session is slow without saying so (tests that start processes themselves carry
    the marker by hand)."""
    for item in items:
        if _IO_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(name="test")
    server.start()
    _track(server)
    yield server
    close_all()
    server.close()


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


@dataclass
class PartitionedStream:
    """A stream with partitioned subjects, its member consumers, and what was published."""

    name: str
    group: str
    partitions: int
    # seq -> (subject as published, payload, headers, partition)
    messages: dict[int, tuple[str, bytes, dict[str, str] | None, int]] = field(default_factory=dict)

    def consumer(self, partition: int) -> str:
        return member_consumer_name(self.group, str(partition))

    def expected(self, partition: int, start: int, end: int) -> list[int]:
        """Seqs of the partition's messages with ``start < seq <= end``, in order."""
        return [seq for seq, m in sorted(self.messages.items()) if m[3] == partition and start < seq <= end]

    @property
    def last_seq(self) -> int:
        return max(self.messages)


def add_messages(
    conn: Connection,
    stream: PartitionedStream,
    count: int,
    headers: bool = False,
    seed: int = 7,
    size: Callable[[int], int] | None = None,
) -> None:
    """Publish ``count`` messages to ``stream`` (made by ``make_stream``) and record them; ``size(i)``: the
    i-th payload's size (default: a few dozen bytes)."""
    n = stream.group[1:]
    rng = random.Random(seed)
    batch = []
    for i in range(count):
        key = f"k{rng.randrange(1000)}"
        subject = f"ev{n}.{key}"
        prefix = f"msg-{i}-".encode()
        payload = prefix + rng.randbytes(rng.randrange(0, 40) if size is None else size(i) - len(prefix))
        hdrs = {"index": str(i), "kind": "odd" if i % 2 else "even"} if headers else None
        batch.append((subject, payload, hdrs, fnv1a_32(key.encode()) % stream.partitions))
    result = publish_all(conn, ((s, p, h) for s, p, h, _ in batch))
    assert result.count == count
    for offset, message in enumerate(batch):
        stream.messages[result.first_seq + offset] = message


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


@pytest.fixture
def active_session(spark):
    """Re-set the JVM's active session for this thread. Starting nats-server (``EmbeddedServer``) forks
    from a helper thread with a ``preexec_fn``: the child runs Python's after-fork handlers, which close
    py4j's connection of this thread, and the new connection's JVM thread has no active session, so
    Spark's ``df.write`` lookup does not find Python data sources (DATA_SOURCE_NOT_FOUND)."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
