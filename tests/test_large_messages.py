"""Messages up to the server's 1 MB ``max_payload``: exact reads and writes with default options and Spark's
default memory, and every buffer bounded by bytes (Direct Get requests, pulls, record batches)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from helpers import ack_floors, checkpoint_log, reader, run_available_now
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jetstream.client.connection import ConnectionOptions, connect
from spark_jetstream.client.publish import Publisher, command
from spark_jetstream.read.consumer import read_by_consumer
from spark_jetstream.read.direct import read_range
from spark_jetstream.read.mode import PULL
from spark_jetstream.read.ranges import MemberRange, SeqRange
from spark_jetstream.streaming.config import PullSettings
from spark_jetstream.streaming.pull import read_member

pytestmark = pytest.mark.slow

MB = 1024 * 1024
LARGE = MB - 4096
"""Payload of the largest messages: the server's default max_payload (1 MiB) less room for the headers."""


def large_or_200k(i: int) -> int:
    """Every fifth message ~1 MB, the rest 200 KB."""
    return LARGE if i % 5 == 0 else 200 * 1024


def expected(stream) -> list[tuple[int, str, int, str, int]]:
    """(seq, subject, partition, md5 of data, size) of every message published to ``stream``."""
    return sorted(
        (seq, subject, part, hashlib.md5(payload).hexdigest(), len(payload))
        for seq, (subject, payload, _, part) in stream.messages.items()
    )


def fingerprints(rows: DataFrame) -> DataFrame:
    """The rows without their payloads: comparing hundreds of MB in the driver would measure the test."""
    return rows.select("seq", "subject", "partition", F.md5("data").alias("md5"), F.length("data").alias("size"))


def collected(rows: DataFrame) -> list[tuple[int, str, int, str, int]]:
    return sorted(tuple(row) for row in rows.collect())


@pytest.mark.parametrize("direct", [True, False], ids=["direct-get", "pull"])
def test_a_streaming_read_of_1mb_and_200kb_messages_is_exact_with_defaults(
    direct, spark, nats_server, api, make_stream, tmp_path
):
    stream = make_stream(400, partitions=2, direct=direct, size=large_or_200k)  # 80 x 1 MB + 320 x 200 KB
    run_available_now(fingerprints(reader(spark, nats_server.url, stream)), tmp_path)
    assert collected(spark.read.parquet(str(tmp_path / "out"))) == expected(stream)
    offsets = checkpoint_log(tmp_path / "cp", "offsets")
    assert offsets[max(offsets)] == stream.last_seq
    assert ack_floors(api, stream) == {stream.consumer(p): stream.last_seq for p in range(2)}


def test_a_batch_read_and_a_write_of_1mb_and_200kb_messages_are_exact_with_defaults(
    spark: SparkSession, nats_server, api, make_stream
):
    stream = make_stream(300, partitions=2, size=large_or_200k)
    rows = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream.name).load()
    assert collected(fingerprints(rows)) == expected(stream)
    pulled = spark.read.format("jetstream").options(servers=nats_server.url, stream=stream.name)
    assert collected(fingerprints(pulled.option("readMode", "pull").load())) == expected(stream)  # consumers

    target = f"{stream.name}_COPY"
    api.create_stream({"name": target, "subjects": [f"copy.{stream.name}.>"], "allow_direct": True})
    try:
        copied = rows.select(F.concat(F.lit(f"copy.{stream.name}."), "subject").alias("subject"), "data")
        copied.write.format("jetstream").option("servers", nats_server.url).mode("append").save()
        back = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", target).load()
        stored = sorted(
            (row.subject.removeprefix(f"copy.{stream.name}."), row.md5, row.size)
            for row in back.select("subject", F.md5("data").alias("md5"), F.length("data").alias("size")).collect()
        )
        assert stored == sorted((subject, md5, size) for _, subject, _, md5, size in expected(stream))
    finally:
        api.delete_stream(target)


def _wiretap(nats_server, subject: str) -> tuple[object, list[dict]]:
    """A second connection that sees every request sent to ``subject`` (core NATS delivers to every subscriber)."""
    tap = connect(ConnectionOptions(servers=(nats_server.url,), connect_timeout=4.0))
    seen: list[dict] = []
    tap.run(tap.subscribe_raw(lambda s, r, data, h: seen.append(json.loads(data)), subject))
    tap.run(tap.client.flush())
    return tap, seen


def _batch_bytes(batch) -> int:
    return sum(len(d) for d in batch.column("data").to_pylist())


def test_direct_get_requests_and_record_batches_never_exceed_their_byte_bounds(conn, nats_server, make_stream):
    stream = make_stream(60, partitions=1, size=large_or_200k)
    tap, requests = _wiretap(nats_server, f"$JS.API.DIRECT.GET.{stream.name}")
    seq_range = SeqRange(
        stream.name, "0.>", 0, stream.last_seq, True, direct_max_bytes=2 * MB, record_batch_bytes=3 * MB
    )
    batches = list(read_range(conn, seq_range))
    tap.run(tap.client.flush())
    assert [seq for b in batches for seq in b.column("seq").to_pylist()] == stream.expected(0, 0, stream.last_seq)
    for batch in batches:
        assert _batch_bytes(batch) <= 3 * MB or batch.num_rows == 1
    batched = [r for r in requests if "batch" in r]
    assert batched and all(r["max_bytes"] == 2 * MB for r in batched), batched
    # the server honoured it: a request of 2 MiB brings at most its bytes and one message more
    assert len(batched) >= sum(size for *_, size in expected(stream)) // (2 * MB + LARGE)


def test_pulls_and_record_batches_never_exceed_their_byte_bounds(conn, nats_server, make_stream):
    stream = make_stream(60, partitions=1, size=large_or_200k, direct=False)
    consumer = stream.consumer(0)
    tap, pulls = _wiretap(nats_server, f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{consumer}")
    settings = PullSettings(max_bytes=2 * MB, record_batch_bytes=3 * MB)
    batches = list(read_member(conn, MemberRange(stream.name, consumer, 0, stream.last_seq), settings))
    tap.run(tap.client.flush())
    assert [seq for b in batches for seq in b.column("seq").to_pylist()] == stream.expected(0, 0, stream.last_seq)
    for batch in batches:
        assert _batch_bytes(batch) <= 3 * MB or batch.num_rows == 1
    max_payload = conn.client.max_payload
    assert pulls and all(p["max_bytes"] in (2 * MB, 2 * max_payload + 65536) for p in pulls), pulls


def test_a_batch_reads_consumer_pulls_and_record_batches_never_exceed_their_byte_bounds(conn, nats_server, make_stream):
    stream = make_stream(60, partitions=1, size=large_or_200k, direct=False)
    tap, pulls = _wiretap(nats_server, f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.*")
    seq_range = SeqRange(
        stream.name, "0.>", 0, stream.last_seq, True, read_mode=PULL, pull_max_bytes=2 * MB, record_batch_bytes=3 * MB
    )
    batches = list(read_by_consumer(conn, seq_range))
    tap.run(tap.client.flush())
    assert [seq for b in batches for seq in b.column("seq").to_pylist()] == stream.expected(0, 0, stream.last_seq)
    for batch in batches:
        assert _batch_bytes(batch) <= 3 * MB or batch.num_rows == 1
    max_payload = conn.client.max_payload
    assert pulls and all(p["max_bytes"] in (2 * MB, 2 * max_payload + 65536) for p in pulls), pulls


def test_a_record_batch_bound_below_a_message_still_reads_it(conn, make_stream):
    stream = make_stream(10, partitions=1, size=large_or_200k)
    seq_range = SeqRange(stream.name, "0.>", 0, stream.last_seq, True, direct_max_bytes=1024, record_batch_bytes=1024)
    batches = list(read_range(conn, seq_range))
    assert [b.num_rows for b in batches] == [1] * 10
    assert [b.column("seq")[0].as_py() for b in batches] == stream.expected(0, 0, stream.last_seq)


def test_record_batch_bytes_is_an_option_with_a_clear_error(spark, nats_server, make_stream, tmp_path: Path):
    stream = make_stream(5, partitions=1)
    load = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream.name)
    with pytest.raises(Exception, match="Option 'recordBatchBytes' has an invalid value '2g': it must be at most"):
        load.option("recordBatchBytes", "2g").load().collect()


def test_a_publisher_keeps_at_most_its_window_of_bytes_in_flight(conn, api):
    api.create_stream({"name": "PUBWIN", "subjects": ["pubwin.>"]})
    payload = os.urandom(LARGE)

    async def publish() -> tuple[list[int], int]:
        publisher = await Publisher(conn, window=1000, window_bytes=3 * MB).open()
        in_flight = []
        try:
            for _ in range(30):
                token = publisher.reserve(1, lambda _: "pubwin.x")
                await publisher.send(command(b"pubwin.x", publisher.reply_prefix + b"%d" % token, payload, None), 1)
                in_flight.append(publisher.outstanding_bytes)
            stored = (await publisher.finish()).count
            # what names a failed message's subject is let go once acked (it held Spark's whole input batch)
            assert len(publisher._subjects) == 1
            return in_flight, stored
        finally:
            await publisher.close()

    try:
        in_flight, stored = conn.run(publish())
        assert stored == 30
        assert max(in_flight) <= 3 * MB and max(in_flight) > 2 * LARGE, in_flight  # bounded, and still pipelined
    finally:
        api.delete_stream("PUBWIN")
