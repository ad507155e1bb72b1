"""A silent server (frozen: SIGSTOP keeps its sockets open, answers nothing and sends no reset, as a paused VM or a
partition does) is left for another server within ``silenceTimeout``; a quiet healthy one is not; a request that a
silent server left unanswered says which server and for how long (decision 0026). The query-level faults are in
``tests/test_silent_faults_query.py``."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

import pytest
from helpers import wait_for
from nats.errors import FlushTimeoutError

from spark_jetstream.client import retry
from spark_jetstream.client.connection import Connection, ConnectionOptions, connect, disconnect
from spark_jetstream.client.nats_client import server_address
from spark_jetstream.errors import ClusterUnavailableError, OptionError
from spark_jetstream.options import parse_connection_options
from spark_jetstream.testing import EmbeddedServer


@pytest.fixture
def two_servers() -> Iterator[list[EmbeddedServer]]:
    """Two standalone servers (each answers ``$JS.API.INFO`` itself); any frozen one is thawed at the end."""
    servers = [EmbeddedServer(name=f"quiet-{i}").start() for i in range(2)]
    yield servers
    for server in servers:
        server.thaw()
        server.close()


def _answers(conn: Connection) -> bool:
    async def ask() -> bool:
        try:
            await conn.client.request("$JS.API.INFO", b"", timeout=0.5)
            return True
        except Exception:
            return False

    return conn.run(ask())


def _on(conn: Connection, servers: list[EmbeddedServer]) -> EmbeddedServer:
    where = server_address(conn.client)
    return next(server for server in servers if where == f"127.0.0.1:{server.port}")


@pytest.mark.slow
def test_a_frozen_server_answers_nothing_sent_after_freeze():
    """``freeze`` returns once every thread has stopped: a request sent at once goes unanswered (without the wait,
    16% of such requests were answered on an idle machine: the kernel stops each thread when it next runs)."""
    with EmbeddedServer(name="freeze") as server:
        options = ConnectionOptions(servers=(server.url,), silence_timeout=30.0)
        conn = connect(options)
        try:

            async def frozen_then_asked() -> bool:
                server.freeze()  # on the connection's loop, so the request goes out the moment it returns
                try:
                    await conn.client.request("$JS.API.INFO", b"", timeout=0.1)
                    return True
                except Exception:
                    return False
                finally:
                    server.thaw()

            for _ in range(20):
                assert not conn.run(frozen_then_asked())
                assert _answers(conn)
        finally:
            disconnect(options)


@pytest.mark.slow
def test_a_pong_after_its_waiter_gave_up_leaves_the_connection_reading():
    """``busy_for`` says whether the server leaves a PING unanswered; and a PONG whose waiter gave up is dropped:
    nats-py's ``flush`` cancels its future on a timeout, then set its result when the PONG came, which raised in the
    read loop and ended it (nothing was read until the connection left the server as silent)."""
    with EmbeddedServer(name="late-pong") as server:
        options = ConnectionOptions(servers=(server.url,), silence_timeout=30.0)
        conn = connect(options)
        try:

            async def late_pongs() -> tuple[bool, bool, bool]:
                idle = await conn.client.busy_for(2.0)
                server.freeze()
                try:
                    frozen = await conn.client.busy_for(0.3)
                    with pytest.raises(FlushTimeoutError):
                        await conn.client.flush(timeout=0.3)
                finally:
                    server.thaw()
                thawed = await conn.client.busy_for(2.0)
                return idle, frozen, thawed

            assert conn.run(late_pongs()) == (False, True, False)
            assert _answers(conn), "the connection stopped reading after the late PONGs"
        finally:
            disconnect(options)


@pytest.mark.slow
def test_a_frozen_server_is_left_for_another_while_it_is_still_frozen(two_servers, caplog):
    options = ConnectionOptions(servers=tuple(s.url for s in two_servers), silence_timeout=1.0)
    conn = connect(options)
    try:
        frozen = _on(conn, two_servers)
        other = next(server for server in two_servers if server is not frozen)
        assert _answers(conn)
        with caplog.at_level(logging.WARNING, logger="spark_jetstream.client.nats_client"):
            assert frozen.process is not None
            frozen.freeze()
            wait_for(lambda: _on(conn, two_servers) is other and _answers(conn), 30, "the move to the other server")
        assert frozen.process.poll() is None  # still there, still frozen: nothing closed the connection but us
        address = f"127.0.0.1:{frozen.port}"
        assert set(conn.client.silenced) == {address}
        assert conn.client.silenced[address][1] >= 1.0
        assert any(
            re.search(rf"the server at {address} sent nothing for \d+\.\d s though pinged", record.getMessage())
            for record in caplog.records
        ), [record.getMessage() for record in caplog.records]
    finally:
        disconnect(options)


@pytest.mark.slow
def test_a_quiet_healthy_server_keeps_its_connection(two_servers):
    """Nothing to read for many silence timeouts: the pings are answered, the connection stays where it is."""
    options = ConnectionOptions(servers=(two_servers[0].url,), silence_timeout=0.6)
    conn = connect(options)
    try:
        time.sleep(3.0)
        assert conn.client.stats["reconnects"] == 0
        assert conn.client.silenced == {}
        assert _answers(conn)
    finally:
        disconnect(options)


@pytest.mark.slow
def test_a_request_a_silent_server_left_unanswered_names_the_server(two_servers):
    """The only server freezes: the request runs out of time, and the error says which server went silent and for how
    long, not a guess about leaders or configuration."""
    server = two_servers[0]
    options = ConnectionOptions(servers=(server.url,), silence_timeout=1.0, connect_timeout=1.0, request_timeout=5.0)
    conn = connect(options)
    try:
        assert server.process is not None
        server.freeze()
        with pytest.raises(ClusterUnavailableError) as caught:
            conn.run(retry.request(conn, "$JS.API.INFO", b"", "the JetStream account"), timeout=60)
        message = str(caught.value)
        assert f"the server at 127.0.0.1:{server.port} sent nothing for" in message, message
        assert "though pinged (frozen, or cut off by the network)" in message, message
        assert message.startswith("No server answered about the JetStream account within 5s"), message
    finally:
        server.thaw()
        disconnect(options)


def test_silence_timeout_is_a_connection_option():
    assert parse_connection_options({"silenceTimeout": "1.5s"}).silence_timeout == 1.5
    assert parse_connection_options({}).silence_timeout == 3.0
    with pytest.raises(OptionError, match=re.escape("Option 'silenceTimeout' has an invalid value")):
        parse_connection_options({"silenceTimeout": "100ms"})


@pytest.mark.slow
@pytest.mark.parametrize("size", [1, 3])
def test_servers_restarted_whole_within_the_deadline_fail_no_read(tmp_path, size):
    """Every server of the stream down for 20 s (one server; a 3-node cluster and its R3 stream, restarted whole, as
    routine maintenance does it): a planning call and a Direct Get read that ask meanwhile wait, and answer exactly
    once the servers are back, as Kafka's consumer waits ``default.api.timeout.ms``. Before decision 0043 both failed
    after 15 s."""
    import threading

    from spark_jetstream.client.jsapi import JetStreamApi
    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.read.direct import read_range
    from spark_jetstream.read.ranges import SeqRange
    from spark_jetstream.testing import EmbeddedCluster

    cluster = EmbeddedCluster(size, name="whole").start() if size > 1 else None
    servers = cluster.servers if cluster else [EmbeddedServer(name="whole", store_dir=str(tmp_path)).start()]
    options = ConnectionOptions(servers=tuple(server.url for server in servers))
    conn = connect(options)
    try:
        api = JetStreamApi(conn)
        api.create_stream({"name": "WHOLE", "subjects": ["whole.>"], "allow_direct": True, "num_replicas": size})
        wait_for(lambda: (api.stream_info("WHOLE").get("cluster") or {}).get("leader"), 30, "the stream's leader")
        publish_all(conn, ((f"whole.{i % 7}", b"x", None) for i in range(3000)))
        for server in servers:
            server.kill()
        results: dict[str, object] = {}

        def ask(name: str, call) -> None:
            try:
                results[name] = call()
            except Exception as exc:  # the test's assertion says which
                results[name] = exc
            results[f"{name} at"] = time.monotonic()

        calls = {
            "info": lambda: api.stream_info("WHOLE")["state"]["last_seq"],
            "read": lambda: [
                s for b in read_range(conn, SeqRange("WHOLE", ">", 0, 3000, False)) for s in b["seq"].to_pylist()
            ],
        }
        threads = [threading.Thread(target=ask, args=item) for item in calls.items()]
        for thread in threads:
            thread.start()
        time.sleep(20)
        back = time.monotonic()
        if cluster:
            cluster.start()
        else:
            servers[0].start()
        for thread in threads:
            thread.join(60)
        assert results["info"] == 3000, results["info"]
        assert results["read"] == list(range(1, 3001)), results["read"]
        logging.getLogger(__name__).warning(
            "answered %.1f s and %.1f s after the servers were started",
            results["info at"] - back,
            results["read at"] - back,
        )
    finally:
        disconnect(options)
        if cluster:
            cluster.close()
        else:
            servers[0].close()
