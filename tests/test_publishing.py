"""The writer's wire commands (PUB/HPUB bytes), built without a server or Spark: a pure rule."""

from __future__ import annotations

import pytest


def _commands(raw: bytes) -> list[tuple[str, str, list[tuple[str, str]] | None, bytes]]:
    """(subject, reply, header lines or None for PUB, payload) of each PUB/HPUB command, sizes checked."""
    out, pos = [], 0
    while pos < len(raw):
        eol = raw.index(b"\r\n", pos)
        args = raw[pos:eol].split()
        header_size, size = (0, int(args[3])) if args[0] == b"PUB" else (int(args[3]), int(args[4]))
        body = raw[eol + 2 : eol + 2 + size]
        assert raw[eol + 2 + size : eol + 4 + size] == b"\r\n", "a command's size field is wrong"
        lines = None
        if args[0] == b"HPUB":
            block = body[:header_size]
            assert block.startswith(b"NATS/1.0\r\n") and block.endswith(b"\r\n\r\n")
            lines = [tuple(line.split(": ", 1)) for line in block[10:-4].decode().split("\r\n") if line]
        out.append((args[1].decode(), args[2].decode(), lines, body[header_size:]))
        pos = eol + 4 + size
    return out


@pytest.mark.parametrize("deduplicate", [True, False])
@pytest.mark.parametrize("expected", [None, "W7"])
@pytest.mark.parametrize("columns", ["subject,data", "data", "subject,data,msg_id", "subject,data,headers"])
def test_commands_carry_exactly_the_headers_asked_for(deduplicate, expected, columns):
    """The writer's PUB/HPUB bytes for every mix of options and columns: framing, reply tokens and
    header lines (generated ids, given ids, a row's own Nats-Msg-Id header, the expected stream)."""
    import pyarrow as pa

    from spark_jetstream.client.connection import ConnectionOptions
    from spark_jetstream.sink.config import Columns, SinkConfig
    from spark_jetstream.sink.publishing import Commands, value_range

    names = columns.split(",")
    values = {
        "subject": pa.array(["a.1", "b.2", "c.3"]),
        "data": pa.array([b"x", b"", b"zz"]),
        "msg_id": pa.array(["id-0", None, "id-2"]),
        "headers": pa.array(
            [[("k", ["v"])], [], [("Nats-Msg-Id", ["own"]), ("k", ["1", "2"])]],
            pa.map_(pa.string(), pa.list_(pa.string())),
        ),
    }
    rows = pa.RecordBatch.from_arrays([values[n] for n in names], names)
    config = SinkConfig(
        ConnectionOptions(servers=("nats://127.0.0.1:1",)),
        "d.subject",
        deduplicate=deduplicate,
        expected_stream=expected,
    )
    at = {n: names.index(n) if n in names else None for n in values}
    builder = Commands(
        config,
        Columns(data=at["data"], subject=at["subject"], headers=at["headers"], msg_id=at["msg_id"]),
        "q:7:1:",
        1 << 20,
    )
    commands = _commands(bytes(value_range(builder.build(rows, 40, b"_INBOX.r."))))

    for i, (subject, reply, lines, payload) in enumerate(commands):
        assert (subject, reply, payload) == (
            values["subject"][i].as_py() if "subject" in names else "d.subject",
            f"_INBOX.r.{40 + i}",
            values["data"][i].as_py(),
        )
        wanted = []
        if "headers" in names:
            wanted += [(key, value) for key, vals in values["headers"][i].as_py() for value in vals]
        own_id = any(key == "Nats-Msg-Id" for key, _ in wanted)
        given = values["msg_id"][i].as_py() if "msg_id" in names else None
        if not own_id and (given or deduplicate):
            wanted.append(("Nats-Msg-Id", given or f"q:7:1:{40 + i}"))
        if expected:
            wanted.append(("Nats-Expected-Stream", expected))
        assert (lines or []) == wanted
        # plain PUB only when no row of the slice can have a header
        assert (lines is None) == (
            not deduplicate and not expected and "headers" not in names and "msg_id" not in names
        )
    assert len(commands) == 3


def test_write_slices_stay_within_their_row_and_byte_bounds():
    """A task's rows go out in slices of at most ``max_rows`` rows and ``max_bytes`` payload bytes (a larger
    row alone), covering every row once, in order."""
    import random
    from itertools import accumulate

    from spark_jetstream.sink.publishing import slices

    rng = random.Random(5)
    sizes = [rng.choice([0, 1, 500, 1000, 1001, 4000]) for _ in range(300)]
    cut = list(slices(list(accumulate(sizes)), 6, 2000))
    assert [start for start, _ in cut] == list(accumulate([0] + [n for _, n in cut[:-1]]))
    assert sum(n for _, n in cut) == len(sizes)
    for start, n in cut:
        assert 1 <= n <= 6
        assert sum(sizes[start : start + n]) <= 2000 or n == 1
        if start + n < len(sizes) and n < 6:  # a slice ends early only because the next row would not fit
            assert sum(sizes[start : start + n + 1]) > 2000
    assert list(slices([], 6, 2000)) == []


def test_a_message_sent_again_while_the_stream_stores_the_first_waits_for_that_ones_puback(conn):
    """``duplicate message id is in process`` (10158) answers a message sent again while the stream still stores
    the first: the message stays owed, its first PubAck answers it (a streaming write's task failed on it)."""
    from spark_jetstream.client.publish import Publisher, _split, command, header_block

    publisher = Publisher(conn, resend=True)
    publisher.reserve(2, lambda i: f"s.{i}")
    publisher.sent = 2
    in_process = b'{"error":{"code":503,"err_code":10158,"description":"duplicate message id is in process"}}'
    publisher._on_ack(publisher.reply_prefix + b"0", b"", in_process, None)
    assert (publisher.failures, publisher.outstanding) == ([], 2)
    publisher._on_ack(publisher.reply_prefix + b"0", b"", b'{"stream":"S","seq":1}', None)
    other = b'{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}'
    publisher._on_ack(publisher.reply_prefix + b"1", b"", other, None)
    assert publisher.result.count == 1
    assert publisher.failures == ["Publishing to 's.1' failed: expected stream does not match (error 10060)"]
    # what goes out again is cut from the commands as sent, one message at a time
    parts = [
        command(b"s.0", b"r.0", b"x" * 10, None),
        command(b"s.1", b"r.1", b"y\r\nPUB a b 1\r\n", header_block({"Nats-Msg-Id": "1"})),
        command(b"s.2", b"r.2", b"", None),
    ]
    assert [bytes(part) for part in _split(b"".join(parts))] == parts
