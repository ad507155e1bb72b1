"""Hostile input: odd subjects, repeated and non-ASCII headers, empty and 8 MB payloads."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from helpers import wait_for

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.groups.layout import member_consumer_config, partition_filters, partitioned_stream_config
from spark_jetstream.read import direct
from spark_jetstream.read.direct import read_range
from spark_jetstream.read.ranges import MemberRange, SeqRange
from spark_jetstream.streaming.pull import PullSettings, read_member
from spark_jetstream.testing import EmbeddedServer

BIG = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def big_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer({"max_payload": 16 * 1024 * 1024}, name="hostile") as server:
        yield server
        disconnect(ConnectionOptions(servers=(server.url,)))


def raw_publish(url: str, messages: list[tuple[str, bytes, bytes]]) -> None:
    """Publish (subject, raw header block, payload) over the plain protocol: repeated header keys
    cannot be expressed through nats-py's header dict."""
    host, port = url.removeprefix("nats://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.recv(65536)  # INFO
        sock.sendall(b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\n')
        for subject, headers, payload in messages:
            head = f"HPUB {subject} {len(headers)} {len(headers) + len(payload)}\r\n".encode()
            sock.sendall(head + headers + payload + b"\r\n")
        sock.sendall(b"PING\r\n")
        reply = b""
        while b"PONG" not in reply:
            chunk = sock.recv(65536)
            assert chunk and b"-ERR" not in chunk, chunk
            reply += chunk


def test_odd_subjects_headers_and_payload_sizes_come_back_exactly(big_server, monkeypatch):
    conn = connect(ConnectionOptions(servers=(big_server.url,)))
    api = JetStreamApi(conn)
    api.create_stream(partitioned_stream_config("H", "h.*", 1, max_msg_size=16 * 1024 * 1024))
    api.create_consumer("H", member_consumer_config("g", "0", partition_filters([0])))
    tokens = ["plain", "with-dash_and_underscore", "ünïcödé", "emoji-🚀", "quote'\"", "a=b&c%20", "~!@#$^()[]{}|;,<>"]
    header_blocks = [
        b"NATS/1.0\r\nKey: one\r\nKey: two\r\nKey: three\r\n\r\n",
        b"NATS/1.0\r\nEmpty:\r\nSpaced:    padded value  \r\n\r\n",
        "NATS/1.0\r\nLanguage: Français 日本語\r\n\r\n".encode(),
        b"NATS/1.0\r\n\r\n",
        # What a Direct Get reply's server headers look like, as the message's own: the reader must take the server's.
        b"NATS/1.0\r\nNats-Stream: fake\r\nNats-Subject: 9.fake\r\nNats-Sequence: 999\r\n"
        b"Nats-Time-Stamp: 2001-01-01T00:00:00Z\r\nNats-Num-Pending: 0\r\n\r\n",
    ]
    payloads = [b"", b"\x00" * 3, bytes(range(256)), b"x" * BIG]
    messages = [
        (f"h.{token}", header_blocks[i % len(header_blocks)], payloads[i % len(payloads)])
        for i, token in enumerate(tokens * 2)
    ]
    raw_publish(big_server.url, messages)

    def last_seq() -> int:
        return api.stream_info("H")["state"]["last_seq"]

    # core publishes are stored asynchronously
    wait_for(lambda: last_seq() >= len(messages), 10, "the server to store every message", poll=0.05)
    last = last_seq()
    assert last == len(messages)
    settings = PullSettings(batch=3, in_flight=2, max_bytes=1024 * 1024, record_batch_size=4)
    rows = [
        row
        for batch in read_member(conn, MemberRange("H", "g-0", 0, last, include_headers=True), settings)
        for row in batch.to_pylist()
    ]
    assert [row["seq"] for row in rows] == list(range(1, last + 1))
    expected_headers = [
        [("Key", ["one", "two", "three"])],
        [("Empty", [""]), ("Spaced", ["padded value"])],
        [("Language", ["Français 日本語"])],
        [],
        [
            ("Nats-Stream", ["fake"]),
            ("Nats-Subject", ["9.fake"]),
            ("Nats-Sequence", ["999"]),
            ("Nats-Time-Stamp", ["2001-01-01T00:00:00Z"]),
            ("Nats-Num-Pending", ["0"]),
        ],
    ]
    for index, (row, (subject, _, payload)) in enumerate(zip(rows, messages, strict=True)):
        assert row["subject"] == subject
        assert row["data"] == payload
        assert row["headers"] == expected_headers[index % len(header_blocks)]
    # Direct Get (what streaming and batch reads use) gives the same rows, in record batches of 4 from Direct Gets of 3.
    seq_range = SeqRange(
        "H", "0.>", 0, last, partitioned=True, include_headers=True, direct_batch=3, record_batch_size=4
    )
    assert [row for batch in read_range(conn, seq_range) for row in batch.to_pylist()] == rows
    # Replies the bulk parser does not recognise (another server version's headers) take the per-message path.
    monkeypatch.setattr(
        direct, "direct_replies_handler", lambda sid, stream, keep, keep_headers: lambda buf, view, pos: pos
    )
    assert [row for batch in read_range(conn, seq_range) for row in batch.to_pylist()] == rows
