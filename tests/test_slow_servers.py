"""A slow server is not a silent one: a server starved of CPU (a cgroup quota, as on an overloaded host) answers the
connection's pings but answers requests seconds late. Reads and API requests wait for it up to ``requestTimeout``
(60 s, Kafka's ``default.api.timeout.ms``) instead of the 15 s a silent server gets, and a request that still got no
answer says what was seen: the server answered pings, not the request."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from spark_jetstream.client import retry
from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import ClusterUnavailableError
from spark_jetstream.read import direct
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.testing import CPU_CGROUPS, EmbeddedServer

pytestmark = pytest.mark.slow

MESSAGES = 20_000


@pytest.fixture
def starvable() -> Iterator[EmbeddedServer]:
    """A server of the test's own whose CPU the test may cap."""
    if not (CPU_CGROUPS / "cgroup.procs").exists():
        pytest.skip(f"no cgroup v1 cpu controller at {CPU_CGROUPS}: a server cannot be starved of CPU here")
    server = EmbeddedServer(name="starved").start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.starve(None)
        server.close()


def test_a_range_is_read_exactly_from_a_server_starved_of_cpu_for_longer_than_a_silent_one_is_waited_for(starvable):
    """The server gets 1% of a core while a range of 20,000 messages is read with Direct Get: every batch answers
    seconds late, later than the 1 s a reader used to ask again after (each asking again queued more work behind the
    last) and than the 15 s it gave up after. The range is read exactly, with no error. At 1% of a core on a machine
    the rest of the suite loads too, the server's pings can come more than ``silenceTimeout`` (3 s) late, which makes
    it a silent one (moved away from, given up on after 15 s): the test gives pings 10 s, as a user would on such a
    host."""
    options = ConnectionOptions(servers=(starvable.url,), silence_timeout=10.0)
    conn = connect(options)
    try:
        JetStreamApi(conn).create_stream({"name": "SLOW", "subjects": ["slow.>"], "allow_direct": True})
        publish_all(conn, ((f"slow.k{i % 64}", b"%d" % i, None) for i in range(MESSAGES)))
        seq_range = SeqRange("SLOW", "slow.>", 0, MESSAGES, partitioned=False)
        starvable.starve(0.01)
        began = time.monotonic()
        seqs = [seq for batch in direct.read_range(conn, seq_range) for seq in batch.column("seq").to_pylist()]
        took = time.monotonic() - began
    finally:
        starvable.starve(None)
        disconnect(options)
    assert seqs == list(range(1, MESSAGES + 1))
    print(f"\n{MESSAGES} messages read in {took:.1f} s from a server with 1% of a core")


def test_a_request_the_server_leaves_unanswered_while_it_answers_pings_says_so(starvable):
    """Something subscribes to the subject and never answers (as a server working off a backlog): pings are answered
    throughout, so the request is given ``requestTimeout`` and its error says the server answered pings, not the
    request, and how to wait longer; nothing about servers being down."""
    options = ConnectionOptions(servers=(starvable.url,), request_timeout=3.0)
    conn = connect(options)
    try:
        conn.run(conn.client.subscribe("sj.never.answered"))
        began = time.monotonic()
        with pytest.raises(ClusterUnavailableError) as caught:
            conn.run(retry.request(conn, "sj.never.answered", b""), timeout=30)
        took = time.monotonic() - began
    finally:
        disconnect(options)
    message = str(caught.value)
    assert message.startswith("A request about sj.never.answered got no answer within 3s (timeout x"), message
    assert f"through nats://127.0.0.1:{starvable.port}, which answered the connection's pings all along" in message
    assert "wait longer with requestTimeout (now 3s)" in message, message
    assert "up?" not in message and "no replica" not in message, message
    assert 3.0 <= took < 5.0
