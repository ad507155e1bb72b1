"""The fast protocol parser dispatches exactly what nats-py's parser does, however the bytes arrive."""

from __future__ import annotations

from array import array

import pytest
from helpers import parse_all
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from spark_jetstream.client import protocol
from spark_jetstream.client.protocol import FastParser, run_pattern, wire
from spark_jetstream.client.publish import _STORED
from spark_jetstream.read.rows import RowBuffer, texts

RAW_SID, PLAIN_SID, ACK_SID = 7, 9, 11


def msg(subject: bytes, sid: int, reply: bytes, payload: bytes) -> bytes:
    return b"MSG %s %d %s%d\r\n%s\r\n" % (subject, sid, reply + b" " if reply else b"", len(payload), payload)


def hmsg(subject: bytes, sid: int, reply: bytes, headers: bytes, payload: bytes) -> bytes:
    sizes = b"%d %d" % (len(headers), len(headers) + len(payload))
    return b"HMSG %s %d %s%s\r\n%s%s\r\n" % (subject, sid, reply + b" " if reply else b"", sizes, headers, payload)


PIN_HEADERS = b"NATS/1.0\r\nNats-Pin-Id: abc\r\n\r\n"
STREAM = b"".join(
    [
        msg(b"p.1", RAW_SID, b"$JS.ACK.S.C.1.10.10.123.5", b"hello"),
        hmsg(b"p.2", RAW_SID, b"$JS.ACK.S.C.1.11.11.124.4", PIN_HEADERS, b"world"),
        b"PING\r\n",
        msg(b"no.reply", RAW_SID, b"", b""),
        b"+OK\r\n",
        msg(b"plain.sub", PLAIN_SID, b"_INBOX.x", b"abc"),
        hmsg(b"status", RAW_SID, b"", b"NATS/1.0 100\r\n\r\n", b""),
        b'INFO {"server_id":"x","max_payload":1048576}\r\n',
        msg(b"crlf.in.payload", RAW_SID, b"", b"\r\n\r\n"),
        b"PONG\r\n",
        msg(b"p.3", RAW_SID, b"$JS.ACK.S.C.1.12.12.125.3", b"end"),
    ]
)


def ack(token: int, payload: bytes) -> bytes:
    return msg(b"_INBOX.pub.%d" % token, ACK_SID, b"", payload)


PUBACKS = b"".join(
    [
        *(ack(i, b'{"stream":"S","seq":%d}' % i) for i in range(1, 6)),
        ack(6, b'{"stream":"S","seq":5,"duplicate": true}'),
        ack(7, b'{"stream":"S","domain":"hub","seq":6}'),
        msg(b"p.1", RAW_SID, b"$JS.ACK.S.C.1.10.10.123.5", b"hello"),
        ack(8, b'{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"},"seq":0}'),
        hmsg(b"_INBOX.pub.9", ACK_SID, b"", b"NATS/1.0 503\r\n\r\n", b""),
        ack(10, b'{"stream":"S","seq":7}'),
        ack(11, b'{"stream":"S","seq":8}'),
        b"PING\r\n",  # nats-py's parser has this line alone: the runs after it are taken in runs too
        msg(b"_INBOX.pub.12", ACK_SID, b"_INBOX.reply", b'{"stream":"S","seq":9}'),  # a reply: not a PubAck
        ack(13, b'{"stream":"S","seq":10}'),
        ack(14, b'{"stream":"S","seq":11}'),
    ]
)


class Client:
    """The small interface a parser talks to, recording what it was handed.

    Runs are recorded as the messages they hold, so a run handler's view compares with nats-py's.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None, bytes, bytes, bytes, bytes | None]] = []
        self.raw_handlers = {RAW_SID: self.raw, ACK_SID: self.raw}
        self.bulk_handlers = {ACK_SID: self.bulk}
        self.runs: list[int] = []
        self.infos: list[dict] = []

    def bulk(self, buf: bytearray, view: memoryview, pos: int) -> int:
        """Takes runs of stored PubAcks, as the writer's bulk handler does."""
        if matched := run_pattern(ACK_SID, _STORED).match(buf, pos):
            self.run(bytes(view[pos : matched.end()]))
            return matched.end()
        return pos

    def run(self, run: bytes) -> None:
        lines = run.split(b"\r\n")
        assert lines.pop() == b"", "a run ends at a message's end"
        for line, payload in zip(lines[::2], lines[1::2], strict=True):
            self.seen.append(("raw", None, line.split()[1], b"", payload, None))
        self.runs.append(len(lines) // 2)

    def raw(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.seen.append(("raw", None, bytes(subject), bytes(reply), data, headers))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        kind = "raw" if sid in self.raw_handlers else "plain"
        self.seen.append((kind, None if kind == "raw" else sid, bytes(subject), bytes(reply), data, headers))

    async def _process_ping(self) -> None:
        self.seen.append(("ping", None, b"", b"", b"", None))

    async def _process_pong(self) -> None:
        self.seen.append(("pong", None, b"", b"", b"", None))

    async def _process_info(self, info: dict) -> None:
        self.infos.append(info)

    async def _process_err(self, message: str) -> None:
        raise AssertionError(message)


def dispatched(parser_class: type[Parser], chunks: list[bytes], client: Client | None = None) -> tuple[list, list]:
    client = client or Client()
    parse_all(parser_class(client), chunks)
    return client.seen, client.infos


def test_whole_stream_matches_nats_py():
    expected = dispatched(Parser, [STREAM])
    assert [entry[0] for entry in expected[0]] == ["raw", "raw", "ping", "raw", "plain", "raw", "raw", "pong", "raw"]
    assert dispatched(FastParser, [STREAM]) == expected


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 31, 64])
def test_any_chunking_matches_nats_py(size):
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert dispatched(FastParser, chunks) == dispatched(Parser, [STREAM])


def test_headers_and_payload_are_split_at_the_header_size():
    seen, _ = dispatched(FastParser, [STREAM])
    assert seen[1] == ("raw", None, b"p.2", b"$JS.ACK.S.C.1.11.11.124.4", b"world", PIN_HEADERS)
    assert next(entry[4] for entry in seen if entry[2] == b"crlf.in.payload") == b"\r\n\r\n"


@pytest.mark.parametrize("line", [b"MSG p.1 x 5\r\nhello\r\n", b"HMSG p.1 7 5\r\nhello\r\n", b"MSG p.1 7 -\r\n"])
def test_malformed_message_lines_are_protocol_errors(line):
    with pytest.raises(ProtocolError):
        dispatched(FastParser, [line])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 31, 64, len(PUBACKS)])
def test_pubacks_in_runs_match_nats_py_under_any_chunking(size):
    client = Client()
    chunks = [PUBACKS[i : i + size] for i in range(0, len(PUBACKS), size)]
    assert dispatched(FastParser, chunks, client) == dispatched(Parser, [PUBACKS])
    assert sum(client.runs) <= 11  # never the error, the status or the message with a reply
    if size == len(PUBACKS):
        assert client.runs == [7, 2, 2]  # stored PubAcks in one call per run, after a PING too


def test_a_run_is_not_taken_for_another_subscription():
    other = PUBACKS.replace(b" %d " % ACK_SID, b" %d " % RAW_SID)
    client = Client()
    assert dispatched(FastParser, [other], client) == dispatched(Parser, [other])
    assert client.runs == []


def test_wire_is_what_the_parsers_read():
    for message in (
        (RAW_SID, b"p.1", b"$JS.ACK.S.C.1.10.10.123.5", b"hello", None),
        (RAW_SID, b"p.2", b"", b"", PIN_HEADERS),
        (RAW_SID, b"p.3", b"r", b"\r\n", PIN_HEADERS),
    ):
        _, subject, reply, payload, headers = message
        seen, _ = dispatched(Parser, [wire(*message)])
        assert seen == [("raw", None, subject, reply, payload, headers)]


class DeliveriesClient(Client):
    """``Client`` whose raw subscription takes its JetStream deliveries in runs (``protocol.deliveries_handler``, the
    implementation in use), recorded one by one as nats-py's parser would hand them over (a run has no replies)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = RowBuffer(keep_headers=True)  # what the bulk handler appends to
        self.bulk_handlers = {RAW_SID: protocol.deliveries_handler(RAW_SID, self, self.deliver)}

    def deliver(self, rows: RowBuffer, first: int, header: bytes | None, drained: int) -> None:
        end = len(rows)
        for subject, payload, block in zip(
            texts(rows.subjects, rows.subject_ends, first, end),
            texts(rows.payload, rows.offsets, first, end),
            rows.header_blocks()[first:],
            strict=True,
        ):
            self.seen.append(("raw", None, subject, b"<delivery>", payload, block))
        self.runs.append(end - first)


def _deliveries_as_runs(entries: list) -> list:
    """nats-py's record of ``STREAM`` with each JetStream delivery's reply left out, as a run records it."""
    return [(*entry[:3], b"<delivery>", *entry[4:]) if entry[3].startswith(b"$JS.ACK.") else entry for entry in entries]


@pytest.mark.usefixtures("bulk_parsers")
@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 31, 64, len(STREAM)])
def test_deliveries_in_runs_match_nats_py_under_any_chunking(size):
    client = DeliveriesClient()
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    seen, infos = dispatched(Parser, [STREAM])
    assert dispatched(FastParser, chunks, client) == (_deliveries_as_runs(seen), infos)
    assert sum(client.runs) == 3


def test_a_run_that_would_take_a_column_past_2_gib_is_refused_whole():
    """The ends of the rows' texts are 32-bit (Arrow's ``binary``): a run past them appends nothing."""

    class Huge(bytearray):
        def __len__(self) -> int:
            return 2**31 - 5

    subjects, subject_ends = bytearray(b"a"), array("i", [0, 1])
    payload, offsets = Huge(), array("i", [0, 7])
    with pytest.raises(OverflowError, match="past 2 GiB"):
        protocol._append([(subjects, subject_ends, [b"s"]), (payload, offsets, [b"12", b"3456"])], [])
    assert (subjects, subject_ends, offsets) == (b"a", array("i", [0, 1]), array("i", [0, 7]))


@pytest.mark.parametrize("line", [b"HELLO\r\n", b"X" * 5000 + b"\r\n"], ids=["short", "long"])
def test_a_line_nats_py_does_not_know_is_a_protocol_error(line):
    """A short one as nats-py's parser says; a long one, which it would keep waiting for more, too."""
    with pytest.raises(ProtocolError):
        dispatched(FastParser, [msg(b"p.1", RAW_SID, b"", b"a") + line + msg(b"p.2", RAW_SID, b"", b"b")])


def test_a_parser_reset_by_a_lines_handler_dispatches_nothing_after_it():
    """A reconnect resets the parser: what followed the line in the buffer came on the old connection."""
    client = Client()
    parser = FastParser(client)

    async def stale(message: str) -> None:
        client.seen.append(("err", None, message.encode(), b"", b"", None))
        parser.reset()

    client._process_err = stale  # type: ignore[method-assign]
    stream = msg(b"p.1", RAW_SID, b"", b"a") + b"-ERR 'Stale Connection'\r\n" + msg(b"p.2", RAW_SID, b"", b"b")
    parse_all(parser, [stream])
    assert client.seen == [("raw", None, b"p.1", b"", b"a", None), ("err", None, b"'stale connection'", b"", b"", None)]
    assert parser.buf == b""
