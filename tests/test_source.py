"""The streaming source end to end: real Spark, real nats-server, exact outputs and ack floors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import (
    ack_floors,
    add_messages,
    assert_output_exact,
    checkpoint_log,
    error_text,
    member_infos,
    reader,
    run_available_now,
    start_and_expect,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType

from spark_jetstream.client.publish import publish_all
from spark_jetstream.options import ACK_POLICIES

pytestmark = pytest.mark.slow


EACH_ACK_POLICY = pytest.mark.parametrize("ack_policy", ACK_POLICIES)
"""Both read modes (option ``ackPolicy``), on member consumers of that ack policy."""


@EACH_ACK_POLICY
def test_parquet_sink_gets_exactly_the_stream_and_ack_floors_equal_the_checkpoint(
    ack_policy, spark, nats_server, api, make_stream, tmp_path
):
    stream = make_stream(5000, partitions=4, consumers=ack_policy)
    query = (
        reader(spark, nats_server.url, stream, maxMessagesPerTrigger=1500, ackPolicy=ack_policy)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(progress) >= 4 and all(p["numInputRows"] <= 1500 for p in progress)
    assert_output_exact(spark, stream, tmp_path)

    offsets = checkpoint_log(tmp_path / "cp", "offsets")
    assert set(checkpoint_log(tmp_path / "cp", "commits")) == set(offsets)
    assert offsets[max(offsets)] == stream.last_seq
    assert ack_floors(api, stream) == {stream.consumer(p): stream.last_seq for p in range(4)}
    assert {info["config"]["ack_policy"] for info in member_infos(api, stream).values()} == {ack_policy}


@pytest.mark.parametrize(("ack_policy", "read_mode"), [("explicit", "auto"), ("none", "auto"), ("none", "pull")])
def test_between_batches_every_ack_floor_equals_the_last_committed_offset(
    ack_policy, read_mode, spark, nats_server, api, make_stream, tmp_path
):
    """``record`` runs before the batch's tasks read (the DataFrame is lazy): floors are the last commit's. With
    ``readMode=pull`` on a stream with Direct Get the tasks pull from the member consumers (ack-none: delivery
    moves a floor while a batch is read, and the commit sets it back to the checkpoint).

    The floors are state the connector moves in the background: reading with Direct Get, the query takes each
    member's pin from the first batch on with one delivery that it then RESETs (``streaming/pins.py``), and on an
    ack-none consumer that delivery moves the floor until then. The first batch waits for that (at most 0.5 s), and a
    delivery counted after its RESET is reset within a second. So they are read again until they equal the commit,
    for at most 5 s: a floor left elsewhere fails."""
    stream = make_stream(3000, partitions=3, consumers=ack_policy)
    floors_seen: dict[int, set[int]] = {}

    def record(batch: DataFrame, batch_id: int) -> None:
        committed = {checkpoint_log(tmp_path / "cp", "offsets").get(batch_id - 1, 0)}
        deadline = time.monotonic() + 5
        while (floors := set(ack_floors(api, stream).values())) != committed and time.monotonic() < deadline:
            time.sleep(0.05)
        floors_seen[batch_id] = floors
        batch.count()

    query = (
        reader(spark, nats_server.url, stream, maxMessagesPerTrigger=700, ackPolicy=ack_policy, readMode=read_mode)
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    offsets = checkpoint_log(tmp_path / "cp", "offsets")
    assert len(offsets) >= 5
    for batch_id, floors in floors_seen.items():
        committed = offsets.get(batch_id - 1, 0)  # batch 0 starts at the initial offset: seq 0 (earliest)
        assert floors == {committed}, (batch_id, floors, committed)
    assert set(ack_floors(api, stream).values()) == {stream.last_seq}


@pytest.mark.parametrize("members", [1, 3, 8])
def test_members_owning_several_partitions_read_exactly(members, spark, nats_server, api, make_stream, tmp_path):
    """pcgroups groups often have fewer members than partitions: 1, 3 (3+3+2) and 8 members on 8."""
    stream = make_stream(5000, partitions=8)
    group = f"{stream.group}m{members}"
    run_available_now(
        reader(spark, nats_server.url, stream, maxMessagesPerTrigger=1200, members=members, group=group), tmp_path
    )
    assert_output_exact(spark, stream, tmp_path)
    floors = ack_floors(api, stream, group)
    assert len(floors) == members and set(floors.values()) == {stream.last_seq}
    filters = {len(api.consumer_info(stream.name, name)["config"]["filter_subjects"]) for name in floors}
    assert filters == ({8} if members == 1 else {3, 2} if members == 3 else {1})


def test_tasks_failing_once_are_retried_and_the_output_stays_exact(spark, nats_server, make_stream, tmp_path):
    stream = make_stream(2000, partitions=4)

    @F.udf(LongType())
    def fail_first_attempt(seq: int) -> int:
        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("injected failure of a first task attempt")
        return seq

    run_available_now(
        reader(spark, nats_server.url, stream, maxMessagesPerTrigger=800).withColumn("seq", fail_first_attempt("seq")),
        tmp_path,
    )
    assert_output_exact(spark, stream, tmp_path)


def test_available_now_stops_at_the_sequence_seen_at_start(spark, nats_server, conn, api, make_stream, tmp_path):
    stream = make_stream(4000, partitions=2)
    subject = next(iter(stream.messages.values()))[0]
    stop = threading.Event()

    def keep_publishing() -> None:  # about 4,000 msg/s: the stream grows all along, by a few batches' worth
        while not stop.wait(0.05):
            publish_all(conn, ((subject, b"late", None) for _ in range(200)))

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    try:
        before = api.stream_info(stream.name)["state"]["last_seq"]
        query = (
            reader(spark, nats_server.url, stream, maxMessagesPerTrigger=1000)
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert not query.isActive
    finally:
        stop.set()
        publisher.join()
    seqs = sorted(r.seq for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect())
    target = checkpoint_log(tmp_path / "cp", "offsets")
    assert seqs[-1] == target[max(target)] >= before
    assert seqs == list(range(1, seqs[-1] + 1))  # every message up to the target, each once
    assert api.stream_info(stream.name)["state"]["last_seq"] > seqs[-1]  # publishing went on past it


def test_available_now_with_a_minimum_reads_everything_there_was(spark, nats_server, conn, make_stream, tmp_path):
    """``minMessagesPerTrigger`` holds back no part of an ``availableNow`` run (PySpark ends the run at the first
    trigger that plans no batch, and leaves the minimum's case to the source): fewer messages than the minimum are
    read, and the tail of a longer run too. PySpark 4.0 and 4.1: ``test_spark_versions.py``."""
    stream = make_stream(500, partitions=2)

    def run() -> list[int]:
        rows = reader(spark, nats_server.url, stream, minMessagesPerTrigger=1000, maxMessagesPerTrigger=1000)
        query = (
            rows.writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    assert run() == [500]
    add_messages(conn, stream, 2500, seed=5)
    assert run() == [1000, 1000, 500]
    assert_output_exact(spark, stream, tmp_path)


def test_purged_messages_fail_the_query_or_are_skipped(spark, nats_server, api, make_stream, tmp_path):
    stream = make_stream(1000, partitions=2)

    def run(**options: object):
        return (
            reader(spark, nats_server.url, stream, **options)
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )

    run().awaitTermination(60)  # the checkpoint is now at seq 1000
    publish_all(api.conn, ((stream.messages[1][0], b"more", None) for _ in range(500)))  # seqs 1001..1500
    api.purge_stream(stream.name, keep_from_seq=1201)  # 1001..1200 vanish before the query reads them
    strict = run()
    with pytest.raises(Exception, match=r"Messages seqs 1001\.\.1200 of stream '\w+' were removed") as caught:
        strict.awaitTermination(60)
    # The connector's sentence ends the first line Spark shows, not 20 lines of traceback down.
    first = str(caught.value).splitlines()[0]
    assert first.startswith("[STREAM_FAILED] Query ") and first.endswith(
        "Failed when Python streaming data source perform latestOffset: spark_jetstream.errors.DataLossError: "
        f"Messages seqs 1001..1200 of stream '{stream.name}' were removed (retention limits or a purge) before they "
        "were read: set failOnDataLoss=false to skip them, start later, or raise the stream's limits."
    ), str(caught.value)[:2000]

    lenient = run(failOnDataLoss="false", maxMessagesPerTrigger=20)
    lenient.awaitTermination(60)
    seqs = sorted(r.seq for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect())
    assert seqs == [*range(1, 1001), *range(1201, 1501)]
    # The removed range is passed in one step: no empty batches walking through it 20 seqs at a time.
    assert [p["numInputRows"] for p in lenient.recentProgress] == [20] * 15


def noop_query(spark: SparkSession, url: str, stream, checkpoint: Path) -> StreamingQuery:
    """A query on ``stream``'s group into the ``noop`` sink, with the default trigger."""
    return reader(spark, url, stream).writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()


def test_a_second_query_on_the_same_group_is_refused(spark, nats_server, make_stream, tmp_path):
    stream = make_stream(500, partitions=2)
    first = noop_query(spark, nats_server.url, stream, tmp_path / "cp1")
    try:
        first.processAllAvailable()
        second = noop_query(spark, nats_server.url, stream, tmp_path / "cp2")
        with pytest.raises(Exception, match=f"Group '{stream.group}' on stream '{stream.name}' is already read by"):
            second.awaitTermination(60)
    finally:
        first.stop()


def test_a_member_consumer_changed_by_another_client_is_named_with_the_changed_fields(
    spark, nats_server, api, make_stream, tmp_path
):
    """What a pcgroups member joining the group does to a member consumer: the next batch
    is refused, naming the consumer and each field, old -> new."""
    stream = make_stream(500, partitions=2)
    query = noop_query(spark, nats_server.url, stream, tmp_path / "cp")
    try:
        query.processAllAvailable()
        config = api.consumer_info(stream.name, stream.consumer(0))["config"]
        metadata = {k: v for k, v in config["metadata"].items() if not k.startswith("_nats")}
        changed = {**config, "metadata": metadata, "ack_wait": 5 * 10**9, "priority_timeout": 5 * 10**9}
        api.create_consumer(stream.name, changed, action="update")
        publish_all(api.conn, ((f"{stream.messages[1][0]}", b"more", None) for _ in range(10)))
        with pytest.raises(Exception) as caught:
            query.awaitTermination(60)
        assert (
            f"Member consumer '{stream.consumer(0)}' on stream '{stream.name}' was changed by another client while "
            "this query reads it (ack_wait 3600s -> 5s; priority_timeout 120s -> 5s): stop that client"
        ) in error_text(caught.value)
    finally:
        query.stop()


FRESH = Path(__file__).parent / "jobs" / "fresh_session.py"


def test_format_jetstream_works_in_a_fresh_process_without_registering(nats_server, make_stream):
    """A fresh driver finds the source by Spark's look-up, and so do executors that are processes of their own
    (``local-cluster``: what ``local[2]`` would show, the driver's look-up and forked Python workers, it shows too)."""
    stream = make_stream(1200, partitions=2)
    done = subprocess.run(
        [sys.executable, str(FRESH), "local-cluster[2,1,1024]", nats_server.url, stream.name, stream.group],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",  # nothing from the checkout on sys.path: only the installed package
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"RESULT 1200 1200 1 {stream.last_seq} executors 2" in done.stdout


def _load(spark: SparkSession, **options: str) -> DataFrame:
    return spark.readStream.format("jetstream").options(**options).load()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"stream": "S", "group": "g", "maxMessagePerTrigger": "5"},
            "Unknown option 'maxmessagepertrigger'. Did you mean 'maxMessagesPerTrigger'?",  # Spark lowercases keys
        ),
        ({"group": "g"}, "Option 'stream' is required"),
        (
            {"stream": "S", "group": "g", "maxMessagesPerTrigger": "-5"},
            "Option 'maxMessagesPerTrigger' has an invalid value '-5': expected a whole number greater than 0",
        ),
        ({"stream": "a.b", "group": "g"}, "Option 'stream' has an invalid value 'a.b'"),
        (
            {"stream": "S", "group": "g", "startingPosition": "yesterday"},
            "expected earliest, latest, group, snapshot or a stream sequence number",
        ),
        (
            {"stream": "S", "group": "g", "ackPolicy": "all"},
            "Option 'ackPolicy' has an invalid value 'all': expected explicit or none",
        ),
    ],
    ids=["typo", "missing-stream-option", "negative", "bad-name", "bad-position", "bad-ack-policy"],
)
def test_bad_options_fail_at_load_with_the_option_named(spark, options, message):
    with pytest.raises(Exception) as caught:
        _load(spark, **options)
    assert message in error_text(caught.value)


def test_missing_stream_fails_at_start(spark, nats_server, tmp_path):
    df = _load(spark, servers=nats_server.url, stream="NoSuchStream", group="g")
    start_and_expect(df, tmp_path, "Stream 'NoSuchStream' does not exist on nats://127.0.0.1")


def test_unreachable_server_fails_at_start(spark, tmp_path):
    from spark_jetstream.testing import free_port

    url = f"nats://127.0.0.1:{free_port()}"
    df = _load(spark, servers=url, stream="S", group="g", connectTimeout="2s")
    start_and_expect(df, tmp_path, f"Cannot reach a NATS server at {url} within 2s")


def test_missing_group_with_starting_position_group(spark, nats_server, api, tmp_path):
    api.create_stream({"name": "NoGroup", "subjects": ["nogroup.>"]})
    try:
        df = _load(spark, servers=nats_server.url, stream="NoGroup", group="ghost", startingPosition="group")
        start_and_expect(df, tmp_path, "startingPosition=group, but group 'ghost' has no member consumer ghost-0")
    finally:
        api.delete_stream("NoGroup")


def test_workqueue_stream_with_a_foreign_overlapping_consumer(spark, nats_server, api, tmp_path):
    api.create_stream({"name": "WQ", "subjects": ["wq.>"], "retention": "workqueue"})
    try:
        api.create_consumer("WQ", {"durable_name": "legacy-worker", "ack_policy": "explicit"})
        df = _load(spark, servers=nats_server.url, stream="WQ", group="g")
        start_and_expect(
            df, tmp_path, "stream 'WQ' is a WorkQueue stream and another consumer (legacy-worker) already takes"
        )
    finally:
        api.delete_stream("WQ")


@pytest.mark.parametrize("retention", ["workqueue", "interest"])
def test_ack_policy_none_is_refused_where_delivery_would_remove_messages(retention, spark, nats_server, api, tmp_path):
    from spark_jetstream.groups.layout import partitioned_stream_config

    name = f"AckNone{retention}"
    api.create_stream(partitioned_stream_config(name, f"{name}.*", 2, retention=retention))
    try:
        publish_all(api.conn, ((f"{name}.k{i}", b"x", None) for i in range(20)))
        stored = api.stream_info(name)["state"]["messages"]  # an Interest stream keeps none: nobody is interested
        df = _load(spark, servers=nats_server.url, stream=name, group="g", ackPolicy="none")
        start_and_expect(
            df, tmp_path, f"ackPolicy=none needs a stream with Limits retention, but stream {name!r} has {retention}"
        )
        assert api.consumer_names(name) == []  # refused before any consumer was made
        assert api.stream_info(name)["state"]["messages"] == stored
    finally:
        api.delete_stream(name)


@pytest.mark.parametrize(
    ("made", "read", "says"),
    [
        (
            "explicit",
            "none",
            "but this query reads with ackPolicy=none, and a consumer's ack policy cannot change. Set "
            ".option('ackPolicy', 'explicit'), or delete the member consumers",
        ),
        (  # made by hand with AckAll: the message must not suggest .option('ackPolicy', 'all'), which is refused
            "all",
            "explicit",
            "which spark-jetstream does not read with (ackPolicy is one of explicit, none), and a consumer's ack "
            "policy cannot change: delete the member consumers",
        ),
    ],
)
def test_member_consumers_of_another_ack_policy_are_refused_with_a_fix_that_works(
    made, read, says, spark, nats_server, api, make_stream, tmp_path
):
    stream = make_stream(500, partitions=2, consumers=made)
    df = reader(spark, nats_server.url, stream, ackPolicy=read)
    start_and_expect(
        df,
        tmp_path / "refused",
        f"Member consumer {stream.consumer(0)!r} on stream {stream.name!r} has ack policy {made!r}, {says}",
    )
    for name in member_infos(api, stream):  # the fix the message names
        api.delete_consumer(stream.name, name)
    _available_now(spark, nats_server.url, stream, tmp_path / "cp", ackPolicy=read).awaitTermination(60)
    assert ack_floors(api, stream) == {stream.consumer(p): stream.last_seq for p in range(2)}
    assert {info["config"]["ack_policy"] for info in member_infos(api, stream).values()} == {read}


def _available_now(spark, url, stream, checkpoint: Path, **options: object):
    return (
        reader(spark, url, stream, **options)
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_restart_moves_a_lagging_ack_floor_forward_to_the_checkpoint(spark, nats_server, api, make_stream, tmp_path):
    stream = make_stream(800, partitions=2)
    _available_now(spark, nats_server.url, stream, tmp_path / "cp").awaitTermination(60)
    api.conn.run(api.reset(stream.name, stream.consumer(1), 100))  # someone moved member 1 back to seq 99
    publish_all(api.conn, ((stream.messages[1][0], b"more", None) for _ in range(10)))
    _available_now(spark, nats_server.url, stream, tmp_path / "cp").awaitTermination(60)
    assert set(ack_floors(api, stream).values()) == {stream.last_seq + 10}


def test_ack_floor_ahead_of_the_checkpoint_on_a_workqueue_stream_is_refused(spark, nats_server, api, tmp_path):
    from spark_jetstream.groups.layout import partitioned_stream_config

    api.create_stream(partitioned_stream_config("WQP", "wqp.*", 2, retention="workqueue"))
    try:
        publish_all(api.conn, ((f"wqp.k{i}", b"x", None) for i in range(300)))
        stream = type("S", (), {"name": "WQP", "group": "wg"})
        _available_now(spark, nats_server.url, stream, tmp_path / "cp", maxMessagesPerTrigger=100).awaitTermination(60)
        assert api.stream_info("WQP")["state"]["messages"] == 0  # committed data left the work queue
        publish_all(api.conn, ((f"wqp.k{i}", b"y", None) for i in range(50)))  # seqs 301..350
        # Acked behind Spark's back (a RESET forward, which leaves a work queue's messages, and the
        # removal that acks of 301..340 would have made):
        api.conn.run(api.reset("WQP", "wg-0", 341))
        api.conn.run(api.purge_below("WQP", 341, "0.>"))
        query = _available_now(spark, nats_server.url, stream, tmp_path / "cp")
        with pytest.raises(Exception) as caught:
            query.awaitTermination(60)
        assert "Member consumer 'wg-0' has acked up to seq 340, past the checkpoint's seq 300" in error_text(
            caught.value
        )
    finally:
        api.delete_stream("WQP")


def test_an_idle_query_does_not_hammer_the_server(spark, nats_server, make_stream, tmp_path):
    import urllib.request

    stream = make_stream(100, partitions=2)

    def api_calls() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{nats_server.monitor_port}/jsz") as response:
            return json.load(response)["api"]["total"]

    query = noop_query(spark, nats_server.url, stream, tmp_path / "cp")
    try:
        query.processAllAvailable()
        before = api_calls()
        time.sleep(3)
        calls = api_calls() - before
    finally:
        query.stop()
    # Spark asks for the latest offset every 10 ms (300 times in 3 s); stream info is throttled to 10/s.
    assert calls <= 45, calls
