"""A Direct Get reader keeps exactly the messages of its replies, whichever path parses them and however the bytes
arrive: the bulk path (runs taken straight from the read buffer) and the per-message path give the same rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import parse_all

from spark_jetstream.client.protocol import FastParser, wire
from spark_jetstream.read import direct
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.read.rows import texts

pytestmark = pytest.mark.usefixtures("bulk_parsers")  # each test on both implementations of the bulk handlers

SID, OTHER_SID = 7, 8
INBOX = b"_INBOX.reader"
STAMP = b"2026-11-26T02:10:50.123456789Z"


def reply(seq: int, payload: bytes, own: bytes = b"", sid: int = SID, pending: int | None = 0) -> bytes:
    """A Direct Get reply as nats-server 2.15 writes it: the message's own headers, then the server's."""
    server = b"Nats-Stream: S\r\nNats-Subject: %d.ev.k%d\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\n" % (
        seq % 3,
        seq,
        seq,
        STAMP,
    )
    if pending is not None:
        server += b"Nats-Num-Pending: %d\r\n" % pending
    headers = b"NATS/1.0\r\n" + own + server + b"\r\n"
    sizes = b"%d %d" % (len(headers), len(headers) + len(payload))
    return b"HMSG %s %d %s\r\n%s%s\r\n" % (INBOX, sid, sizes, headers, payload)


FAKE = reply(99, b"fake", sid=SID)  # a whole reply of this subscription, inside a payload
REPLIES = [
    reply(1, b"one"),
    reply(2, b""),
    reply(3, b"crlf\r\n\r\nin payload"),
    reply(4, b"x" + b"\r\n" + FAKE),
    reply(5, b"own headers", own=b"Key: a\r\nKey: b\r\nNats-Stream: fake\r\nNats-Sequence: 999\r\n"),
    reply(6, bytes(range(256)) * 20),  # larger than a run takes: the per-message path
    b"PING\r\n",
    reply(7, b"after a ping", pending=None),
    reply(8, b"another subscription's", sid=OTHER_SID),
    *(reply(seq, b"run %d" % seq) for seq in range(9, 40)),
    reply(40, FAKE + b"\r\n" + FAKE),
    reply(41, b"last", pending=0),
    b"HMSG %s %d 16 16\r\nNATS/1.0 204\r\n\r\n\r\n" % (INBOX, SID),  # end of batch
]
WIRE = b"".join(REPLIES)
KEPT = [seq for seq in range(1, 42) if seq != 8]


class Client:
    def __init__(self, reader: direct._DirectReader, bulk: bool) -> None:
        self.raw_handlers = {SID: reader._on_message}
        self.bulk_handlers = {SID: reader._bulk(SID)} if bulk else {}
        self.others: list[bytes] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """As ``RawClient``'s: what nats-py's parser read (after a PING) goes to the subscription's handlers."""
        if sid not in self.raw_handlers:
            self.others.append(data)
            return
        message = bytearray(wire(sid, subject, reply, data, headers))
        if SID in self.bulk_handlers and self.bulk_handlers[SID](message, memoryview(message), 0):
            return
        self.raw_handlers[sid](subject, reply, data, headers)

    async def _process_ping(self) -> None:
        pass


def read(chunks: list[bytes], bulk: bool) -> tuple[list[tuple], list[bytes]]:
    conn = SimpleNamespace(options=SimpleNamespace(api_prefix="$JS.API"))
    reader = direct._DirectReader(conn, SeqRange("S", ">", 0, 100, partitioned=True, include_headers=True))  # type: ignore[arg-type]
    client = Client(reader, bulk)
    parse_all(FastParser(client), chunks)
    assert reader.batch_done.is_set() and reader.error is None
    reader.batches.flush()
    rows = [
        row
        for rows in reader.batches.ready
        for row in zip(
            texts(rows.subjects, rows.subject_ends, 0, len(rows)),
            texts(rows.payload, rows.offsets, 0, len(rows)),
            rows.seqs,
            texts(rows.times, rows.time_ends, 0, len(rows)),  # type: ignore[arg-type]
            rows.header_blocks(),
            strict=True,
        )
    ]
    return rows, client.others


@pytest.mark.parametrize("size", [1, 7, 64, 333, 4096, len(WIRE)])
def test_bulk_and_per_message_paths_keep_the_same_rows(size):
    chunks = [WIRE[i : i + size] for i in range(0, len(WIRE), size)]
    rows, others = read(chunks, bulk=True)
    assert [row[2] for row in rows] == KEPT
    assert rows == read([WIRE], bulk=False)[0]
    assert others == [b"another subscription's"]
    by_seq = {row[2]: row for row in rows}
    assert by_seq[4][1] == b"x\r\n" + FAKE
    assert by_seq[40][1] == FAKE + b"\r\n" + FAKE
    assert by_seq[6][1] == bytes(range(256)) * 20
    assert by_seq[5][4] == b"NATS/1.0\r\nKey: a\r\nKey: b\r\nNats-Stream: fake\r\nNats-Sequence: 999\r\n\r\n"
    assert by_seq[1] == (b"1.ev.k1", b"one", 1, STAMP, None)  # no headers of its own


def test_a_run_is_taken_in_one_step():
    run = b"".join(reply(seq, b"p" * 100) for seq in range(1, 301))
    conn = SimpleNamespace(options=SimpleNamespace(api_prefix="$JS.API"))
    reader = direct._DirectReader(conn, SeqRange("S", ">", 0, 1000, partitioned=True))  # type: ignore[arg-type]
    calls: list[int] = []
    keep = reader._keep
    reader._keep = lambda rows, first, pending: (calls.append(len(rows) - first), keep(rows, first, pending))  # type: ignore[method-assign]
    buf = bytearray(run)
    assert reader._bulk(SID)(buf, memoryview(buf), 0) == len(run)
    assert calls == [300] and reader.last == 300 and reader.pending == 0
