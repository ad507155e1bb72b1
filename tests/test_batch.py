"""Bounded batch reads end to end: real Spark, real nats-server, exact rows, untouched consumers; on streams with
Direct Get and on streams without it (each task reads through an ephemeral consumer that it deletes)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from chispa import assert_df_equality
from helpers import fnv1a_32
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config

pytestmark = pytest.mark.slow

_VOLATILE = ("ts", "created", "last_active")  # timestamps in consumer info, not state

EACH_READ_PATH = pytest.mark.parametrize("direct", [True, False], ids=["direct-get", "consumers"])
"""Both read paths: a stream with Direct Get (read with it), and one without (read through consumers)."""


def assert_nothing_left(api, stream) -> None:
    """Only the group's member consumers are on the stream: every read's own consumer is gone."""
    assert sorted(api.consumer_names(stream.name)) == sorted(stream.consumer(p) for p in range(stream.partitions))


def batch_read(spark: SparkSession, url: str, stream: str, **options: object) -> DataFrame:
    return (
        spark.read.format("jetstream")
        .option("servers", url)
        .option("stream", stream)
        .options(**{k: str(v) for k, v in options.items()})
        .load()
    )


def expected_rows(spark: SparkSession, stream, start: int = 0, end: int | None = None) -> DataFrame:
    last = stream.last_seq if end is None else end
    rows = [
        (subject, payload, stream.name, seq, part)
        for seq, (subject, payload, _, part) in stream.messages.items()
        if start < seq <= last
    ]
    return spark.createDataFrame(rows, "subject string, data binary, stream string, seq long, partition int")


def consumer_states(api, stream) -> dict[str, dict]:
    """Each member consumer's info without its timestamps: ack floor, delivered, pending, pin."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in _VOLATILE}
        return value

    return {
        name: strip(api.consumer_info(stream.name, name))
        for name in api.consumer_names(stream.name)
        if name.startswith(f"{stream.group}-")
    }


async def pull_one(conn, subject: str):
    """Pull one message without acking it (a JetStream delivery carries the message's own subject, so
    nats-py's request() cannot match it: use a plain inbox)."""
    inbox = conn.client.new_inbox()
    sub = await conn.client.subscribe(inbox)
    try:
        await conn.client.publish(subject, b'{"batch": 1, "group": "PCG", "expires": 1000000000}', reply=inbox)
        return await sub.next_msg(timeout=5)
    finally:
        await sub.unsubscribe()


def error_text(exc: BaseException) -> str:
    get_message = getattr(exc, "getMessage", None)
    return get_message() if callable(get_message) else str(exc)


@EACH_READ_PATH
def test_a_seq_range_reads_exactly_its_messages_and_leaves_the_group_untouched(
    direct, spark, nats_server, api, conn, make_stream
):
    stream = make_stream(6000, partitions=4, headers=True, direct=direct)
    # Give the group a position that is not the start: ack floors at 2000, and member 1 has
    # messages delivered but not acked, so delivered, ack floor and pending all differ.
    for p in range(4):
        conn.run(api.reset(stream.name, stream.consumer(p), 2001))
    pulled = conn.run(pull_one(conn, f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{stream.consumer(1)}"))
    assert pulled.headers.get("Nats-Pin-Id")
    before = consumer_states(api, stream)
    assert before[stream.consumer(1)]["delivered"]["stream_seq"] > 2000
    assert before[stream.consumer(1)]["num_ack_pending"] == 1

    df = batch_read(
        spark, nats_server.url, stream.name, startingPosition=1001, endingPosition=4500, includeHeaders=True
    )
    assert df.rdd.getNumPartitions() == 1  # the stream's range, read with '>' (decision 0017)
    rows = df.collect()
    got = {r.seq: (r.subject, bytes(r.data), r.partition, dict(r.headers), r.stream) for r in rows}
    assert len(rows) == len(got) == 3500
    expected = {
        seq: (subject, payload, part, {k: [v] for k, v in headers.items()}, stream.name)
        for seq, (subject, payload, headers, part) in stream.messages.items()
        if 1000 < seq <= 4500
    }
    assert got == expected
    assert [r.timestamp.tzinfo is None for r in rows[:1]] == [True]  # a Spark timestamp, like the source's

    assert consumer_states(api, stream) == before
    assert_nothing_left(api, stream)


@EACH_READ_PATH
def test_the_default_range_is_the_whole_stream_at_planning_time(direct, spark, nats_server, api, conn, make_stream):
    stream = make_stream(3000, partitions=3, direct=direct)
    df = batch_read(spark, nats_server.url, stream.name, maxRangePerPartition=700)
    assert df.rdd.getNumPartitions() == 5  # the stream's range (first match..3000] in 700s
    out = df.select("subject", "data", "stream", "seq", "partition")
    assert_df_equality(out, expected_rows(spark, stream), ignore_row_order=True, ignore_nullable=True)

    publish_all(conn, ((stream.messages[1][0], b"later", None) for _ in range(10)))
    assert batch_read(spark, nats_server.url, stream.name).count() == 3010  # a new plan sees the new end
    assert_nothing_left(api, stream)


def test_rows_have_the_streaming_source_schema(spark, nats_server, make_stream):
    stream = make_stream(10, partitions=2)
    for headers in (False, True):
        batch = batch_read(spark, nats_server.url, stream.name, includeHeaders=headers)
        streaming = (
            spark.readStream.format("jetstream")
            .option("servers", nats_server.url)
            .option("stream", stream.name)
            .option("group", stream.group)
            .option("includeHeaders", str(headers))
            .load()
        )
        assert batch.schema == streaming.schema


@EACH_READ_PATH
def test_timestamps_bound_the_range(direct, spark, nats_server, conn, api, make_stream):
    stream = make_stream(500, partitions=2, direct=direct)
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    subject = stream.messages[1][0]
    publish_all(conn, ((subject, f"late-{i}".encode(), None) for i in range(200)))  # seqs 501..700
    after = batch_read(spark, nats_server.url, stream.name, startingTimestamp=middle.isoformat())
    assert sorted(r.seq for r in after.select("seq").collect()) == list(range(501, 701))
    before = batch_read(spark, nats_server.url, stream.name, endingTimestamp=int(middle.timestamp() * 1000))
    assert sorted(r.seq for r in before.select("seq").collect()) == list(range(1, 501))
    assert_nothing_left(api, stream)


@EACH_READ_PATH
def test_a_group_reads_its_members_filters(direct, spark, nats_server, make_stream):
    stream = make_stream(2000, partitions=4, direct=direct)
    df = batch_read(spark, nats_server.url, stream.name, group=stream.group, members=2, startingPosition=501)
    assert df.rdd.getNumPartitions() == 1  # every member's filters together: the whole stream, read with '>'
    out = df.select("subject", "data", "stream", "seq", "partition")
    assert_df_equality(out, expected_rows(spark, stream, start=500), ignore_row_order=True, ignore_nullable=True)


@EACH_READ_PATH
def test_an_unpartitioned_stream_is_split_by_sequence(direct, spark, nats_server, conn, api):
    api.create_stream({"name": "Flat", "subjects": ["flat.>"], "allow_direct": direct})
    try:
        publish_all(conn, ((f"flat.{i % 7}", f"m{i}".encode(), None) for i in range(1000)))
        df = batch_read(spark, nats_server.url, "Flat", maxRangePerPartition=300, startingPosition=11)
        assert df.rdd.getNumPartitions() == 4  # (10, 1000] in 300s
        rows = sorted((r.seq, r.subject, bytes(r.data), r.partition) for r in df.collect())
        assert rows == [(i + 1, f"flat.{i % 7}", f"m{i}".encode(), None) for i in range(10, 1000)]
        assert api.consumer_names("Flat") == []
    finally:
        api.delete_stream("Flat")


@EACH_READ_PATH
def test_a_partitioned_stream_is_read_with_one_filter(direct, spark, nats_server, conn, api):
    """A batch read of every partition of a stream reads it with the filter ">" (decision 0017), in pieces of the
    stream's range: every partitioned message with its partition, also where messages were stored before the
    stream was partitioned (no partition filter has them, so neither does this read)."""
    api.create_stream({"name": "Late", "subjects": ["late.*"], "allow_direct": direct})
    try:
        publish_all(conn, ((f"late.k{i}", b"before", None) for i in range(5)))
        config = {**api.stream_info("Late")["config"], **partitioned_stream_config("Late", "late.*", 4)}
        api.call(("STREAM", "UPDATE", "Late"), config, "Partitioning stream 'Late'")
        publish_all(conn, ((f"late.k{i % 9}", f"m{i}".encode(), None) for i in range(3000)))
        expected = [
            (i + 6, f"late.k{i % 9}", f"m{i}".encode(), fnv1a_32(f"k{i % 9}".encode()) % 4) for i in range(3000)
        ]
        whole = batch_read(spark, nats_server.url, "Late")
        assert whole.rdd.getNumPartitions() == 1  # (0, 3005] with '>'
        pieces = batch_read(spark, nats_server.url, "Late", maxRangePerPartition=1000)
        assert pieces.rdd.getNumPartitions() == 4  # (0, 1000], (1000, 2000], (2000, 3000], (3000, 3005]
        cut = batch_read(spark, nats_server.url, "Late", minPartitions=6)
        assert cut.rdd.getNumPartitions() == 6
        for df in (whole, pieces, cut):
            assert sorted((r.seq, r.subject, bytes(r.data), r.partition) for r in df.collect()) == expected
        assert {row[3] for row in expected} == {0, 1, 2, 3}
    finally:
        api.delete_stream("Late")


@EACH_READ_PATH
def test_min_partitions_cuts_a_stream_without_partitions_into_that_many_tasks(direct, spark, nats_server, conn, api):
    """A stream as clients make it by default (no partition transform) is one seq range: ``minPartitions`` cuts
    it into contiguous slices, each read in seq order."""
    api.create_stream({"name": "Plain", "subjects": ["plain.>"], "allow_direct": direct})
    try:
        publish_all(conn, ((f"plain.{i % 5}", f"m{i}".encode(), None) for i in range(20_000)))
        assert batch_read(spark, nats_server.url, "Plain").rdd.getNumPartitions() == 1
        df = batch_read(spark, nats_server.url, "Plain", minPartitions=8)
        assert df.rdd.getNumPartitions() == 8
        slices = (
            df.select(F.spark_partition_id().alias("task"), "seq")
            .groupBy("task")
            .agg(F.min("seq").alias("low"), F.max("seq").alias("high"), F.count("seq").alias("rows"))
        )
        assert sorted(tuple(r) for r in slices.collect()) == [
            (task, 2500 * task + 1, 2500 * (task + 1), 2500) for task in range(8)
        ]
        rows = sorted((r.seq, r.subject, bytes(r.data)) for r in df.collect())
        assert rows == [(i + 1, f"plain.{i % 5}", f"m{i}".encode()) for i in range(20_000)]
        assert api.consumer_names("Plain") == []
    finally:
        api.delete_stream("Plain")


@EACH_READ_PATH
def test_empty_ranges_read_nothing(direct, spark, nats_server, make_stream):
    stream = make_stream(100, partitions=2, direct=direct)
    assert batch_read(spark, nats_server.url, stream.name, startingPosition="latest").count() == 0
    # both ends are inclusive (an end before the start is refused at load(): test_options)
    assert batch_read(spark, nats_server.url, stream.name, startingPosition=50, endingPosition=50).count() == 1
    assert batch_read(spark, nats_server.url, stream.name, startingPosition=90, endingPosition=10**9).count() == 11


@EACH_READ_PATH
def test_removed_messages_fail_the_read_or_are_skipped(direct, spark, nats_server, api, make_stream):
    stream = make_stream(400, partitions=2, direct=direct)
    api.purge_stream(stream.name, keep_from_seq=301)
    with pytest.raises(Exception) as caught:
        batch_read(spark, nats_server.url, stream.name, startingPosition=101).count()
    assert f"Messages seqs 101..300 of stream '{stream.name}' were removed" in error_text(caught.value)
    rest = batch_read(spark, nats_server.url, stream.name, startingPosition=101, failOnDataLoss="false")
    assert sorted(r.seq for r in rest.select("seq").collect()) == list(range(301, 401))
    assert_nothing_left(api, stream)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxMessagesPerTrigger": "5"}, "Option 'maxMessagesPerTrigger' applies to spark.readStream only"),
        ({"endingPosition": "soon"}, "Option 'endingPosition' has an invalid value 'soon'"),
        (
            {"endingPosition": "10", "endingTimestamp": "2026-01-01T00:00:00Z"},
            "Set endingPosition or endingTimestamp, not both",
        ),
        ({"startingPosition": "group"}, "startingPosition=group needs the group option"),
    ],
    ids=["streaming-option", "bad-end", "both-ends", "group-without-group"],
)
def test_bad_batch_options_are_named(spark, nats_server, make_stream, options, message):
    stream = make_stream(10, partitions=2)
    with pytest.raises(Exception) as caught:
        batch_read(spark, nats_server.url, stream.name, **options).count()
    assert message in error_text(caught.value)


def test_a_stream_made_with_client_defaults_is_read_without_editing_it(spark, nats_server, conn, api):
    """nats-py's ``StreamConfig(name, subjects)``: no ``allow_direct``, no partition transform. The read needs no
    stream edit and leaves nothing on the server; ``readMode=direct`` is refused with the option and the fix."""
    api.create_stream({"name": "NoDirect", "subjects": ["nodirect.>"]})
    try:
        publish_all(conn, ((f"nodirect.{i % 3}", f"m{i}".encode(), {"i": str(i)}) for i in range(5000)))
        df = batch_read(spark, nats_server.url, "NoDirect", includeHeaders=True, startingPosition=101)
        rows = sorted((r.seq, r.subject, bytes(r.data), dict(r.headers)) for r in df.collect())
        assert rows == [(i + 1, f"nodirect.{i % 3}", f"m{i}".encode(), {"i": [str(i)]}) for i in range(100, 5000)]
        assert batch_read(spark, nats_server.url, "NoDirect", readMode="pull").count() == 5000
        assert api.consumer_names("NoDirect") == []
        info = api.stream_info("NoDirect")
        assert not info["config"].get("allow_direct") and info["state"]["messages"] == 5000  # the stream as it was

        with pytest.raises(Exception) as caught:
            batch_read(spark, nats_server.url, "NoDirect", readMode="direct").count()
        assert (
            "readMode=direct, but stream 'NoDirect' does not allow Direct Get: enable it with `nats stream edit "
            "NoDirect --allow-direct`, or set readMode to auto or pull"
        ) in error_text(caught.value)
    finally:
        api.delete_stream("NoDirect")


def test_read_mode_pull_reads_a_stream_with_direct_get_through_consumers(spark, nats_server, api, make_stream):
    stream = make_stream(3000, partitions=3, headers=True)
    rows = {
        mode: sorted(tuple(r) for r in batch_read(spark, nats_server.url, stream.name, readMode=mode).collect())
        for mode in ("direct", "pull")
    }
    assert rows["direct"] == rows["pull"] and len(rows["pull"]) == 3000
    assert_nothing_left(api, stream)


def test_a_workqueue_stream_without_direct_get_is_refused_with_the_fix(spark, nats_server, api):
    api.create_stream({"name": "WorkNoDirect", "subjects": ["worknodirect.>"], "retention": "workqueue"})
    try:
        with pytest.raises(Exception) as caught:
            batch_read(spark, nats_server.url, "WorkNoDirect").count()
        assert (
            "Stream 'WorkNoDirect' is a WorkQueue stream, which serves each subject to one consumer only, so a read "
            "through consumers of its own cannot read it: enable Direct Get"
        ) in error_text(caught.value)
    finally:
        api.delete_stream("WorkNoDirect")


def test_streaming_reads_refuse_batch_only_options(spark, nats_server, make_stream, tmp_path):
    stream = make_stream(10, partitions=2)
    df = (
        spark.readStream.format("jetstream")
        .option("servers", nats_server.url)
        .option("stream", stream.name)
        .option("group", stream.group)
        .option("endingPosition", "5")
        .load()
    )
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")).start()
    with pytest.raises(Exception) as caught:
        query.awaitTermination(60)
    assert "Option 'endingPosition' applies to spark.read only" in error_text(caught.value)
