"""Consumer groups: pcgroups configs, elastic membership changes under a running query, the CLI."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import wait_for
from pyspark.sql import DataFrame
from pyspark.sql.functions import spark_partition_id

from spark_jetstream.client.publish import publish_all
from spark_jetstream.client.subjects import covers
from spark_jetstream.errors import GroupConfigError
from spark_jetstream.groups.admin import change_members, create_group, delete_group, load_group, status
from spark_jetstream.groups.layout import (
    GroupConfig,
    PartitioningFilter,
    layout_from_config,
    partition_filters,
    partitioned_stream_config,
    reads_whole_stream,
    work_stream_name,
)
from spark_jetstream.groups.resolve import resolve_layout
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.coordinator import Coordinator


def test_pcgroups_json_round_trips_and_validation_names_the_problem():
    raw = {"max_members": 4, "partitioning_filters": [{"filter": "orders.*", "partitioning_wildcards": [1]}],
           "max_buffered_msg": 1000, "members": ["m1", "m2"]}  # fmt: skip
    config = GroupConfig.from_json("elastic", json.dumps(raw), "test config")
    assert config.to_json() == raw
    assert config.work_stream_config({"name": "orders"}, "g")["sources"][0]["subject_transforms"] == [
        {"src": "orders.*", "dest": "{{Partition(4,1)}}.orders.{{Wildcard(1)}}"}
    ]
    assert GroupConfig.from_json("elastic", '{"max_members": 2, "partitioning_filters": null}', "x").to_json() == {
        "max_members": 2,
        "partitioning_filters": None,
    }
    cases = {
        '{"max_members": 0}': "max_members must be at least 1",
        '{"max_members": 2, "members": ["a"], "member_mappings": [{"member": "b", "partitions": [0, 1]}]}':
            "either members or member_mappings, not both",
        '{"max_members": 2, "member_mappings": [{"member": "a", "partitions": [0, 1]}, '
        '{"member": "b", "partitions": [1]}]}': "partition 1 is mapped to both 'a' and 'b'",
        '{"max_members": 3, "member_mappings": [{"member": "a", "partitions": [0, 1]}]}':
            "partitions [2] are mapped to no member",
        '{"max_members": 2, "member_mappings": [{"member": "a", "partitions": [0, 5]}]}': "partition 5 of member 'a'",
        '{"max_members": 2, "members": ["no.dots"]}': "member name 'no.dots' may use only",
        '{"members": ["a"]}': "is not a valid static group config",
    }  # fmt: skip
    for text, problem in cases.items():
        with pytest.raises(GroupConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
            GroupConfig.from_json("static", text, "test config")


def test_explicit_mappings_keep_their_partition_order_in_the_filter_subjects():
    """As pcgroups does: its tools re-create a member consumer whose filter list differs."""
    mappings = [{"member": "b", "partitions": [3, 1]}, {"member": "a", "partitions": [2, 0]}]
    raw = json.dumps({"max_members": 4, "member_mappings": mappings})
    layout = layout_from_config("S", "g", GroupConfig.from_json("static", raw, "test config"))
    assert {m.name: list(m.filter_subjects) for m in layout.members} == {"a": ["2.>", "0.>"], "b": ["3.>", "1.>"]}


def test_a_read_is_of_the_whole_stream_when_every_message_comes_through_the_partition_transforms():
    """What lets ``preservePartitionOrder=false`` (and small batches) read ``>``: the stream's own transform taking
    every subject, or an elastic group's work stream, whose sources take only what their transforms match."""
    own = partitioned_stream_config("S", "ev.*", 4)
    assert reads_whole_stream(own, partition_filters(range(4)))
    assert reads_whole_stream(own, partition_filters(range(4), ["ev.*"]))
    assert not reads_whole_stream(own, partition_filters(range(3)))
    assert reads_whole_stream(own, partition_filters(range(4), ["ev.>"]))  # takes all of each <p>.ev.*
    assert not reads_whole_stream(own, partition_filters(range(4), ["*"]))  # one token: none of <p>.ev.<token>
    assert not reads_whole_stream(own, partition_filters(range(4), ["ev.k1"]))
    assert not reads_whole_stream({**own, "subjects": ["ev.*", "other"]}, partition_filters(range(4)))
    plain = {"name": "P", "subjects": ["ev.>"]}  # its subjects may have been edited since older messages came
    assert reads_whole_stream(plain, [">"]) and not reads_whole_stream(plain, ["ev.>"])
    assert [covers(">", "a.*"), covers("a.>", "a.b.*"), covers("a.*", "a.>"), covers("a.*.c", "a.b.c")] == [
        True, True, False, True
    ]  # fmt: skip
    assert [covers("a.*", "a"), covers("a.>", "a"), covers("a.b", "a.*"), covers("*.>", "x.>")] == [
        False, False, False, True
    ]  # fmt: skip
    filters = (PartitioningFilter("orders.*", (1,)), PartitioningFilter("refunds.>"))
    config = GroupConfig("elastic", 4, members=("m1", "m2"), partitioning_filters=filters)
    work = config.work_stream_config({"name": "S"}, "g")
    assert reads_whole_stream(work, layout_from_config(work["name"], "g", config).read_filters)
    assert reads_whole_stream(work, partition_filters(range(4)))
    assert not reads_whole_stream(work, partition_filters(range(4), ["orders.*"]))  # the refunds left out
    assert not reads_whole_stream({**work, "subjects": ["also.>"]}, partition_filters(range(4)))

    def sourced(*transforms: tuple[str, str]) -> dict[str, object]:
        return {
            **work,
            "sources": [{"name": "S", "subject_transforms": [{"src": s, "dest": d} for s, d in transforms]}],
        }

    renamed = sourced(("orders.*", "{{Partition(4,1)}}.o.{{Wildcard(1)}}"))
    assert reads_whole_stream(renamed, partition_filters(range(4), ["o.*"]))
    assert not reads_whole_stream(renamed, partition_filters(range(4), ["orders.*"]))
    assert not reads_whole_stream(
        sourced(("a.*", "{{Partition(4,1)}}.a.*"), ("b.*", "{{Partition(2,1)}}.b.*")), ["0.>", "1.>"]
    )
    assert not reads_whole_stream(sourced(("a.*", "a.{{Wildcard(1)}}")), partition_filters(range(4)))
    odd = sourced(("a.*", "{{Partition(4,1)}}.x{{Wildcard(1)}}"))  # stored as <p>.x<token>: only <p>. is known
    assert reads_whole_stream(odd, partition_filters(range(4)))
    assert not reads_whole_stream(odd, partition_filters(range(4), ["x*"]))
    assert not reads_whole_stream({**work, "sources": [{"name": "S"}]}, partition_filters(range(4)))  # as published


@pytest.mark.parametrize("ordered", [True, False], ids=["default", "preservePartitionOrder-false"])
def test_elastic_membership_changes_between_batches_lose_and_double_nothing(spark, nats_server, api, tmp_path, ordered):
    """Members change between batches: nothing lost or doubled, each batch's member consumers as the group says.
    With ``preservePartitionOrder=false``, batches of 4,800 (more than one task's) are read as seq slices of the
    whole work stream: 8 tasks (as many as the members' filters), each a contiguous run of seqs."""
    per_batch = 600 if ordered else 4800
    api.create_stream({"name": "Orders", "subjects": ["orders.*"]})
    try:
        published = [(f"orders.c{i % 37}", f"order-{i}".encode()) for i in range(5 * per_batch)]
        publish_all(api.conn, ((s, d, None) for s, d in published))
        config = GroupConfig(
            "elastic", 8, members=("m1", "m2"), partitioning_filters=(PartitioningFilter("orders.*", (1,)),)
        )
        create_group(api, "Orders", "eg", config)
        work = work_stream_name("Orders", "eg")
        changes = iter([("m3", "m4"), ("m2", "m3", "m4"), ("m5", "m6")])  # 2 -> 4 -> 1 -> 3 members
        seen: list[tuple[str, bytes]] = []
        consumers_per_batch: list[set[str]] = []
        slices_per_batch: list[list[list[int]]] = []

        def sink(batch: DataFrame, batch_id: int) -> None:
            rows = batch.select("seq", "subject", "data", spark_partition_id().alias("task")).collect()
            seen.extend((r.subject, bytes(r.data)) for r in rows)
            tasks: dict[int, list[int]] = {}
            for row in rows:
                tasks.setdefault(row.task, []).append(row.seq)
            slices_per_batch.append(sorted(sorted(seqs) for seqs in tasks.values()))
            consumers_per_batch.append(set(api.consumer_names(work)))
            change = next(changes, None)
            if change and batch_id == 0:
                change_members(api, "Orders", "eg", add=change)
            elif change and batch_id == 1:
                change_members(api, "Orders", "eg", drop=change)
            elif change:
                change_members(api, "Orders", "eg", add=change)

        query = (
            spark.readStream.format("jetstream")
            .option("servers", nats_server.url)
            .option("stream", "Orders")
            .option("group", "eg")
            .option("maxMessagesPerTrigger", per_batch)
            .option("preservePartitionOrder", str(ordered).lower())
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert sorted(seen) == sorted(published)  # every message exactly once
        assert consumers_per_batch[:4] == [{"m1", "m2"}, {"m1", "m2", "m3", "m4"}, {"m1"}, {"m1", "m5", "m6"}]
        if not ordered:
            assert [len(slices) for slices in slices_per_batch] == [8] * 5
            assert all(seqs == list(range(seqs[0], seqs[-1] + 1)) for slices in slices_per_batch for seqs in slices)

        # committed data left the work queue: its purges may still be at work when the query has ended (1 of 4 suite
        # runs under load left 340 of the last batch's messages for the assertion to see)
        def left() -> int:
            return api.stream_info(work)["state"]["messages"]

        wait_for(lambda: left() == 0, 30, lambda: f"the work queue to drain: {left()} messages left")
        assert {row.member: row.lag for row in status(api, "Orders", "eg")} == {"m1": 0, "m5": 0, "m6": 0}
    finally:
        delete_group(api, "Orders", "eg")
        api.delete_stream("Orders")


def test_the_pin_keeper_does_not_take_the_querys_own_membership_change_for_another_client(nats_server, api):
    """The race the elastic test above once lost: the keeper's once-a-second check read the member consumers
    while the query was remaking them for a new membership, and named the query's own change another client's."""
    api.create_stream({"name": "Race", "subjects": ["race.*"]})
    options = {"servers": nats_server.url, "stream": "Race", "group": "eg"}
    coordinator = None
    try:
        publish_all(api.conn, ((f"race.c{i % 7}", b"x", None) for i in range(200)))
        config = GroupConfig(
            "elastic", 8, members=("m1", "m2"), partitioning_filters=(PartitioningFilter("race.*", (1,)),)
        )
        create_group(api, "Race", "eg", config)
        coordinator = Coordinator(SourceConfig.parse(options))
        start, end = coordinator.initial(), coordinator.watermark(100)
        coordinator.plan(start, end)
        coordinator.commit(end)
        assert coordinator.group is not None
        members, keeper = coordinator.group.members, coordinator.group.pins
        assert keeper is not None
        change_members(api, "Race", "eg", drop=("m2",))
        members.layout_changes += 1  # the query's change under way: the layout taken, its consumers not yet remade
        members.layout = resolve_layout(api, api.stream_info("Race")["config"], "eg", None)
        api.conn.run(keeper.check())  # no error
        members.layout_changes += 1
        with pytest.raises(GroupConfigError, match="'m1' on stream 'Race-eg' was changed by another client"):
            api.conn.run(keeper.check())  # the same difference outside a change of the query's is another client's
    finally:
        if coordinator is not None:
            coordinator.close()
        delete_group(api, "Race", "eg")
        api.delete_stream("Race")


def test_group_cli_round_trip(nats_server, api):
    api.create_stream({"name": "Cli", "subjects": ["cli.*"]})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["spark-jetstream", *args, "--servers", nats_server.url], capture_output=True, text=True)

    try:
        made = cli("group", "create", "--stream", "Cli", "--group", "g", "--kind", "elastic", "--max-members", "4",
                   "--filter", "cli.*:1", "--members", "a", "b")  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert "a                partitions 0,1" in made.stdout
        assert cli("group", "add", "--stream", "Cli", "--group", "g", "--members", "c").returncode == 0
        assert load_group(api, "Cli", "g")[0].members == ("a", "b", "c")
        assert cli("group", "list", "--stream", "Cli").stdout.split() == ["g", "elastic"]
        shown = cli("status", "--stream", "Cli", "--group", "g")
        assert shown.returncode == 0 and shown.stdout.splitlines()[0].split()[:3] == [
            "member",
            "consumer",
            "partitions",
        ]
        refused = cli("group", "create", "--stream", "Cli", "--group", "s", "--max-members", "4", "--members", "x")
        assert refused.returncode == 2 and "does not put a partition number 0..3 first" in refused.stderr
        assert cli("group", "delete", "--stream", "Cli", "--group", "g").returncode == 0
        assert "Cli-g" not in api.stream_names()
    finally:
        api.delete_stream("Cli")


def test_group_delete_removes_a_derived_groups_member_consumers_and_nothing_else(nats_server, api, make_stream):
    """A group derived from the stream's partition transform has no config: ``group delete`` removes the member
    consumers a query made for it (its owner metadata says so), and leaves a consumer another tool named alike."""
    stream = make_stream(20, partitions=3)
    Coordinator(SourceConfig.parse({"servers": nats_server.url, "stream": stream.name, "group": "old"})).close()
    api.create_consumer(stream.name, {"durable_name": "old-tool", "ack_policy": "explicit"})
    made = sorted(name for name in api.consumer_names(stream.name) if name.startswith("old-"))
    assert made == ["old-0", "old-1", "old-2", "old-tool"]
    removed = subprocess.run(
        ["spark-jetstream", "group", "delete", "--stream", stream.name, "--group", "old", "--servers", nats_server.url],
        capture_output=True,
        text=True,
    )
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines() == [
        "deleted the member consumer old-0",
        "deleted the member consumer old-1",
        "deleted the member consumer old-2",
        f"deleted group 'old' on stream {stream.name!r}",
    ]
    assert sorted(name for name in api.consumer_names(stream.name) if name.startswith("old-")) == ["old-tool"]
    with pytest.raises(GroupConfigError, match=f"There is no group 'old' on stream {stream.name!r}"):
        delete_group(api, stream.name, "old")


def test_a_static_group_in_pcgroups_exact_json_is_read_by_spark(spark, nats_server, conn, api, make_stream, tmp_path):
    stream = make_stream(2000, partitions=4)
    subject_filter = next(iter(stream.messages.values()))[0].split(".")[0] + ".*"

    async def write_like_pcgroups() -> None:
        kv = await conn.client.jetstream().create_key_value(bucket="static-consumer-groups")
        # Byte for byte what pcgroups' CreateStatic stores for a balanced group with one filter.
        value = f'{{"max_members":4,"filters":["{subject_filter}"],"members":["x","y"]}}'
        await kv.put(f"{stream.name}.pcg", value.encode())

    conn.run(write_like_pcgroups())
    try:
        rows = (
            spark.readStream.format("jetstream")
            .option("servers", nats_server.url)
            .option("stream", stream.name)
            .option("group", "pcg")
            .load()
            .writeStream.format("memory")
            .queryName("pcg_rows")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        rows.awaitTermination(120)
        got = sorted((r.seq, r.subject, r.partition) for r in spark.sql("select * from pcg_rows").collect())
        assert got == sorted((seq, m[0], m[3]) for seq, m in stream.messages.items())
        filters = {
            name: api.consumer_info(stream.name, name)["config"]["filter_subjects"] for name in ("pcg-x", "pcg-y")
        }
        assert filters == {"pcg-x": [f"0.{subject_filter}", f"1.{subject_filter}"],
                           "pcg-y": [f"2.{subject_filter}", f"3.{subject_filter}"]}  # fmt: skip
    finally:
        api.delete_stream("KV_static-consumer-groups")


@pytest.mark.parametrize("retention", ["limits", "workqueue"])
def test_a_group_other_clients_consume_is_refused_before_anything_of_it_changes(
    retention, api, nats_server, make_stream
):
    """A group made by other tooling (member consumers without the connector's metadata, ack_wait 5 s and
    max_ack_pending 1,000 as pcgroups makes them) whose members are consuming: each member pulled as a pcgroups
    member pulls (priority group, pinned), without acking. A query on it is refused naming a member consumer and what
    was seen, and every member consumer keeps its config, its pin and its floor."""
    import asyncio

    import nats

    from spark_jetstream.client.jsapi import PRIORITY_GROUP
    from spark_jetstream.source import JetStreamStreamReader

    stream = make_stream(600, partitions=2, retention=retention)
    for p in range(2):
        config = api.consumer_info(stream.name, stream.consumer(p))["config"]
        config.update(ack_wait=5 * 10**9, max_ack_pending=1000, priority_timeout=5 * 10**9)
        api.create_consumer(stream.name, config, action="update")

    async def consume() -> tuple[nats.NATS, list[int]]:
        client = await nats.connect(nats_server.url)
        got = []
        for p in range(2):
            inbox = client.new_inbox()
            sub = await client.subscribe(inbox)
            subject = api.subject("CONSUMER", "MSG", "NEXT", stream.name, stream.consumer(p))
            request = {"batch": 20, "expires": 30 * 10**9, "group": PRIORITY_GROUP}
            await client.publish(subject, json.dumps(request).encode(), reply=inbox)
            for _ in range(20):
                await sub.next_msg(timeout=5)
            got.append(20)
        return client, got

    loop = asyncio.new_event_loop()
    client, got = loop.run_until_complete(consume())
    try:
        assert got == [20, 20]
        before = {p: api.consumer_info(stream.name, stream.consumer(p)) for p in range(2)}
        pins = {p: before[p]["priority_groups"][0]["pinned_client_id"] for p in range(2)}
        assert all(pins.values())
        options = {"servers": nats_server.url, "stream": stream.name, "group": stream.group}
        with pytest.raises(GroupConfigError) as refused:
            JetStreamStreamReader(SourceConfig.parse(options)).latestOffset(None, None)
        assert str(refused.value) == (
            f"Group '{stream.group}' on stream '{stream.name}' is being consumed by other clients: member consumer "
            f"'{stream.consumer(0)}', which spark-jetstream did not make, is pinned to client '{pins[0]}' (priority "
            "group 'PCG'). The query changes nothing of a group in use (it would rewrite the member consumers and "
            "take their pins): stop those clients (a pin is released 5s after its client's last pull) and start the "
            "query again, or give Spark a group of its own."
        )
        for p in range(2):
            after = api.consumer_info(stream.name, stream.consumer(p))
            assert after["config"] == before[p]["config"]
            assert after["priority_groups"][0]["pinned_client_id"] == pins[p]
            assert after["ack_floor"] == before[p]["ack_floor"]
            assert after["num_ack_pending"] == 20
        assert api.stream_info(stream.name)["state"]["messages"] == 600
    finally:
        loop.run_until_complete(client.close())
        loop.close()
