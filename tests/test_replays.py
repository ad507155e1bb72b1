"""A replay is the batch that was planned (decision 0042), against a real nats-server: the stream reader's driver-side
methods called in the order each PySpark calls them, a first run that stops after planning a batch, a second that
replays it, and the tasks' ``read`` run in this process. The same paths under real Spark, its driver killed:
``test_faults.py`` (PySpark 4.3), ``test_spark_versions.py`` (4.0, 4.1), ``test_sink.py`` (through the jetstream
sink)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import add_messages, spark_json, wait_for
from helpers import query_run as run

from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import DataLossError, OptionError
from spark_jetstream.groups.admin import change_members, create_group, delete_group
from spark_jetstream.groups.layout import GroupConfig, PartitioningFilter, work_stream_name
from spark_jetstream.read.mode import DIRECT, PULL
from spark_jetstream.read.ranges import MemberRange, SeqRange, SmallBatch
from spark_jetstream.source import JetStreamStreamReader
from spark_jetstream.spark_compat import InputPartition

pytestmark = pytest.mark.slow


def shape(parts: list[InputPartition]) -> list[Any]:
    """What a plan's Spark partitions read, without how (Direct Get or a consumer)."""

    def ranges(value: Any) -> Any:
        if isinstance(value, SmallBatch):
            return [ranges(r) for r in value.ranges]
        if isinstance(value, SeqRange):
            return (value.filter, value.start, value.end)
        assert isinstance(value, MemberRange)
        return (value.consumer, value.start, value.end)

    return [ranges(part.value) for part in parts]


def rows(reader: JetStreamStreamReader, parts: list[InputPartition]) -> list[list[int]]:
    """Each Spark partition's seqs, in the order its task hands them to Spark."""
    return [[seq for batch in reader.read(part) for seq in batch.column("seq").to_pylist()] for part in parts]


def offset_at(reader: JetStreamStreamReader, seq: int) -> dict[str, Any]:
    return spark_json(reader.coordinator.watermark(seq).to_offset())


@pytest.mark.parametrize("spark_version", ["4.0", "4.3"])
@pytest.mark.parametrize("position", ["earliest", "latest"])
def test_a_restart_in_batch_0_replays_it_from_the_start_its_end_recorded(
    spark_version, position, nats_server, conn, make_stream
):
    """PySpark logs only a batch's end; on a restart it asks ``initialOffset`` again for batch 0's start (PySpark 4.0
    and 4.1 after ``partitions(end, end)``, which once set the start to that end: batch 0 read nothing). The start is
    worked out at the first ``latestOffset`` and carried in batch 0's end, so the replay reads what the first attempt
    would have, whatever the stream did and ``startingPosition`` says meanwhile. At ``latest`` batch 0 is empty: its
    end puts the start into the offset log."""
    stream = make_stream(600, partitions=2)
    options = {"servers": nats_server.url, "stream": stream.name, "maxMessagesPerTrigger": "700"}
    with run({**options, "startingPosition": position}) as first:
        if spark_version == "4.0":
            end = first.latestOffset()  # 4.0/4.1: no arguments; initialOffset comes after
            initial = first.initialOffset()
        else:
            initial = first.initialOffset()
            end = first.latestOffset(initial, None)
        first_plan = first.partitions(initial, end)
        first_rows = rows(first, first_plan)
    assert initial == {"seq": -1, "stream": stream.name}  # the same in every run
    begin = 0 if position == "earliest" else 600
    assert (end["start"], end["seq"]) == ((0, 600) if position == "earliest" else (600, 600))
    assert sorted(seq for part in first_rows for seq in part) == list(range(begin + 1, end["seq"] + 1))

    add_messages(conn, stream, 200, seed=12)  # what the restart's latest would be, and batch 1's
    restarted = {**options, "startingPosition": "latest" if position == "earliest" else "earliest"}
    with run(restarted) as again:  # an option changed too: batch 0 is as planned
        logged = spark_json(end)
        if spark_version == "4.0":
            assert again.partitions(logged, logged) == []  # what 4.0 and 4.1 call first on a restart
        assert again.initialOffset() == initial
        replay = again.partitions(spark_json(initial), logged)
        assert shape(replay) == shape(first_plan)
        assert rows(again, replay) == first_rows
        following = again.latestOffset() if spark_version == "4.0" else again.latestOffset(logged, None)
        assert following["seq"] == 800 and "start" not in following
        batch_1 = rows(again, again.partitions(logged, following))
    assert sorted(seq for part in batch_1 for seq in part) == list(range(end["seq"] + 1, 801))


def test_a_replay_of_batch_0_after_retention_moved_the_first_message_is_data_loss(nats_server, api, make_stream):
    """``earliest`` was seq 0 when batch 0 was planned; a restart after retention removed seqs 1..100 reports that,
    instead of starting batch 0 at the stream's first message now."""
    stream = make_stream(600, partitions=2)
    options = {"servers": nats_server.url, "stream": stream.name, "maxMessagesPerTrigger": "300"}
    with run(options) as first:
        initial = first.initialOffset()
        end = first.latestOffset(initial, None)
    api.purge_stream(stream.name, keep_from_seq=101)
    with run(options) as again, pytest.raises(DataLossError, match=r"Messages seqs 1\.\.100 of stream .* were removed"):
        again.partitions(spark_json(initial), spark_json(end))


def allow_direct(api, stream: str, allowed: bool) -> None:
    config = api.stream_info(stream)["config"]
    api.call(("STREAM", "UPDATE", stream), {**config, "allow_direct": allowed}, f"Allowing Direct Get on {stream!r}")


def bigger_messages(conn, stream, _) -> None:
    """The stream's average message size grows past one record batch's bytes for the batch's width."""
    add_messages(conn, stream, 300, seed=13, size=lambda i: 2000)


def direct_get_off(conn, stream, api) -> None:
    """``readMode=auto`` now reads through consumers (the restart finds no Direct Get)."""
    allow_direct(api, stream.name, False)


@pytest.mark.parametrize(
    ("change", "extra"),
    [(bigger_messages, {"recordBatchBytes": "100000"}), (direct_get_off, {})],
    ids=["bigger-messages", "direct-get-off"],
)
def test_a_replay_is_cut_as_planned_whatever_the_stream_became(change, extra, nats_server, conn, api, make_stream):
    """The first attempt cut the batch one way; the stream changed before the replay in a way that would cut a new
    batch otherwise. The replay's Spark partitions read exactly the first attempt's rows, partition by partition."""
    stream = make_stream(1000, partitions=4)
    options = {"servers": nats_server.url, "stream": stream.name, "group": stream.group, **extra}
    with run(options) as first:
        start = offset_at(first, 400)
        end = first.latestOffset(start, None)
        first_plan = first.partitions(start, end)
        first_rows = rows(first, first_plan)
    assert end["seq"] == 1000

    change(conn, stream, api)
    with run(options) as again:
        assert again.coordinator.direct == (change is not direct_get_off)
        fresh = [InputPartition(p) for p in again.coordinator.plan(again._watermark(start), again._watermark(end))]
        assert shape(fresh) != shape(first_plan) or change is direct_get_off
        replay = again.partitions(start, spark_json(end))
        assert shape(replay) == shape(first_plan)
        modes = {r.read_mode for part in replay for r in getattr(part.value, "ranges", (part.value,))}
        assert modes == {DIRECT if again.coordinator.direct else PULL}
        assert rows(again, replay) == first_rows
    assert sorted(s for part in first_rows for s in part) == list(range(401, 1001))


@pytest.fixture
def elastic(api) -> Iterator[Callable[[str], str]]:
    """An elastic group ``eg`` of members a, b over 4 partitions of a stream of 2,000 messages."""
    made: list[str] = []

    def make(name: str) -> str:
        api.create_stream({"name": name, "subjects": [f"{name.lower()}.*"]})
        made.append(name)
        publish_all(api.conn, ((f"{name.lower()}.c{i % 37}", b"%d" % i, None) for i in range(2000)))
        filters = (PartitioningFilter(f"{name.lower()}.*", (1,)),)
        create_group(api, name, "eg", GroupConfig("elastic", 4, members=("a", "b"), partitioning_filters=filters))
        work = work_stream_name(name, "eg")
        wait_for(lambda: api.stream_info(work)["state"]["last_seq"] == 2000, 30, "the work stream to source the stream")
        return work

    yield make
    for name in made:
        delete_group(api, name, "eg")
        api.delete_stream(name)


@pytest.mark.parametrize("read_mode", ["pull", "auto"])
def test_a_batch_planned_before_a_member_joined_is_replayed_with_its_old_layout(read_mode, nats_server, api, elastic):
    """``group add c`` between the attempt and its replay: ``a 0,1; b 2,3`` became ``a 0,3; b 1; c 2``. Pulled, the
    replay reads members a and b as they were (their consumers remade so for the batch); with Direct Get, the same
    partition filters in the same order. The next batch takes the new layout."""
    name = f"Join{read_mode.capitalize()}"
    work = elastic(name)
    options = {"servers": nats_server.url, "stream": name, "group": "eg", "readMode": read_mode}
    options["maxMessagesPerTrigger"] = "1500"
    with run(options) as first:
        start = offset_at(first, 0)
        end = first.latestOffset(start, None)
        first_plan = first.partitions(start, end)
        first_rows = rows(first, first_plan)
    f = name.lower()
    assert end["cut"]["members"] == [["a", [0, 1], [f"0.{f}.*", f"1.{f}.*"]], ["b", [2, 3], [f"2.{f}.*", f"3.{f}.*"]]]

    change_members(api, name, "eg", add=("c",))
    with run(options) as again:
        replay = again.partitions(start, spark_json(end))
        assert shape(replay) == shape(first_plan)
        assert rows(again, replay) == first_rows
        if read_mode == "pull":
            consumers = [api.consumer_info(work, m)["config"]["filter_subjects"] for m in ("a", "b")]
            assert consumers == [[f"0.{f}.*", f"1.{f}.*"], [f"2.{f}.*", f"3.{f}.*"]]
        again.commit(spark_json(end))
        following = again.latestOffset(spark_json(end), None)
        assert [m[:2] for m in following["cut"]["members"]] == [["a", [0, 3]], ["b", [1]], ["c", [2]]]
        rest = rows(again, again.partitions(spark_json(end), following))
    assert sorted(s for part in first_rows + rest for s in part) == list(range(1, 2001))


def test_a_batch_planned_to_pull_is_refused_by_a_run_that_reads_with_direct_get(nats_server, api, make_stream):
    """Pulled batches are a task per member; a run that finds Direct Get (enabled meanwhile) cuts by filter: it refuses
    the replay, saying what to set, instead of cutting it another way."""
    stream = make_stream(1000, partitions=4, direct=False)
    options = {"servers": nats_server.url, "stream": stream.name, "group": stream.group, "members": "2"}
    with run(options) as first:
        start = offset_at(first, 0)
        end = first.latestOffset(start, None)
        assert end["cut"]["pull"] is True
    allow_direct(api, stream.name, True)
    with run(options) as again, pytest.raises(OptionError) as refused:
        again.partitions(start, spark_json(end))
    assert str(refused.value) == (
        f"The batch (0, 1000] of stream {stream.name!r}, planned before the query stopped, was cut into a task per "
        "member of its group, pulled from the member consumers, but this run reads with Direct Get (the group, "
        "readMode, minPartitions or preservePartitionOrder changed, or readMode=auto now finds Direct Get): its replay "
        "must be cut as planned. Restart with the group it had, readMode=pull, no minPartitions and "
        "preservePartitionOrder=true until that batch is committed."
    )
    with run({**options, "readMode": "pull"}) as pulled:
        assert [p.value.consumer for p in pulled.partitions(start, spark_json(end))] == [
            f"{stream.group}-0",
            f"{stream.group}-1",
        ]


@pytest.mark.parametrize("group", [True, False])
@pytest.mark.parametrize("fail", [True, False])
def test_messages_purged_between_planning_and_reading_are_data_loss_in_the_task(
    fail, group, nats_server, api, make_stream, caplog
):
    """The batch (300, 700] is planned; seqs 301..400 are purged before its tasks read it. The task says so:
    ``failOnDataLoss`` fails it, ``false`` reads the rest with a warning, never silently."""
    stream = make_stream(1000, partitions=2)
    options = {"servers": nats_server.url, "stream": stream.name, "failOnDataLoss": str(fail).lower()}
    options["maxMessagesPerTrigger"] = "400"
    if group:
        options["group"] = stream.group
    with run(options) as query:
        start = offset_at(query, 300)
        end = query.latestOffset(start, None)
        parts = query.partitions(start, end)
        api.purge_stream(stream.name, keep_from_seq=401)
        caplog.set_level(logging.WARNING, logger="spark_jetstream")
        if fail:
            with pytest.raises(DataLossError) as lost:
                rows(query, parts)
            assert str(lost.value) == (
                f"Messages seqs 301..400 of stream {stream.name!r} were removed (retention limits or a purge) after "
                "their micro-batch was planned, before its task read them: set failOnDataLoss=false to skip them, or "
                "raise the stream's limits."
            )
            return
        read = rows(query, parts)
    assert sorted(s for part in read for s in part) == list(range(401, 701))
    said = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
    assert said and all(
        message
        == f"Messages seqs 301..400 of stream {stream.name!r} were removed (retention limits or a purge) after their "
        "micro-batch was planned, before its task read them: skipping them (failOnDataLoss=false)"
        for message in said
    )


def test_a_batch_planned_without_a_group_is_replayed_alike_with_one(nats_server, make_stream):
    """The offset is the same with and without a group: a checkpoint goes on with a group added, and its uncommitted
    batch is replayed as it was cut; the group's member consumers take their floors from there."""
    stream = make_stream(3000, partitions=4)
    options = {"servers": nats_server.url, "stream": stream.name}
    with run(options) as first:
        start = offset_at(first, 0)
        end = first.latestOffset(start, None)
        first_plan = first.partitions(start, end)
        first_rows = rows(first, first_plan)
    assert "members" not in end["cut"]
    with run({**options, "group": stream.group}) as again:
        replay = again.partitions(start, spark_json(end))
        assert shape(replay) == shape(first_plan)
        assert rows(again, replay) == first_rows
