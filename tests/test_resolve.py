"""Streaming reads, batch reads and the command line resolve a group, a start and a loss alike
(``groups.resolve``, ``read.start``), against a real server, without Spark."""

from __future__ import annotations

import json

import pytest

from spark_jetstream.errors import DataLossError, GroupConfigError
from spark_jetstream.groups.admin import group_layout, status
from spark_jetstream.groups.layout import member_consumer_config
from spark_jetstream.read.batch import BatchConfig, plan
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.coordinator import Coordinator

pytestmark = pytest.mark.slow


def coordinator(url: str, stream: str, group: str, **options: str) -> Coordinator:
    return Coordinator(SourceConfig.parse({"servers": url, "stream": stream, "group": group, **options}))


def test_the_cli_shows_the_members_a_query_gave_a_derived_group(nats_server, api, make_stream):
    stream = make_stream(100, partitions=4)
    query = coordinator(nats_server.url, stream.name, "two", members="2")
    try:
        assert query.group is not None
        query.group.members.ensure(query.state().retention)
        layout = group_layout(api, stream.name, "two")  # counted from the consumers, checked against their filters
        assert layout == query.group.layout
        assert {m.name: m.partitions for m in layout.members} == {"0": (0, 1), "1": (2, 3)}
        assert [row.partitions for row in status(api, stream.name, "two")] == [(0, 1), (2, 3)]
        assert group_layout(api, stream.name, "two", members=4).member_names == ["0", "1", "2", "3"]
    finally:
        query.close()
    # A consumer whose filters are not those of any query's layout is not taken for a member.
    api.create_consumer(stream.name, member_consumer_config("odd", "0", ["1.>", "3.>"]))
    with pytest.raises(GroupConfigError, match="Member consumer 'odd-0' filters .* pass --members"):
        group_layout(api, stream.name, "odd")
    with pytest.raises(GroupConfigError, match="There is no group 'none'"):
        group_layout(api, stream.name, "none")


def test_a_static_group_on_a_stream_without_its_partitions_is_refused_by_every_read(nats_server, conn, api):
    api.create_stream({"name": "Plain", "subjects": ["plain.*"], "allow_direct": True})

    async def write_config() -> None:
        kv = await conn.client.jetstream().create_key_value(bucket="static-consumer-groups")
        await kv.put("Plain.st", json.dumps({"max_members": 2, "members": ["a", "b"]}).encode())

    conn.run(write_config())
    try:
        refusal = "Stream 'Plain' does not put a partition number 0..1 first in its subjects"
        with pytest.raises(GroupConfigError, match=refusal):
            coordinator(nats_server.url, "Plain", "st")
        config = BatchConfig.parse({"servers": nats_server.url, "stream": "Plain", "group": "st"})
        with pytest.raises(GroupConfigError, match=refusal):  # batch reads used to read nothing, silently
            plan(conn, config)
        with pytest.raises(GroupConfigError, match=refusal):
            group_layout(api, "Plain", "st")
    finally:
        api.delete_stream("KV_static-consumer-groups")
        api.delete_stream("Plain")


def test_batch_and_streaming_reads_start_and_detect_loss_alike(nats_server, conn, api, make_stream):
    stream = make_stream(300, partitions=2)
    for p in range(2):
        api.conn.run(api.reset(stream.name, stream.consumer(p), 101 + p * 50))  # floors 100 and 150
    batch = BatchConfig.parse(
        {"servers": nats_server.url, "stream": stream.name, "group": stream.group, "startingPosition": "group"}
    )
    assert min(r.start for r in plan(conn, batch)) >= 100
    query = coordinator(nats_server.url, stream.name, stream.group)
    try:
        assert query.initial().seq == 100
    finally:
        query.close()
    missing = "startingPosition=group, but group 'ghost' has no member consumer ghost-0, ghost-1"
    ghost = BatchConfig.parse(
        {"servers": nats_server.url, "stream": stream.name, "group": "ghost", "startingPosition": "group"}
    )
    with pytest.raises(GroupConfigError, match=missing):
        plan(conn, ghost)
    api.purge_stream(stream.name, keep_from_seq=201)  # also moves the floors to 200
    lost = f"Messages seqs 101..200 of stream '{stream.name}' were removed"
    with pytest.raises(DataLossError, match=lost):
        plan(conn, BatchConfig.parse({"servers": nats_server.url, "stream": stream.name, "startingPosition": "101"}))
    query = coordinator(nats_server.url, stream.name, stream.group)
    try:
        with pytest.raises(DataLossError, match=lost):
            query.plan(query.watermark(100), query.watermark(300))
    finally:
        query.close()
