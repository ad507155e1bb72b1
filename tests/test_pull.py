"""The pinned pull reader against a real nats-server: exact ranges, replay, fencing, no acks."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from types import SimpleNamespace
from typing import cast

import pyarrow as pa
import pytest

from spark_jetstream.client.connection import Connection, ConnectionOptions
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.nats_client import RawClient
from spark_jetstream.client.protocol import wire
from spark_jetstream.errors import ConsumerNotFoundError, FencedError, ReaderError, StreamNotFoundError
from spark_jetstream.groups.layout import member_consumer_config, partition_filters
from spark_jetstream.options import ACK_POLICIES
from spark_jetstream.read.ranges import MemberRange
from spark_jetstream.streaming.pull import PullSettings, _PinnedPull, read_member

SMALL = PullSettings(batch=50, in_flight=3, expires=2.0, idle_heartbeat=0.5, record_batch_size=70)


def read_all(conn: Connection, member: MemberRange, settings: PullSettings = SMALL) -> pa.Table:
    batches = list(read_member(conn, member, settings))
    return pa.Table.from_batches(batches) if batches else pa.table({"seq": pa.array([], pa.int64())})


def test_each_member_yields_exactly_its_messages_in_any_range(conn, make_stream):
    stream = make_stream(3000, partitions=4)
    rng = random.Random(11)
    ranges = [(0, stream.last_seq), (0, 1), (stream.last_seq - 1, stream.last_seq)]
    ranges += [tuple(sorted(rng.sample(range(stream.last_seq + 1), 2))) for _ in range(6)]
    for start, end in ranges:
        for p in range(4):
            member = MemberRange(stream.name, stream.consumer(p), start, end)
            table = read_all(conn, member)
            expected = stream.expected(p, start, end)
            assert table.column("seq").to_pylist() == expected, (p, start, end)
            if not expected:
                continue
            rows = table.to_pylist()
            for row in rows:
                subject, payload, _, partition = stream.messages[row["seq"]]
                assert row["subject"] == subject
                assert row["data"] == payload
                assert row["partition"] == partition == p
                assert row["stream"] == stream.name
            assert rows[0]["timestamp"].tzinfo is not None
            assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_headers_are_returned_without_the_pin_header(conn, make_stream):
    stream = make_stream(200, partitions=2, headers=True)
    member = MemberRange(stream.name, stream.consumer(1), 0, stream.last_seq, include_headers=True)
    rows = read_all(conn, member).to_pylist()
    assert [r["seq"] for r in rows] == stream.expected(1, 0, stream.last_seq)
    for row in rows:
        published = stream.messages[row["seq"]][2]
        assert dict(row["headers"]) == {k: [v] for k, v in published.items()}


def test_reading_acks_nothing(conn, api, make_stream):
    stream = make_stream(500, partitions=2)
    for start in (0, 120, 300):
        read_all(conn, MemberRange(stream.name, stream.consumer(0), start, stream.last_seq))
        info = api.consumer_info(stream.name, stream.consumer(0))
        assert info["ack_floor"]["stream_seq"] == start
        assert info["num_ack_pending"] > 0  # delivered, still unacked


EACH_ACK_POLICY = pytest.mark.parametrize("ack_policy", ACK_POLICIES)


@EACH_ACK_POLICY
def test_replay_after_an_abandoned_partial_read_is_identical(ack_policy, conn, make_stream):
    stream = make_stream(2000, partitions=2, consumers=ack_policy)
    member = MemberRange(stream.name, stream.consumer(1), 100, 1900)
    first = read_all(conn, member)
    partial = read_member(conn, member, SMALL)
    assert next(partial).num_rows == SMALL.record_batch_size
    partial.close()  # abandoned mid-way: pulls still outstanding, deliveries pending
    again = read_all(conn, member)
    assert again.equals(first)
    assert first.column("seq").to_pylist() == stream.expected(1, 100, 1900)


@EACH_ACK_POLICY
@pytest.mark.parametrize("first_attempt", [False, True])
def test_newer_reader_fences_the_older_one(ack_policy, first_attempt, conn, make_stream):
    """Also when the newer reader is a task's first attempt: the member had deliveries since its last RESET, so the
    pin it finds is not one to take over."""
    stream = make_stream(3000, partitions=2, consumers=ack_policy)
    member = MemberRange(stream.name, stream.consumer(0), 0, stream.last_seq)
    expected = stream.expected(0, 0, stream.last_seq)
    reader_a = read_member(conn, member, SMALL)
    seen_by_a = next(reader_a).column("seq").to_pylist()
    assert seen_by_a == expected[: SMALL.record_batch_size]
    # B starts while A is mid-read (A has pulls outstanding and unread rows buffered).
    table_b = pa.Table.from_batches(list(read_member(conn, member, SMALL, first_attempt=first_attempt)))
    assert table_b.column("seq").to_pylist() == expected
    with pytest.raises(FencedError, match="fenced"):
        for batch in reader_a:
            seen_by_a += batch.column("seq").to_pylist()
    assert len(seen_by_a) < len(expected)


def test_a_refused_stale_pull_of_its_own_does_not_fence_the_pin_holder(conn, make_stream, caplog):
    """After a consumer leader change a pull of the reader's own can still wait with a pin id from before its re-pin,
    and the server refuses it (423) while the reader holds the pin: the reader reads on. Only a pin held by another
    reader fences it (the test above)."""
    stream = make_stream(3000, partitions=2)
    member = MemberRange(stream.name, stream.consumer(0), 0, stream.last_seq)
    pull = _PinnedPull(conn, member, SMALL)
    seqs: list[int] = []

    def take(rows) -> None:
        seqs.extend(rows.to_record_batch(member.stream, True, False).column("seq").to_pylist())

    try:
        conn.run(pull.open())
        take(conn.run(pull.next_rows()))
        assert pull.deliveries.pin_id
        stale = {"batch": 1, "expires": 1_000_000_000, "group": member.priority_group, "id": "stale"}
        with caplog.at_level("INFO", logger="spark_jetstream"):
            conn.run(conn.client.publish(pull.pull_subject, json.dumps(stale).encode(), reply=pull.inbox))
            while (rows := conn.run(pull.next_rows())) is not None:
                take(rows)
    finally:
        conn.run(pull.close(), timeout=10)
    assert seqs == stream.expected(0, 0, stream.last_seq)
    assert "was refused (Nats-Pin-Id mismatch)" in caplog.text


def test_ranges_without_messages_never_wait_for_a_pull_to_expire(conn, make_stream):
    stream = make_stream(40, partitions=8)
    patient = PullSettings(batch=50, in_flight=3, expires=30.0, idle_heartbeat=5.0, record_batch_size=70)
    assert any(not stream.expected(p, 36, 40) for p in range(8))  # some member has nothing in range
    started = time.monotonic()
    for p in range(8):
        table = read_all(conn, MemberRange(stream.name, stream.consumer(p), 36, 40), patient)
        assert table.column("seq").to_pylist() == stream.expected(p, 36, 40)
    assert read_all(conn, MemberRange(stream.name, stream.consumer(0), 40, 40), patient).num_rows == 0
    beyond = MemberRange(stream.name, stream.consumer(0), stream.last_seq, 10**6)
    assert read_all(conn, beyond, patient).num_rows == 0
    assert time.monotonic() - started < patient.expires / 2  # a wait for data that cannot come lasts 30 s


def test_range_ending_past_new_messages_stops_at_end(conn, api, make_stream):
    stream = make_stream(300, partitions=2)
    end = 200
    table = read_all(conn, MemberRange(stream.name, stream.consumer(0), 0, end))
    assert table.column("seq").to_pylist() == stream.expected(0, 0, end)


def test_another_client_holding_the_pin_fails_fast(conn, api, make_stream):
    stream = make_stream(500, partitions=1)
    consumer = stream.consumer(0)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{consumer}"
    received: list[bytes] = []

    async def rogue() -> int:
        """Pull one message (taking the pin), then leave an id-less pull waiting as a standby."""
        inbox, sid = await conn.subscribe_raw(lambda s, r, d, h: received.append(h or b""))
        await conn.client.publish(subject, json.dumps({"batch": 1, "group": "PCG"}).encode(), reply=inbox)
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.02)
        await conn.client.publish(
            subject, json.dumps({"batch": 1, "group": "PCG", "expires": 30 * 10**9}).encode(), reply=inbox
        )
        return sid

    rogue_sid = conn.run(rogue())
    settings = PullSettings(batch=50, in_flight=2, expires=1.0, idle_heartbeat=0.25, record_batch_size=100)
    started = time.monotonic()
    with pytest.raises(ReaderError, match="Another client is pulling from the consumer"):
        read_all(conn, MemberRange(stream.name, consumer, 0, stream.last_seq), settings)
    assert time.monotonic() - started < 10
    conn.run(conn.unsubscribe_raw(rogue_sid))


def test_unknown_stream_and_consumer_are_named(conn, make_stream):
    stream = make_stream(10, partitions=1)
    with pytest.raises(StreamNotFoundError, match="'NOPE' does not exist"):
        read_all(conn, MemberRange("NOPE", "g-0", 0, 10))
    with pytest.raises(ConsumerNotFoundError, match="Consumer 'nobody' on stream"):
        read_all(conn, MemberRange(stream.name, "nobody", 0, 10))


def test_misconfigured_consumers_are_refused(conn, api: JetStreamApi, make_stream):
    stream = make_stream(100, partitions=1)
    plain = {"durable_name": "plain", "ack_policy": "explicit", "filter_subject": "0.>"}
    api.create_consumer(stream.name, plain)
    with pytest.raises(ReaderError, match="not a pinned member consumer"):
        read_all(conn, MemberRange(stream.name, "plain", 0, stream.last_seq))
    stingy = member_consumer_config("s", "0", partition_filters([0])) | {"max_ack_pending": 10}
    api.create_consumer(stream.name, stingy)
    with pytest.raises(ReaderError, match="max_ack_pending=10"):
        read_all(conn, MemberRange(stream.name, "s-0", 0, stream.last_seq))
    short = member_consumer_config("t", "0", partition_filters([0]), priority_timeout=3.0)
    api.create_consumer(stream.name, short)
    with pytest.raises(ReaderError, match="pullExpires"):
        read_all(conn, MemberRange(stream.name, "t-0", 0, stream.last_seq))


def test_a_standby_client_gets_nothing_while_the_reader_holds_the_pin(conn, make_stream, nats_server):
    from spark_jetstream.client.connection import ConnectionOptions, connect

    stream = make_stream(3000, partitions=1)
    consumer = stream.consumer(0)
    reader = read_member(conn, MemberRange(stream.name, consumer, 0, stream.last_seq), SMALL)
    seqs = next(reader).column("seq").to_pylist()  # the reader holds the pin, mid-read
    other = connect(ConnectionOptions(servers=(nats_server.url,), connect_timeout=4.0))  # a second client
    received: list[tuple[bytes, bytes | None]] = []

    async def standby() -> None:
        inbox, sid = await other.subscribe_raw(lambda s, r, d, h: received.append((r, h)))
        request = {"batch": 10, "group": "PCG", "expires": 1_000_000_000}
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{consumer}"
        for _ in range(2):
            await other.client.publish(subject, json.dumps(request).encode(), reply=inbox)
            await asyncio.sleep(1.3)
        await other.unsubscribe_raw(sid)

    other.run(standby())
    for batch in reader:  # the reader goes on undisturbed and reads everything
        seqs += batch.column("seq").to_pylist()
    assert seqs == stream.expected(0, 0, stream.last_seq)
    assert [r for r, _ in received if r.startswith(b"$JS.ACK.")] == []  # no message went to the standby
    assert all(h and h.startswith(b"NATS/1.0 408") for _, h in received), received


@pytest.mark.parametrize("first_attempt", [True, False])
def test_a_first_attempt_takes_over_the_last_readers_pin_so_a_waiting_standby_gets_nothing(
    first_attempt, conn, api, make_stream, nats_server
):
    """A pull that waits when a pin is released wins it: a task that UNPINs hands its member to a standby that is
    waiting (and then fails, naming it); a first attempt that finds the pin of the query's last reader (no delivery
    since the commit's RESET) pulls with it instead, and the standby gets nothing."""
    from spark_jetstream.client.connection import ConnectionOptions, connect

    stream = make_stream(3000, partitions=1)
    consumer = stream.consumer(0)
    first = MemberRange(stream.name, consumer, 0, 1000)
    assert read_all(conn, first).column("seq").to_pylist() == list(range(1, 1001))
    conn.run(api.reset(stream.name, consumer, 1001))  # the commit of that batch
    other = connect(ConnectionOptions(servers=(nats_server.url,), connect_timeout=4.0))  # a second client
    received: list[tuple[bytes, bytes | None]] = []

    async def wait_as_standby() -> int:
        inbox, sid = await other.subscribe_raw(lambda s, r, d, h: received.append((r, h)))
        request = {"batch": 10, "group": "PCG", "expires": 20 * 10**9}
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{consumer}"
        await other.client.publish(subject, json.dumps(request).encode(), reply=inbox)
        await other.client.flush()
        return sid

    sid = other.run(wait_as_standby())
    second = MemberRange(stream.name, consumer, 1000, stream.last_seq)
    settings = PullSettings(batch=50, in_flight=3, expires=1.0, idle_heartbeat=0.25, record_batch_size=70)
    try:
        if first_attempt:
            table = pa.Table.from_batches(list(read_member(conn, second, settings, first_attempt=True)))
            assert table.column("seq").to_pylist() == list(range(1001, 3001))
            assert [r for r, _ in received if r.startswith(b"$JS.ACK.")] == []  # nothing went to the standby
        else:
            with pytest.raises(ReaderError, match="Another client is pulling from the consumer"):
                read_all(conn, second, settings)
            assert [r for r, _ in received if r.startswith(b"$JS.ACK.")]  # the released pin went to the standby
    finally:
        other.run(other.unsubscribe_raw(sid))


class _RecordingClient(RawClient):
    """The connector's nats-py client, fed bytes by hand; PING and PONG are only recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.pings = 0

    async def _process_ping(self) -> None:
        self.pings += 1

    async def _process_pong(self) -> None:
        pass


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 1 << 20])
@pytest.mark.usefixtures("bulk_parsers")
def test_deliveries_are_parsed_alike_by_the_bulk_handler_and_after_nats_py_took_over(chunk):
    """Deliveries, heartbeats and a PING in one byte stream: every delivery becomes exactly one row
    (including those nats-py's parser handles after the PING), for any way the bytes arrive."""
    sid = 3
    pin = b"NATS/1.0\r\nNats-Pin-Id: abc123\r\n\r\n"
    heartbeat = wire(sid, b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")

    def delivery(seq: int) -> bytes:
        reply = b"$JS.ACK.S.C.1.%d.%d.%d.%d" % (seq, seq, 1_700_000_000_000_000_000 + seq * 1000, 20 - seq)
        return wire(sid, b"%d.orders.k%d" % (seq % 2, seq), reply, b"payload %d" % seq, pin)

    stream = b"".join(
        [*(delivery(s) for s in range(1, 6)), heartbeat, b"PING\r\n", *(delivery(s) for s in range(6, 9)), heartbeat]
    )
    unused = cast(Connection, SimpleNamespace(options=ConnectionOptions()))  # no I/O: bytes are fed by hand
    pull = _PinnedPull(unused, MemberRange("S", "C", start=0, end=20), PullSettings(record_batch_size=3))
    pull.window.budget, pull.window.requests = 20, deque([10, 10])
    client = _RecordingClient()
    client.raw_handlers[sid] = pull._on_message
    client.bulk_handlers[sid] = pull.deliveries.handler(sid)

    async def feed() -> None:
        for i in range(0, len(stream), chunk):
            await client._ps.parse(stream[i : i + chunk])

    asyncio.run(feed())
    buffers = [*pull.deliveries.ready, pull.deliveries.batches.rows]
    rows = pa.Table.from_batches([buffer.to_record_batch("S", True, False) for buffer in buffers if len(buffer)])
    assert rows.column("seq").to_pylist() == list(range(1, 9))
    assert rows.column("data").to_pylist() == [b"payload %d" % s for s in range(1, 9)]
    assert rows.column("subject").to_pylist() == [f"orders.k{s}" for s in range(1, 9)]
    assert rows.column("partition").to_pylist() == [s % 2 for s in range(1, 9)]
    assert rows.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_000_000 + s for s in range(1, 9)]
    assert (pull.deliveries.pin_id, pull.window.budget, list(pull.window.requests)) == ("abc123", 12, [2, 10])
    assert (pull.deliveries.received, client.pings) == (10, 1)  # 8 deliveries and 2 heartbeats
    assert not client._ps.buf


def _fed_pull(stream: bytes, sid: int = 3, end: int = 20) -> _PinnedPull:
    """A pinned reader of range (0, end] fed ``stream`` by hand (no I/O)."""
    unused = cast(Connection, SimpleNamespace(options=ConnectionOptions()))
    pull = _PinnedPull(unused, MemberRange("S", "C", start=0, end=end), PullSettings(record_batch_size=100))
    pull.window.budget, pull.window.requests = 100, deque([100])
    client = _RecordingClient()
    client.raw_handlers[sid] = pull._on_message
    client.bulk_handlers[sid] = pull.deliveries.handler(sid)
    asyncio.run(client._ps.parse(stream))
    return pull


def _rows(pull: _PinnedPull) -> pa.Table:
    buffers = [*pull.deliveries.ready, pull.deliveries.batches.rows]
    return pa.Table.from_batches([b.to_record_batch("S", False, False) for b in buffers if len(b)])


@pytest.mark.usefixtures("bulk_parsers")
def test_every_form_of_the_ack_reply_subject_is_read_and_redeliveries_in_a_run_are_dropped():
    """Replies in the 9-token form, the 11-token form (domain, account hash) and the 12-token one (and a random token
    last), with and without headers, in one run; seqs 2 and 1 come again (redeliveries) and are read once."""
    forms = [
        b"$JS.ACK.S.C.1.%d.%d.%d.%d",
        b"$JS.ACK.hub.ACCHASH.S.C.1.%d.%d.%d.%d",
        b"$JS.ACK.hub.ACCHASH.S.C.1.%d.%d.%d.%d.rAnD0m",
    ]
    order = [1, 2, 3, 2, 4, 1, 5, 6]
    stream = b"".join(
        wire(
            3,
            b"orders.k%d" % seq,
            forms[index % 3] % (seq, index + 1, 1_700_000_000_000_000_000 + seq * 1000, 10 - seq),
            b"p%d" % seq,
            b"NATS/1.0\r\nNats-Pin-Id: pin9\r\n\r\n" if index % 2 else None,
        )
        for index, seq in enumerate(order)
    )
    pull = _fed_pull(stream)
    rows = _rows(pull)
    assert rows.column("seq").to_pylist() == [1, 2, 3, 4, 5, 6]
    assert rows.column("data").to_pylist() == [b"p%d" % s for s in range(1, 7)]
    assert rows.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_000_000 + s for s in range(1, 7)]
    assert (pull.deliveries.pin_id, pull.deliveries.received, pull.error) == ("pin9", 8, None)


@pytest.mark.usefixtures("bulk_parsers")
def test_a_delivery_whose_reply_subject_cannot_be_read_fails_the_read_naming_it():
    """A reply form the connector does not know (here 13 tokens) is never dropped silently."""
    stream = wire(3, b"orders.k1", b"$JS.ACK.a.b.S.C.1.1.1.1700000000000000000.0.x.y", b"p1", None)
    pull = _fed_pull(stream)
    assert isinstance(pull.error, ReaderError)
    assert "cannot read ('$JS.ACK.a.b.S.C.1.1.1.1700000000000000000.0.x.y')" in str(pull.error)
    assert "upgrade spark-jetstream" in str(pull.error)
