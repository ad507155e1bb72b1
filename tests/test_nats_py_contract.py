"""The nats-py internals the connector relies on, listed once and checked against the installed nats-py.

The hot paths (the lean protocol parser, raw subscriptions, the pipelined publisher) and the TLS guard
reach under nats-py's public API. setup.cfg pins nats-py to one minor version; when that pin moves,
these tests say which internal changed instead of a pull or a write failing in production. Every entry
names where the package uses it. Only the last test needs a server (what exists only once connected).
"""

from __future__ import annotations

import asyncio
import configparser
import inspect
from importlib.metadata import version
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.protocol import parser
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

CLIENT_ATTRIBUTES = {
    # attribute set by Client.__init__: where the package uses it
    "_ps": "nats_client.RawClient.__init__ swaps in protocol.FastParser (the lean MSG/HMSG parser)",
    "_subs": "connection.Connection.unsubscribe_raw (sid -> Subscription)",
    "_current_server": "nats_client.RawClient._connect_command, _tls_active, server_address (the URL connected to)",
    "_transport": "nats_client.RawClient._tls_active (is the connection TLS?), _read_loop (its socket and protocol)",
    "_pending": "publish.Publisher.send (appends whole PUB/HPUB commands to the write buffer)",
    "_pending_data_size": "publish.Publisher.send (counts the bytes it appended)",
    "_flush_queue": "publish.Publisher.send (kicks the flusher when it is idle)",
    "_error_cb": "nats_client.RawClient._read_loop reports an unexpected end of the socket to it",
    "_pongs": "nats_client.RawClient._process_pong, busy_for (the futures of the pings sent, oldest first)",
    "_pongs_received": "nats_client.RawClient._process_pong counts a PONG as nats-py does",
    "_pings_outstanding": "nats_client.RawClient._process_pong clears it as nats-py does",
    "stats": "nats_client.RawClient.busy_for (its 'reconnects': whether the connection moved meanwhile)",
}

CLIENT_METHODS = {
    # method: (its parameters after self, where the package uses or overrides it)
    "_process_info": (["info", "initial_connection"], "nats_client.RawClient overrides it (asks for TLS)"),
    "_connect_command": ([], "nats_client.RawClient overrides it (no CONNECT over plain text when TLS was asked)"),
    "_process_msg": (
        ["sid", "subject", "reply", "data", "headers"],
        "protocol.FastParser calls it for other subscriptions",
    ),
    "_flush_pending": (["force_flush"], "publish.Publisher.send calls it with no argument"),
    "_read_loop": ([], "nats_client.RawClient overrides it (reads into the parser's buffer, a socket low-water mark)"),
    "_process_op_err": (
        ["e"],
        "nats_client.RawClient._read_loop hands it a lost connection, _leave_silent a silent one (the reconnect)",
    ),
    "_ping_interval": ([], "nats_client.RawClient overrides it (a silent server is left within silenceTimeout)"),
    "_send_ping": (["future"], "nats_client.RawClient._ping_interval pings a quiet server, busy_for a busy one"),
    "_process_pong": ([], "nats_client.RawClient overrides it (a PONG whose waiter gave up is dropped)"),
}

SOURCE_FACTS = [
    # (function, text its source must contain, what the package relies on, where)
    (
        Client._process_connect_init,
        "self._server_info = srv_info",
        "the INFO dict _process_info gets is the one the TLS upgrade then reads",
        "nats_client.RawClient._process_info",
    ),
    (
        Client._process_connect_init,
        "await self._process_info(srv_info, initial_connection=True)",
        "_process_info sees the first INFO before the TLS decision",
        "nats_client.RawClient._process_info",
    ),
    (
        Client._process_connect_init,
        "connect_cmd = self._connect_command()",
        "CONNECT (the credentials) is built after the TLS upgrade, right before it is sent",
        "nats_client.RawClient._connect_command",
    ),
    (
        Client._process_connect_init,
        "create_task(self._read_loop())",
        "the connect and every reconnect start the read loop through self, so RawClient's override is the one run",
        "nats_client.RawClient._read_loop",
    ),
    (
        Client._read_loop,
        "await self._process_op_err(err)",
        "nats-py hands an unexpected end of the socket to the reconnect (after the error callback), as ours does",
        "nats_client.RawClient._read_loop",
    ),
    (
        Client._read_loop,
        "except errors.ProtocolError:",
        "nats-py reconnects on a protocol error, as ours does",
        "nats_client.RawClient._read_loop",
    ),
    (
        Client._read_loop,
        "except OSError as e:",
        "nats-py reconnects on a socket error, as ours does",
        "nats_client.RawClient._read_loop",
    ),
    (
        Client._process_connect_init,
        "create_task(self._ping_interval())",
        "the connect and every reconnect start the pings through self, so RawClient's override is the one run",
        "nats_client.RawClient._ping_interval",
    ),
    (
        Client._attempt_reconnect,
        "self._reconnect_to_server_handler(",
        "the reconnect asks the handler given as reconnect_to_server_handler which server to try next",
        "nats_client.RawClient.next_server",
    ),
    (
        Client._process_pong,
        "self._pongs.pop(0)",
        "a PONG answers the oldest ping; the pings RawClient._ping_interval and busy_for send are answered in order",
        "nats_client.RawClient._process_pong",
    ),
    (
        Client._send_command,
        "self._pending.append(cmd)",
        "the write buffer is a list of byte chunks plus a byte count, as Publisher.send fills it",
        "publish.Publisher.send",
    ),
    (
        parser.Parser.reset,
        "self.state = AWAITING_CONTROL_LINE",
        "a reset parser has nothing left of a line whose handler raised",
        "protocol.FastParser._control",
    ),
    (
        parser.Parser.parse,
        "await self.nc._process_msg(sid, subject, reply, payload, hdr)",
        "nats-py's parser hands a message over positionally, as FastParser does",
        "protocol.FastParser.parse",
    ),
    (
        Subscription.__init__,
        "self._id = id",
        "a subscription's sid is its _id, the key of Client._subs and of the raw handlers",
        "connection.Connection.subscribe_raw",
    ),
    (
        TcpTransport.connect_tls,
        "self._io_writer",
        "a TCP transport keeps its (TLS) stream writer in _io_writer",
        "nats_client.RawClient._tls_active, _LowWater.of (the socket under it), _Feed.of (its transport)",
    ),
    (
        TcpTransport.connect_tls,
        "self._io_reader, self._io_writer = reader, writer",
        "a TLS connection's stream reader is _io_reader, as a plain one's",
        "nats_client._Feed.of (what it read before the switch; the end of the stream)",
    ),
    (
        TcpTransport.at_eof,
        "return self._io_reader.at_eof()",
        "the end of the stream is the stream reader's, which the feed's protocol still feeds",
        "nats_client.RawClient._read_loop",
    ),
    (
        asyncio.StreamReader.read,
        "del self._buffer[:n]",
        "a stream reader holds what it read and nobody took yet in _buffer (a bytearray)",
        "nats_client._Feed.of (moves it into the parser's buffer)",
    ),
]


def test_the_installed_nats_py_is_the_pinned_one():
    """The facts below are checked against the installed nats-py: it must be the version setup.cfg pins."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    requirements = [Requirement(line) for line in setup["options"]["install_requires"].split("\n") if line.strip()]
    nats_py = next(r for r in requirements if r.name == "nats-py")
    assert nats_py.specifier.contains(version("nats-py")), f"installed nats-py {version('nats-py')} vs {nats_py}"


@pytest.mark.parametrize("name", sorted(CLIENT_ATTRIBUTES))
def test_client_attributes(name):
    assert hasattr(Client(), name), f"nats-py's Client has no {name} any more: used by {CLIENT_ATTRIBUTES[name]}"


@pytest.mark.parametrize("name", sorted(CLIENT_METHODS))
def test_client_methods(name):
    params, where = CLIENT_METHODS[name]
    method = getattr(Client, name, None)
    assert callable(method), f"nats-py's Client has no {name} any more: {where}"
    assert list(inspect.signature(method).parameters)[1:] == params, f"Client.{name} changed its parameters: {where}"


@pytest.mark.parametrize(
    ("function", "text", "why", "where"),
    SOURCE_FACTS,
    ids=[f"{fact[0].__qualname__}-{n}" for n, fact in enumerate(SOURCE_FACTS)],
)
def test_source_facts(function, text, why, where):
    assert text in inspect.getsource(function), f"{function.__qualname__} changed: {why} ({where})"


def test_parser_internals():
    """protocol.FastParser subclasses Parser and works on its buffer and state between calls."""
    parsed = parser.Parser(nc="client")
    assert parsed.nc == "client"
    assert isinstance(parsed.buf, bytearray)
    assert parsed.state == parser.AWAITING_CONTROL_LINE
    assert list(inspect.signature(parser.Parser.parse).parameters) == ["self", "data"]
    assert list(inspect.signature(parser.Parser.reset).parameters) == ["self"]


def test_the_raw_client_keeps_its_parser():
    """nats_client.RawClient's parser is the lean one, and nats-py's own reset() keeps it (reconnects)."""
    from spark_jetstream.client.nats_client import RawClient
    from spark_jetstream.client.protocol import FastParser

    client = RawClient()
    assert isinstance(client._ps, FastParser)
    client._ps.reset()
    assert isinstance(client._ps, FastParser) and client._ps.state == parser.AWAITING_CONTROL_LINE


def test_internals_of_a_connected_client(conn):
    """What exists only once connected: the server's version (public, but set only by the connect), the
    flusher's queue, the TCP writer and the read loop's feed as its transport's protocol, sids."""
    from spark_jetstream.client.nats_client import _Feed

    client = conn.client
    version = client.connected_server_version
    assert (version.major, version.minor) >= (2, 15), version
    assert client._flush_queue is not None
    assert client._transport._io_writer is not None
    assert isinstance(client._transport._io_writer.transport.get_protocol(), _Feed)
    _, sid = conn.run(conn.subscribe_raw(lambda *_: None))
    try:
        assert client._subs[sid]._id == sid
    finally:
        conn.run(conn.unsubscribe_raw(sid))
