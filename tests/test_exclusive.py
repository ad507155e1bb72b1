"""Spark's member consumers stay Spark's: while a query runs, a second real client that pulls
from a member consumer gets nothing as a standby, and is detected and named when it pulls with the
query's pin id. The second client is plain nats-py in its own process (``jobs/foreign_client.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ack_floors, add_messages, assert_output_exact, checkpoint_log, reader, run_available_now, wait_for
from pyspark.sql.streaming import StreamingQuery

from spark_jetstream.client.jsapi import pin_holder

pytestmark = pytest.mark.slow

FOREIGN = Path(__file__).parent / "jobs" / "foreign_client.py"


def _wait_for_floors(api, stream) -> None:
    """The running query acks its last batch at its next call after the commit, each floor in a task of its own
    (DESIGN 5): floors equal the checkpoint between batches, within moments; a stopped query's may lag one batch."""
    wait_for(
        lambda: set(ack_floors(api, stream).values()) == {stream.last_seq},
        30,
        lambda: f"every ack floor at {stream.last_seq}, not {ack_floors(api, stream)}",
    )


def start_query(spark, url: str, stream, tmp_path: Path, read_mode: str = "auto", **options: object) -> StreamingQuery:
    return (
        reader(spark, url, stream, maxMessagesPerTrigger=500, readMode=read_mode, **options)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="0.5 seconds")
        .start()
    )


def committed_seq(checkpoint: Path) -> int:
    offsets, commits = checkpoint_log(checkpoint, "offsets"), checkpoint_log(checkpoint, "commits")
    return offsets[max(commits)] if commits else 0


def foreign_client(url: str, stream, consumer: str, seconds: float, *extra: str) -> subprocess.Popen:
    args = [sys.executable, str(FOREIGN), "--servers", url, "--stream", stream.name, "--consumer", consumer]
    return subprocess.Popen([*args, "--seconds", str(seconds), *extra], stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize(
    ("read_mode", "options"),
    [("auto", {}), ("pull", {}), ("pull", {"minPartitions": 4})],
    ids=["direct", "pull", "pull-slices"],
)
def test_a_standby_on_a_member_consumer_gets_nothing_while_the_query_reads_new_data(
    read_mode, options, spark, nats_server, conn, api, make_stream, tmp_path
):
    """Direct Get and slices through consumers of the tasks' own: the driver holds the pins; pulled members: the
    tasks do."""
    stream = make_stream(2000, partitions=2)
    query = start_query(spark, nats_server.url, stream, tmp_path, read_mode, **options)
    try:
        wait_for(lambda: committed_seq(tmp_path / "cp") >= 1000, 120, "the first batches")
        standby = foreign_client(nats_server.url, stream, stream.consumer(0), 15)
        for round_ in range(10):  # new data while the standby pulls
            add_messages(conn, stream, 300, seed=100 + round_)
            time.sleep(1)
        got = json.loads(standby.communicate(timeout=60)[0])
        wait_for(lambda: committed_seq(tmp_path / "cp") == stream.last_seq, 120, "the query to read everything")
        assert got["messages"] == 0, got
        assert got["statuses"], got  # it did pull: its pulls expired unanswered
        assert query.isActive and query.exception() is None
        _wait_for_floors(api, stream)
    finally:
        query.stop()
    assert_output_exact(spark, stream, tmp_path)


def test_a_client_pulling_with_the_querys_pin_id_is_detected_and_named(
    spark, nats_server, conn, api, make_stream, tmp_path
):
    stream = make_stream(3000, partitions=2)
    consumer = stream.consumer(1)
    query = start_query(spark, nats_server.url, stream, tmp_path)
    try:
        wait_for(lambda: committed_seq(tmp_path / "cp") >= 500, 120, "the first batch")
        add_messages(conn, stream, 500, seed=99)  # something to deliver however far the query got
        thief = foreign_client(nats_server.url, stream, consumer, 20, "--with-pin")
        got = json.loads(thief.communicate(timeout=60)[0])
        assert got["messages"] > 0, got  # it presented the pin id, so the server served it
        wait_for(lambda: query.exception() is not None, 30, "the query to fail")
        detected = time.time() - got["first_message_at"]
        print(f"foreign puller: {got['messages']} messages; the query failed {detected:.1f}s after the first")
    finally:
        query.stop()
    message = str(query.exception())
    assert f"Another client is pulling from member consumer {consumer!r} on stream {stream.name!r}" in message
    assert "deliveries since the query last reset it" in message
    assert f"$JS.API.CONSUMER.MSG.NEXT.{stream.name}.{stream.group}-*" in message
    # the restart reads on from the checkpoint: exact output, floors at the end
    run_available_now(reader(spark, nats_server.url, stream), tmp_path)
    assert_output_exact(spark, stream, tmp_path)
    assert set(ack_floors(api, stream).values()) == {stream.last_seq}


def pinned_id(api, stream, consumer: str) -> str | None:
    return pin_holder(api.consumer_info(stream.name, consumer))


def test_the_pin_outlives_an_idle_stretch_longer_than_the_priority_timeout(
    spark, nats_server, conn, api, make_stream, tmp_path
):
    """A standby that starts after the query sat idle for longer than ``priority_timeout`` (when an
    unkept pin would have lapsed) still gets nothing from the new data."""
    stream = make_stream(1000, partitions=1)
    consumer = stream.consumer(0)
    query = start_query(spark, nats_server.url, stream, tmp_path, priorityTimeout="8s")  # not the 2 min default
    try:
        wait_for(lambda: committed_seq(tmp_path / "cp") == stream.last_seq, 120, "the query to read everything")
        wait_for(lambda: pinned_id(api, stream, consumer) is not None, 10, "the query to hold the pin")
        pin = pinned_id(api, stream, consumer)
        timeout = api.consumer_info(stream.name, consumer)["config"]["priority_timeout"] / 1e9
        assert timeout == 8  # the option reached the member consumer
        time.sleep(timeout + 3)  # idle: nothing new to read
        standby = foreign_client(nats_server.url, stream, consumer, 12)
        time.sleep(2)  # the standby is waiting when the new data comes
        add_messages(conn, stream, 600, seed=11)
        got = json.loads(standby.communicate(timeout=60)[0])
        wait_for(lambda: committed_seq(tmp_path / "cp") == stream.last_seq, 120, "the query to read the new data")
        assert got["messages"] == 0, got
        assert pinned_id(api, stream, consumer) == pin  # the same pin all along
        assert query.isActive and query.exception() is None
        _wait_for_floors(api, stream)
    finally:
        query.stop()
    assert_output_exact(spark, stream, tmp_path)
