"""The connection's read loop (``RawClient._read_loop``): a bulk read owed many messages gathers short reads into
larger ones, and the loop still hands a lost connection to nats-py's reconnect."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers import wait_for

from spark_jetstream.client.connection import Connection, ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.nats_client import GATHER_OWED
from spark_jetstream.tools.embedded import EmbeddedServer

MESSAGES = 100
GAP = 0.0002
"""Seconds between the messages a raw publisher sends: several arrive within one ``nats_client.GATHER_WAIT``."""


@contextmanager
def counted_reads(conn: Connection) -> Iterator[list[int]]:
    """The sizes of the reads the connection's parser gets meanwhile."""
    sizes: list[int] = []
    parser = conn.client._ps
    parse = parser.parse

    async def counting(data: bytes = b"") -> None:
        sizes.append(len(data))
        await parse(data)

    parser.parse = counting
    try:
        yield sizes
    finally:
        del parser.parse


def trickle(port: int, subject: str) -> None:
    """Publish ``MESSAGES`` one at a time, ``GAP`` apart, from a plain socket (not through the connection read)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.recv(4096)  # INFO
        sock.sendall(b"CONNECT %s\r\n" % json.dumps({"verbose": False, "pedantic": False}).encode())
        for n in range(MESSAGES):
            sock.sendall(b"PUB %s %d\r\n%d\r\n" % (subject.encode(), len(str(n)), n))
            time.sleep(GAP)
        sock.sendall(b"PING\r\n")
        sock.recv(4096)  # PONG: the server has every message


def read_trickle(conn: Connection, port: int, owed: int | None) -> list[int]:
    """The reads it took a subscription to get a trickle of messages, the subscription saying it is ``owed`` that
    many messages (None: not a bulk read); checks they all came in order."""
    got: list[bytes] = []
    says = None if owed is None else lambda: owed
    inbox, sid = conn.run(conn.subscribe_raw(lambda _s, _r, payload, _h: got.append(payload), owed=says))
    try:
        with counted_reads(conn) as sizes:
            trickle(port, inbox)
            wait_for(lambda: len(got) == MESSAGES, 5, f"{len(got)} of {MESSAGES} messages arrived")
    finally:
        conn.run(conn.unsubscribe_raw(sid))
    assert got == [str(n).encode() for n in range(MESSAGES)]
    return sizes


@pytest.mark.slow
def test_a_bulk_read_owed_many_messages_takes_what_arrives_within_the_gather_wait_in_one_read(
    conn: Connection, nats_server
):
    plain = read_trickle(conn, nats_server.port, owed=None)
    gathered = read_trickle(conn, nats_server.port, owed=GATHER_OWED)
    assert len(gathered) <= MESSAGES / 2, f"{len(gathered)} reads for {MESSAGES} messages {GAP}s apart"
    assert len(plain) > 1.5 * len(gathered), "the plain read took as few reads: the test shows nothing"
    assert not conn.client.gathering, "an unsubscribed bulk read still gathers"


@pytest.mark.slow
def test_a_bulk_read_owed_few_messages_is_not_held_up(conn: Connection, nats_server):
    """A short request's answer (a small Direct Get batch, small pulls) must not wait for a pause: the server has
    little more to send meanwhile."""
    gathered = read_trickle(conn, nats_server.port, owed=GATHER_OWED)
    few = read_trickle(conn, nats_server.port, owed=GATHER_OWED - 1)
    assert len(few) > 1.5 * len(gathered), f"{len(few)} reads owed few messages, {len(gathered)} owed many"


@pytest.mark.slow
def test_the_read_loop_hands_a_lost_connection_to_the_reconnect(tmp_path):
    """A server restart on the same port: the connection reconnects and answers again (the read loop saw the end
    of the socket and passed it on, as nats-py's does)."""
    server = EmbeddedServer(name="reconnect", store_dir=str(tmp_path)).start()
    options = ConnectionOptions(servers=(server.url,))
    conn = connect(options)
    try:
        api = JetStreamApi(conn)
        api.create_stream({"name": "RL", "subjects": ["rl.>"]})
        server.stop()
        server.start()
        wait_for(lambda: conn.client.is_connected, 10, "the connection did not reconnect")
        assert api.stream_info("RL")["config"]["name"] == "RL"
    finally:
        disconnect(options)
        server.close()
