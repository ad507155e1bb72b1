"""``parser``: the readers' hot path on bytes alone, without a server's or Spark's share: the CPU per message of
parsing deliveries into rows, and of turning the rows into Arrow record batches.

``--messages`` (at most ``MAX_MESSAGES``) x 100 B on 1,024 subjects over 8 partitions, as nats-server 2.15 sends
them, fed to the connection's parser (``FastParser``) in pieces of ``READ`` bytes (what a socket read holds when a
reader is behind), for each reader's bulk handler:

* ``pinned member reader``: deliveries with a ``Nats-Pin-Id`` header block (``HMSG``), into ``Deliveries``;
* ``ephemeral consumer reader``: deliveries without headers (``MSG``), into the batch reads' ``_ConsumerRead``;
* ``Direct Get reader``: Direct Get replies (the server's headers), into ``_DirectReader``.

Each runs ``ROUNDS`` times in turn, the lowest CPU kept (``process_time``; one thread, nothing else in it). This is
what decision 0025 weighs parsers by: a different parser is measured against these figures in the same run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from common import heading
from suite import SIZE, Suite

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.nats_client import RawClient
from spark_jetstream.client.protocol import BulkHandler, RawHandler, wire
from spark_jetstream.read.consumer import _ConsumerRead
from spark_jetstream.read.direct import _DirectReader
from spark_jetstream.read.ranges import MemberRange, SeqRange
from spark_jetstream.read.rows import RowBatches
from spark_jetstream.streaming.config import PullSettings
from spark_jetstream.streaming.deliveries import Deliveries

MAX_MESSAGES = 200_000
READ = 256 * 1024
ROUNDS = 3
SID = 5
STREAM = "PARSER"
PIN = b"NATS/1.0\r\nNats-Pin-Id: 8Jc2kWq9ZxT1bVn3mLp0aa\r\n\r\n"
STAMP = 1_764_200_000_000_000_000


def _subject(seq: int) -> bytes:
    return b"%d.ev.k%d" % (seq % 8, seq % 1024)


def _delivery(seq: int, payload: bytes, headers: bytes | None, count: int) -> bytes:
    reply = b"$JS.ACK.%s.member-0.1.%d.%d.%d.%d" % (STREAM.encode(), seq, seq, STAMP + seq, count - seq)
    return wire(SID, _subject(seq), reply, payload, headers)


def _direct_reply(seq: int, payload: bytes, count: int) -> bytes:
    headers = (
        b"NATS/1.0\r\nNats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\n"
        b"Nats-Time-Stamp: 2026-11-27T10:00:00.%09dZ\r\nNats-Num-Pending: %d\r\n\r\n"
        % (STREAM.encode(), _subject(seq), seq, seq % 1_000_000_000, count - seq)
    )
    return wire(SID, b"_INBOX.parser", b"", payload, headers)


def _feed(data: bytes, bulk: BulkHandler, on_message: RawHandler) -> float:
    """Parse ``data`` in pieces of ``READ`` bytes with the connector's parser; the CPU seconds it took."""
    client = RawClient()
    client.bulk_handlers[SID] = bulk
    client.raw_handlers[SID] = on_message

    async def run() -> float:
        began = time.process_time()
        for start in range(0, len(data), READ):
            await client._ps.parse(data[start : start + READ])
        return time.process_time() - began

    return asyncio.run(run())


def _columns(batches: RowBatches) -> tuple[float, int]:
    """CPU seconds to build every waiting buffer's record batch, and the rows."""
    batches.flush()
    began = time.process_time()
    rows = sum(buffer.to_record_batch(STREAM, True, False).num_rows for buffer in batches.ready)
    return time.process_time() - began, rows


def _pinned(count: int, data: bytes) -> tuple[float, float, int]:
    deliveries = Deliveries(MemberRange(STREAM, "member-0", 0, count), PullSettings(), asyncio.Event(), lambda n: None)
    parse = _feed(data, deliveries.handler(SID), lambda *message: None)
    return (parse, *_columns(deliveries.batches))


def _consumer(count: int, data: bytes, conn: Connection) -> tuple[float, float, int]:
    reader = _ConsumerRead(conn, SeqRange(STREAM, ">", 0, count, True, read_mode="pull"))
    reader.requests = [count]
    parse = _feed(data, reader._bulk(SID), reader._on_message)
    return (parse, *_columns(reader.batches))


def _direct(count: int, data: bytes, conn: Connection) -> tuple[float, float, int]:
    reader = _DirectReader(conn, SeqRange(STREAM, ">", 0, count, True))
    parse = _feed(data, reader._bulk(SID), reader._on_message)
    return (parse, *_columns(reader.batches))


def run(suite: Suite) -> None:
    count = min(suite.args.messages, MAX_MESSAGES)
    heading(f"parser: {count:,} x {SIZE} B in reads of {READ // 1024} KiB, no server, no Spark")
    payload = bytes(i % 256 for i in range(SIZE))
    seqs = range(1, count + 1)
    pinned = b"".join(_delivery(seq, payload, PIN, count) for seq in seqs)
    plain = b"".join(_delivery(seq, payload, None, count) for seq in seqs)
    direct = b"".join(_direct_reply(seq, payload, count) for seq in seqs)
    readers: dict[str, Callable[[], tuple[float, float, int]]] = {
        "pinned member reader (HMSG, pin id)": lambda: _pinned(count, pinned),
        "ephemeral consumer reader (MSG)": lambda: _consumer(count, plain, suite.conn),
        "Direct Get reader (server headers)": lambda: _direct(count, direct, suite.conn),
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(ROUNDS):
        for name, read in readers.items():
            parse, columns, rows = read()
            if rows != count:
                raise SystemExit(f"FAILED: the parser scenario's {name} kept {rows:,} rows of {count:,}")
            last = best.get(name, (parse, columns))
            best[name] = (min(parse, last[0]), min(columns, last[1]))
    print(f"  {'reader':<40} {'parse and rows us/msg':>22} {'record batches us/msg':>22}")
    for name, (parse, columns) in best.items():
        print(f"  {name:<40} {parse / count * 1e6:>22.2f} {columns / count * 1e6:>22.2f}")
