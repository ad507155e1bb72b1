"""The driver-side coordinator against a real server (no Spark): start positions, limits,
planning, group configs from KV, commit."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
from helpers import wait_for

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import DataLossError, GroupConfigError, OptionError, ReaderError
from spark_jetstream.groups.admin import create_group, delete_group
from spark_jetstream.groups.layout import GroupConfig, PartitioningFilter, partitioned_stream_config, work_stream_name
from spark_jetstream.options import parse_connection_options
from spark_jetstream.read.ranges import SmallBatch
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.coordinator import ONE_TASK_MESSAGES, Coordinator
from spark_jetstream.streaming.offsets import Watermark
from spark_jetstream.streaming.ownership import owner_subject
from spark_jetstream.streaming.planning import Limits
from spark_jetstream.testing import EmbeddedServer


@pytest.fixture
def coordinators():
    made: list[Coordinator] = []

    def make(url: str, stream: str, group: str, **options: str) -> Coordinator:
        config = SourceConfig.parse({"servers": url, "stream": stream, "group": group, **options})
        made.append(Coordinator(config))
        return made[-1]

    yield make
    for coordinator in made:
        coordinator.close()


def test_starting_positions(nats_server, conn, make_stream, coordinators):
    stream = make_stream(300, partitions=2)
    url = nats_server.url
    assert coordinators(url, stream.name, "fresh").initial().seq == 0  # no consumers: earliest
    assert coordinators(url, stream.name, "a", startingPosition="latest").initial().seq == 300
    assert coordinators(url, stream.name, "b", startingPosition="120").initial().seq == 119
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    publish_all(conn, ((stream.messages[1][0], b"later", None) for _ in range(5)))  # seqs 301..305
    assert coordinators(url, stream.name, "c", startingTimestamp=middle.isoformat()).initial().seq == 300
    later = str(int(time.time() * 1000) + 60_000)
    assert coordinators(url, stream.name, "d", startingTimestamp=later).initial().seq == 305
    api = JetStreamApi(conn)
    api.create_stream({"name": "Empty", "subjects": ["empty.>"]})
    try:
        assert coordinators(url, "Empty", "e").initial().seq == 0  # never held a message: first_seq is 0, not 1
    finally:
        api.delete_stream("Empty")  # the server is the session's


def test_group_position_is_the_member_consumers_ack_floor(nats_server, api, make_stream, coordinators):
    stream = make_stream(300, partitions=2)  # make_stream created the group's member consumers
    for p in range(2):
        api.conn.run(api.reset(stream.name, stream.consumer(p), 101 + p * 50))  # floors 100 and 150
    coordinator = coordinators(nats_server.url, stream.name, stream.group)
    assert coordinator.initial().seq == 100  # default is "group" once the consumers exist: the lowest floor
    with pytest.raises(GroupConfigError, match="has no member consumer ghost-0, ghost-1"):
        coordinators(nats_server.url, stream.name, "ghost", startingPosition="group").initial()


def test_limits_and_plans(nats_server, api, make_stream, coordinators):
    stream = make_stream(1000, partitions=8)
    coordinator = coordinators(nats_server.url, stream.name, stream.group)
    start = Watermark(stream.name, 0)
    assert coordinator.latest(start, Limits(max_rows=250)).seq == 250
    assert coordinator.latest(start, Limits()).seq == 1000
    (small,) = coordinator.plan(Watermark(stream.name, 990), Watermark(stream.name, 1000))  # one task, in seq order
    assert (small.filter, small.start, small.end) == (">", 990, 1000)
    coordinator.commit(Watermark(stream.name, 1000))

    def floors() -> set[int]:
        return {api.consumer_info(stream.name, stream.consumer(p))["ack_floor"]["stream_seq"] for p in range(8)}

    # Each floor moves in a task of its own, which the commit waits for at most FLOOR_WAIT (decision 0002).
    wait_for(lambda: floors() == {1000}, 5, lambda: f"every floor at 1000, not {floors()}")


def test_a_small_batch_is_one_task_and_a_larger_one_a_task_per_partition(nats_server, api, make_stream, coordinators):
    """Up to ``ONE_TASK_MESSAGES`` (and one record batch's bytes) a Direct Get batch is one task; above, each
    partition's range is a task of its own, and ``minPartitions`` cuts the batch by seq. Cut by seq, a read of every
    message of the stream uses the one filter ">" (decision 0017); else it reads each partition's range."""
    stream = make_stream(ONE_TASK_MESSAGES + 100, partitions=4)
    start, small, large = (Watermark(stream.name, seq) for seq in (0, ONE_TASK_MESSAGES, ONE_TASK_MESSAGES + 1))
    (batch,) = coordinators(nats_server.url, stream.name, stream.group).plan(start, small)
    assert (batch.filter, batch.start, batch.end) == (">", 0, ONE_TASK_MESSAGES)
    tasks = coordinators(nats_server.url, stream.name, "large").plan(start, large)
    assert [(r.filter, r.end) for r in tasks] == [(f"{p}.>", ONE_TASK_MESSAGES + 1) for p in range(4)]
    tasks = coordinators(nats_server.url, stream.name, "cut", minPartitions="4").plan(start, small)
    assert [(r.filter, r.start, r.end) for r in tasks] == [(">", i * 1024, (i + 1) * 1024) for i in range(4)]
    # A stream that also stores subjects outside its partition transform: the partitions' filters.
    config = api.stream_info(stream.name)["config"]
    subjects = [*config["subjects"], f"other.{stream.name}"]
    api.call(("STREAM", "UPDATE", stream.name), {**config, "subjects": subjects}, "Adding a subject")
    (batch,) = coordinators(nats_server.url, stream.name, "apart").plan(start, small)
    assert isinstance(batch, SmallBatch) and [r.filter for r in batch.ranges] == [f"{p}.>" for p in range(4)]
    assert [(r.start, r.end) for r in batch.ranges] == [(stream.expected(p, 0, 10)[0] - 1, small.seq) for p in range(4)]
    tasks = coordinators(nats_server.url, stream.name, "apart-cut", minPartitions="8").plan(start, small)
    assert len(tasks) == 8 and {r.filter for r in tasks} == {f"{p}.>" for p in range(4)}


def test_without_partition_order_a_batch_is_cut_by_seq_through_one_unfiltered_read(
    nats_server, api, make_stream, coordinators
):
    """``preservePartitionOrder=false``: a larger batch is as many contiguous ">" ranges as the read has filters (or
    ``minPartitions``), a small one stays one task; a group whose members read only part of the stream is refused
    when the query starts, naming the option and the filters (each filter would still be read filtered)."""
    stream = make_stream(ONE_TASK_MESSAGES + 100, partitions=4)
    start, small, large = (Watermark(stream.name, seq) for seq in (0, ONE_TASK_MESSAGES, ONE_TASK_MESSAGES + 100))
    url = nats_server.url
    tasks = coordinators(url, stream.name, stream.group, preservePartitionOrder="false").plan(start, large)
    assert [r.filter for r in tasks] == [">"] * 4
    assert [(r.start, r.end) for r in tasks] == [(i * (large.seq // 4), (i + 1) * (large.seq // 4)) for i in range(4)]
    tasks = coordinators(url, stream.name, "six", preservePartitionOrder="false", minPartitions="6").plan(start, large)
    assert len(tasks) == 6 and {r.filter for r in tasks} == {">"}
    (batch,) = coordinators(url, stream.name, "small", preservePartitionOrder="false").plan(start, small)
    assert (batch.filter, batch.start, batch.end) == (">", 0, small.seq)
    config = api.stream_info(stream.name)["config"]
    subjects = [*config["subjects"], f"other.{stream.name}"]
    api.call(("STREAM", "UPDATE", stream.name), {**config, "subjects": subjects}, "Adding a subject")
    with pytest.raises(OptionError) as refused:
        coordinators(url, stream.name, "apart", preservePartitionOrder="false")
    assert str(refused.value) == (
        f"Option 'preservePartitionOrder' is false, which reads each micro-batch as seq ranges of all of stream "
        f"{stream.name!r} through one unfiltered read, but group 'apart''s members read only part of it (0.>, 1.>, "
        "2.>, 3.>): drop the option (or the `subjects` option), or read a stream whose partition transform every "
        "subject goes through."
    )


def test_without_partition_order_an_elastic_groups_work_stream_is_cut_by_seq(nats_server, conn, api, coordinators):
    """An elastic group's members read its work stream, every message of which comes through the group's partition
    transforms: a larger batch is cut by seq through one unfiltered read, as on a stream with its own transform. Read
    through consumers of the query's own, the WorkQueue stream is refused naming what to change."""
    api.create_stream({"name": "ElasticOrders", "subjects": ["eorders.*"]})
    config = GroupConfig("elastic", 4, members=("m1",), partitioning_filters=(PartitioningFilter("eorders.*", (1,)),))
    create_group(api, "ElasticOrders", "eu", config)
    work, count = work_stream_name("ElasticOrders", "eu"), ONE_TASK_MESSAGES + 100
    try:
        publish_all(conn, ((f"eorders.c{i % 37}", b"x", None) for i in range(count)))
        wait_for(lambda: api.stream_info(work)["state"]["last_seq"] == count, 30, "the work stream to source it all")
        start, large = Watermark(work, 0), Watermark(work, count)

        def plan(**options: str) -> list[tuple[str, int, int]]:
            coordinator = coordinators(nats_server.url, "ElasticOrders", "eu", **options)
            try:
                return [(r.filter, r.start, r.end) for r in coordinator.plan(start, large)]
            finally:
                coordinator.close()  # one query on a group at a time

        assert plan(preservePartitionOrder="false") == [(">", i * count // 4, (i + 1) * count // 4) for i in range(4)]
        assert sorted(f for f, _, _ in plan()) == [f"{p}.eorders.*" for p in range(4)]  # the default: by partition
        with pytest.raises(ReaderError) as refused:
            coordinators(nats_server.url, "ElasticOrders", "eu", preservePartitionOrder="false", readMode="pull")
        assert str(refused.value) == (
            f"Stream {work!r} is a WorkQueue stream, which serves each subject to one consumer only, so a read "
            f"through consumers of its own cannot read it: enable Direct Get (`nats stream edit {work} "
            "--allow-direct`) and read with readMode=auto or direct, or read without minPartitions and with "
            "preservePartitionOrder true (the group's member consumers then take the queue's messages)."
        )
    finally:
        delete_group(api, "ElasticOrders", "eu")
        api.delete_stream("ElasticOrders")


def test_a_pcgroups_static_group_in_kv_is_read(nats_server, conn, api, make_stream, coordinators):
    stream = make_stream(600, partitions=4)

    async def write_config() -> None:
        js = conn.client.jetstream()
        kv = await js.create_key_value(bucket="static-consumer-groups")
        # Exactly what pcgroups writes: members mapped by hand, partitions as a list of ints.
        config = {"max_members": 4, "member_mappings": [{"member": "alice", "partitions": [0, 3]},
                                                        {"member": "bob", "partitions": [1, 2]}]}  # fmt: skip
        await kv.put(f"{stream.name}.kvgroup", json.dumps(config).encode())

    conn.run(write_config())
    try:
        coordinator = coordinators(nats_server.url, stream.name, "kvgroup")
        assert coordinator.group is not None
        layout = coordinator.group.layout
        assert layout.kind == "static"
        assert {m.name: m.partitions for m in layout.members} == {"alice": (0, 3), "bob": (1, 2)}
        assert layout.read_filters == ["0.>", "3.>", "1.>", "2.>"]  # each member's partitions
        (small,) = coordinator.plan(Watermark(stream.name, 0), Watermark(stream.name, 600))
        assert (small.filter, small.start, small.end) == (">", 0, 600)  # all of them: the whole stream, in seq order
        assert {
            api.consumer_info(stream.name, c)["ack_floor"]["stream_seq"] for c in ("kvgroup-alice", "kvgroup-bob")
        } == {0}
        info = api.consumer_info(stream.name, "kvgroup-alice")["config"]
        assert info["filter_subjects"] == ["0.>", "3.>"] and info["priority_groups"] == ["PCG"]
    finally:
        api.delete_stream("KV_static-consumer-groups")


def test_members_option_on_a_partitioned_stream(nats_server, make_stream, coordinators):
    stream = make_stream(100, partitions=4)
    layout = coordinators(nats_server.url, stream.name, "two", members="2").group.layout
    assert {m.name: m.partitions for m in layout.members} == {"0": (0, 1), "1": (2, 3)}
    with pytest.raises(GroupConfigError, match="members=5 is more than the 4 partitions"):
        coordinators(nats_server.url, stream.name, "five", members="5")


def test_a_second_coordinator_on_a_group_is_refused(nats_server, make_stream, coordinators):
    stream = make_stream(10, partitions=1)
    coordinators(nats_server.url, stream.name, "solo")
    with pytest.raises(GroupConfigError, match=r"Group 'solo' on stream .* is already read by a running query"):
        coordinators(nats_server.url, stream.name, "solo")


def test_only_the_owner_the_member_consumers_name_counts_as_a_running_query(
    nats_server, conn, make_stream, coordinators
):
    """Another client answering on the owner subjects (a catch-all responder) neither blocks a group nobody reads nor
    hides a running query: only an answer that is the owner written into the member consumers counts."""
    stream = make_stream(10, partitions=1)

    async def catch_all() -> nats.NATS:
        stranger = await nats.connect(nats_server.url)

        async def answer(msg: Any) -> None:
            await msg.respond(b"spark-node-7:4242 since 2026-01-01T00:00:00.000+00:00")

        await stranger.subscribe("_SPARK_JETSTREAM.>", cb=answer)
        await stranger.flush()
        return stranger

    stranger = conn.run(catch_all())
    try:
        first = coordinators(nats_server.url, stream.name, "solo")
        assert first.group is not None
        owner = first.group.owner
        assert first.group.members.owners() == {owner}
        with pytest.raises(GroupConfigError, match=rf"is already read by a running query \({re.escape(owner)}\)"):
            coordinators(nats_server.url, stream.name, "solo")
    finally:
        conn.run(stranger.close())


def test_the_owner_subject_of_another_domain_is_its_own():
    assert owner_subject("$JS.API", "ORDERS", "g") == "_SPARK_JETSTREAM.owner.ORDERS.g"
    assert owner_subject("$JS.leaf.API", "ORDERS", "g") == "_SPARK_JETSTREAM.owner.$JS.leaf.API.ORDERS.g"
    assert owner_subject("JS.OWNER.API", "ORDERS", "g") == "_SPARK_JETSTREAM.owner.JS.OWNER.API.ORDERS.g"


@pytest.mark.slow
@pytest.mark.parametrize("denied", ["publish", "subscribe"])
def test_a_user_without_the_owner_subject_is_refused_not_taken_for_a_free_group(denied):
    """The one-query-per-group guard needs the owner subject: a permissions violation on it is an
    error naming the fix, not "nobody owns the group"."""
    user = {"user": "u", "password": "pw-42", "permissions": {denied: {"deny": ["_SPARK_JETSTREAM.>"]}}}
    with EmbeddedServer({"authorization": {"users": [user]}}, name="perm") as server:
        options = {"servers": server.url, "user": "u", "password": "pw-42"}
        api = JetStreamApi(connect(parse_connection_options(options)))
        api.create_stream(partitioned_stream_config("Perm", "perm.*", 2))
        try:
            refused = rf"may not {denied} to _SPARK_JETSTREAM\.owner\.Perm\.g \(a permissions violation\): allow it"
            with pytest.raises(GroupConfigError, match=refused):
                Coordinator(SourceConfig.parse({**options, "stream": "Perm", "group": "g"}))
        finally:
            disconnect(parse_connection_options(options))


@pytest.mark.slow
def test_a_stream_that_does_not_answer_is_planned_on_from_the_last_state_read():
    """Stream info needs the stream's leader. While nobody answers it (an election takes 4-9 s after a leader's
    server died), planning goes on up to the last seq read, which the replicas hold, and takes the next answer as
    soon as the stream answers again."""
    server = EmbeddedServer(name="quiet").start()
    options = parse_connection_options({"servers": server.url})
    coordinator = None
    try:
        api = JetStreamApi(connect(options))
        api.create_stream({"name": "Quiet", "subjects": ["quiet.>"], "allow_direct": True})
        publish_all(api.conn, ((f"quiet.{i}", b"x", None) for i in range(50)))
        coordinator = Coordinator(SourceConfig.parse({"servers": server.url, "stream": "Quiet"}))
        start = Watermark("Quiet", 0, coordinator.created)
        assert coordinator.latest(start, Limits()).seq == 50
        server.stop()  # its store stays: it comes back as it was
        began = time.monotonic()
        assert coordinator.latest(start, Limits()).seq == 50  # unanswered: the last state read
        assert coordinator.state(fresh=True).last_seq == 50  # just asked: not again yet
        assert time.monotonic() - began < 5, "planning waited for the stream (15 s before) instead of going on"
        server.start()
        publish_all(api.conn, ((f"quiet.{i}", b"x", None) for i in range(10)))
        wait_for(lambda: coordinator.latest(start, Limits()).seq == 60, 10, "the stream's new state")
    finally:
        if coordinator is not None:
            coordinator.close()
        disconnect(options)
        server.close()


def test_removed_messages_are_skipped_in_one_step_whatever_the_limit_and_said_once(
    nats_server, api, make_stream, coordinators, caplog
):
    """With failOnDataLoss=false, a purged range is passed in one batch (as Kafka's source jumps to the earliest
    offset), not walked ``maxMessagesPerTrigger`` at a time in empty batches, and the log says so once."""
    stream = make_stream(300, partitions=2)
    coordinator = coordinators(nats_server.url, stream.name, stream.group, failOnDataLoss="false")
    start = coordinator.watermark(0)
    api.purge_stream(stream.name, keep_from_seq=281)
    caplog.set_level("WARNING", logger="spark_jetstream")
    coordinator.state(fresh=True)
    end = coordinator.latest(start, Limits(max_rows=20))
    assert end.seq == 300  # 281..300: the first 20 left
    coordinator.latest(start, Limits(max_rows=20))
    ranges = coordinator.plan(start, end)
    assert [(r.start, r.end) for r in ranges] == [(280, 300)]  # one small batch, from the first seq left
    skips = [r.getMessage() for r in caplog.records if "Skipping" in r.getMessage()]
    assert skips == [
        f"Skipping messages seqs 1..280 of stream {stream.name}: removed (retention limits or a purge) before they "
        "were read (failOnDataLoss=false)"
    ]
    strict = coordinators(nats_server.url, stream.name, "strict")
    with pytest.raises(DataLossError, match=rf"Messages seqs 1\.\.280 of stream '{stream.name}' were removed"):
        strict.latest(strict.watermark(0), Limits(max_rows=20))


def test_a_stream_created_again_is_refused_or_read_from_its_first_message(nats_server, api, coordinators, caplog):
    api.create_stream(partitioned_stream_config("Again2", "again2.*", 2))
    try:
        publish_all(api.conn, ((f"again2.k{i}", b"old", None) for i in range(100)))
        first = coordinators(nats_server.url, "Again2", "g")
        old = first.watermark(100).to_offset()
        first.close()
        api.delete_stream("Again2")
        time.sleep(0.01)
        api.create_stream(partitioned_stream_config("Again2", "again2.*", 2))
        publish_all(api.conn, ((f"again2.k{i}", b"new", None) for i in range(30)))
        with pytest.raises(DataLossError, match="Stream 'Again2' was deleted and created again since the checkpoint"):
            coordinators(nats_server.url, "Again2", "g1").position(old)
        caplog.set_level("WARNING", logger="spark_jetstream")
        lenient = coordinators(nats_server.url, "Again2", "g2", failOnDataLoss="false")
        start = lenient.position(old)
        assert start.seq == 0 and start.created == lenient.created != old["created"]
        assert lenient.latest(lenient.position(old), Limits()).seq == 30
        warned = [r.getMessage() for r in caplog.records if "created again" in r.getMessage()]
        assert len(warned) == 1 and warned[0].endswith(
            "Reading the new stream from its first message (failOnDataLoss=false)."
        ), warned
    finally:
        api.delete_stream("Again2")


def test_an_idle_query_waits_for_the_next_message_instead_of_polling(monkeypatch):
    """Caught up and idle, Spark asks ``latestOffset`` every 10 ms: stream info is asked once a second instead of ten
    times (the server's ``/jsz`` API count), and a message published then is planned at the first call after it
    arrives, which the query's subscription on the stream's subjects tells."""
    import urllib.request

    from spark_jetstream.streaming import coordinator as coordinator_module

    monkeypatch.setattr(coordinator_module, "IDLE_AFTER", 0.3)
    with EmbeddedServer(name="idle") as server:

        def api_calls() -> int:
            with urllib.request.urlopen(f"{server.monitor}/jsz") as answer:
                return int(json.load(answer)["api"]["total"])

        options = ConnectionOptions(servers=(server.url,))
        try:
            api = JetStreamApi(connect(options))
            api.create_stream({"name": "IDLE", "subjects": ["idle.>"], "allow_direct": True})
            publish_all(api.conn, ((f"idle.{i}", b"x", None) for i in range(10)))
            coordinator = Coordinator(SourceConfig.parse({"servers": server.url, "stream": "IDLE"}))
            try:
                start = coordinator.watermark(10)
                time.sleep(0.3)
                before = api_calls()
                for _ in range(300):  # 3 s of Spark's polling
                    assert coordinator.latest(start, Limits()) is None
                    time.sleep(0.01)
                idle_calls = api_calls() - before - 1  # less the count's own call
                publish_all(api.conn, [("idle.new", b"y", None)])
                wait_for(lambda: coordinator._waker.woken, 5, "the idle subscription to see the message")
                end = coordinator.latest(start, Limits())
            finally:
                coordinator.close()
        finally:
            disconnect(options)
    assert idle_calls <= 5, idle_calls  # 3 s at one a second; polling asked about 30 times
    assert end is not None and end.seq == 11
