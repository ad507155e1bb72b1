"""Mirrors answer their origin's Direct Gets (the server gives a mirror ``mirror_direct`` from its origin's
``allow_direct``) with what they hold; reads of the origin never take those answers for the origin's. Real
nats-server, mirrors made as the server and clients make them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import nats
import pytest
from helpers import PartitionedStream, wait_for
from nats.js.api import KeyValueConfig

from spark_jetstream.client import messages
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.read import direct
from spark_jetstream.read.direct import first_seqs, read_range
from spark_jetstream.read.ranges import SeqRange


def _caught_up(api: JetStreamApi, mirror: str) -> bool:
    info = api.stream_info(mirror)
    return bool(info.get("mirror")) and info["mirror"].get("lag") == 0 and info["mirror"].get("active", -1) >= 0


def _answering(url: str, stream: str, seq: int, asks: int = 60) -> set[str]:
    """The streams that answered ``asks`` Direct Gets of ``stream``'s message ``seq`` (empty: not found)."""

    async def ask() -> set[str]:
        nc = await nats.connect(url)
        try:
            request = b'{"seq": %d}' % seq
            replies = [await nc.request(f"$JS.API.DIRECT.GET.{stream}", request, timeout=5) for _ in range(asks)]
        finally:
            await nc.close()
        return {(reply.headers or {}).get("Nats-Stream", "") for reply in replies}

    return asyncio.run(ask())


@pytest.fixture
def mirrored(api: JetStreamApi, nats_server, make_stream) -> Iterator[PartitionedStream]:
    """A 4-partition stream of 3,000 messages with two mirrors that answer its Direct Gets: one of partition 0 only,
    one of its last 300 messages."""
    stream = make_stream(3000)
    mirrors = [f"{stream.name}_P0", f"{stream.name}_LAST"]
    api.create_stream({"name": mirrors[0], "mirror": {"name": stream.name, "filter_subject": "0.>"}})
    api.create_stream({"name": mirrors[1], "mirror": {"name": stream.name}, "max_msgs": 300})
    try:
        for mirror in mirrors:
            wait_for(lambda mirror=mirror: _caught_up(api, mirror), 20, f"mirror {mirror} to catch up")
            assert api.stream_info(mirror)["config"]["mirror_direct"] is True  # set by the server
        answering: set[str] = set()
        held_by_both = stream.expected(0, 0, max(stream.messages))[-1]
        wait_for(
            lambda: answering.update(_answering(nats_server.url, stream.name, held_by_both)) or len(answering) == 3,
            20,
            lambda: f"the mirrors to answer Direct Gets (answered: {answering})",
        )
        yield stream
    finally:
        for mirror in mirrors:
            api.delete_stream(mirror)


def test_a_range_read_takes_no_mirrors_answers(conn, mirrored: PartitionedStream, monkeypatch, caplog):
    """Each partition's whole range read with Direct Get batches of 50 (60 batches a partition, about two thirds of
    them first answered by a mirror) gives exactly the partition's messages; a read whose every mirror answer goes to
    the leader at once does too, and says so once."""
    last = max(mirrored.messages)

    def read(partition: int) -> list[int]:
        seq_range = SeqRange(mirrored.name, f"{partition}.>", 0, last, partitioned=True, direct_batch=50)
        return [seq for batch in read_range(conn, seq_range) for seq in batch.column("seq").to_pylist()]

    for partition in range(4):
        assert read(partition) == mirrored.expected(partition, 0, last)
    monkeypatch.setattr(messages, "FOREIGN_RETRIES", 1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=direct.__name__):
        assert read(0) == mirrored.expected(0, 0, last)
    warned = [record.getMessage() for record in caplog.records if "answers its Direct Gets" in record.getMessage()]
    assert len(warned) == 1
    assert f"Stream {mirrored.name!r}: its mirror '{mirrored.name}_" in warned[0]
    assert "on the stream leader one message at a time" in warned[0]


def test_planning_takes_no_mirrors_answers(conn, mirrored: PartitionedStream):
    """The first seq of each partition after a point, asked 20 times: the shorter mirror would say 2,701 and the
    filtered one would find nothing of partitions 1-3."""
    last = max(mirrored.messages)
    expected = [mirrored.expected(p, 10, last)[0] for p in range(4)]
    for _ in range(20):
        assert first_seqs(conn, mirrored.name, [f"{p}.>" for p in range(4)], 10, last) == expected


def test_a_batch_read_with_mirrors_returns_every_row(spark, nats_server, mirrored: PartitionedStream):
    frame = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", mirrored.name).load()
    assert sorted(row.seq for row in frame.select("seq").collect()) == sorted(mirrored.messages)


def test_a_bucket_with_a_read_replica_reads_every_key(spark, nats_server, api: JetStreamApi, conn):
    """A bucket keeping 5 revisions, 2,400 keys of 2 revisions each, and a read replica (a mirror, as clients make
    them) of half its keys: the table has every key's latest value, and each key's last revision is the leader's."""
    bucket = "mirrored_kv"

    async def fill() -> None:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=bucket, history=5, direct=True))
        for revision in (1, 2):
            futures = [
                await js.publish_async(f"$KV.{bucket}.{half}.{i}", b"%s.%d v%d" % (half.encode(), i, revision))
                for half in ("a", "b")
                for i in range(1200)
            ]
            await asyncio.gather(*futures)
        del kv
        await nc.close()

    asyncio.run(fill())
    replica = f"KV_{bucket}_ro"
    mirror = {"name": f"KV_{bucket}", "filter_subject": f"$KV.{bucket}.a.>"}
    api.create_stream({"name": replica, "mirror": mirror, "allow_direct": True})
    try:
        wait_for(lambda: _caught_up(api, replica), 20, "the read replica to catch up")
        wait_for(lambda: replica in _answering(nats_server.url, f"KV_{bucket}", 1), 20, "the replica to answer")
        subjects = [f"$KV.{bucket}.{half}.{i}" for half in ("a", "b") for i in range(0, 1200, 3)][:1024]
        up_to = api.stream_info(f"KV_{bucket}")["state"]["last_seq"]
        for _ in range(10):
            latest = messages.last_seqs(conn, f"KV_{bucket}", subjects, up_to, 1 << 20)
            assert len(latest) == len(subjects)
            assert all(seq > 2400 for seq in latest.values())  # the second revision's
        frame = spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", bucket).load()
        rows = {row.key: row.value for row in frame.select("key", "value").collect()}
        assert rows == {f"{half}.{i}": b"%s.%d v2" % (half.encode(), i) for half in ("a", "b") for i in range(1200)}
    finally:
        api.delete_stream(replica)
        api.delete_stream(f"KV_{bucket}")
