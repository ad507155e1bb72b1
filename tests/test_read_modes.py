"""Which path reads (option ``readMode``) and how a batch is cut (``minPartitions``), against real servers: a user
whom the server denies Direct Get reads through consumers, an explicit ``direct`` that cannot work is refused with
the fix, and a stream without a partition transform is read by as many tasks as asked, cut alike on a replay."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import ack_floors, checkpoint_log, error_text, finish_job, reader, run_then_kill, start_and_expect

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow

SPLITS_JOB = Path(__file__).parent / "jobs" / "record_splits.py"

BATCH_PULL_PERMISSIONS = {
    # The README's recipe (Security) for a user who reads stream ORDERS with batch reads through consumers:
    # no Direct Get, nothing but the read's own consumers.
    "publish": {
        "allow": [
            "$JS.API.INFO",
            "$JS.API.STREAM.INFO.ORDERS",
            "$JS.API.STREAM.MSG.GET.ORDERS",
            "$JS.API.CONSUMER.CREATE.ORDERS.*",
            "$JS.API.CONSUMER.MSG.NEXT.ORDERS.*",
            "$JS.API.CONSUMER.DELETE.ORDERS.*",
        ]
    },
    "subscribe": {"allow": ["_INBOX.>"]},
}


@pytest.fixture(scope="module")
def permissions_server() -> Iterator[EmbeddedServer]:
    """A server with an admin, a user who may do anything but Direct Get, and a user with the batch-pull recipe."""
    users = {
        "users": [
            {"user": "admin", "password": "admin-pw"},
            {
                "user": "nodirect",
                "password": "nodirect-pw",
                "permissions": {"publish": {"allow": [">"], "deny": ["$JS.API.DIRECT.GET.>"]}, "subscribe": ">"},
            },
            {"user": "reader", "password": "reader-pw", "permissions": BATCH_PULL_PERMISSIONS},
        ]
    }
    with EmbeddedServer({"authorization": users}, name="readmodes") as server:
        admin = ConnectionOptions(servers=(server.url,), user="admin", password="admin-pw")
        api = JetStreamApi(connect(admin))
        api.create_stream(partitioned_stream_config("ORDERS", "orders.*", 2))  # with allow_direct
        assert api.stream_info("ORDERS")["config"]["allow_direct"]
        publish_all(api.conn, ((f"orders.k{i % 50}", f"order-{i}".encode(), None) for i in range(3000)))
        yield server
        for user in ("admin", "nodirect", "reader"):
            disconnect(ConnectionOptions(servers=(server.url,), user=user, password=f"{user}-pw"))


def _admin(server: EmbeddedServer) -> JetStreamApi:
    return JetStreamApi(connect(ConnectionOptions(servers=(server.url,), user="admin", password="admin-pw")))


def _left_behind(server: EmbeddedServer) -> list[str]:
    """Consumers on ORDERS that are no streaming query's member consumers: what batch reads left."""
    return [name for name in _admin(server).consumer_names("ORDERS") if not name.startswith("denied-")]


def _batch(spark, server: EmbeddedServer, user: str, **options: str):
    reader_ = spark.read.format("jetstream").options(servers=server.url, user=user, password=f"{user}-pw")
    return reader_.options(stream="ORDERS", **options).load()


def _published() -> list[tuple[int, str, bytes]]:
    return [(i + 1, f"orders.k{i % 50}", f"order-{i}".encode()) for i in range(3000)]


def test_a_user_denied_direct_get_reads_through_consumers(spark, permissions_server, tmp_path):
    df = _batch(spark, permissions_server, "nodirect")
    assert sorted((r.seq, r.subject, bytes(r.data)) for r in df.collect()) == _published()
    assert _left_behind(permissions_server) == []

    with pytest.raises(Exception) as caught:
        _batch(spark, permissions_server, "nodirect", readMode="direct").count()
    assert (
        "readMode=direct, but the NATS user may not use Direct Get on stream 'ORDERS' (the server refused a publish "
        "to $JS.API.DIRECT.GET.ORDERS: a permissions violation): allow the user to publish to "
        "$JS.API.DIRECT.GET.ORDERS, or set readMode to auto or pull"
    ) in error_text(caught.value)

    # A streaming query of the same user pulls from its member consumers.
    query = (
        spark.readStream.format("jetstream")
        .options(servers=permissions_server.url, user="nodirect", password="nodirect-pw")
        .options(stream="ORDERS", group="denied", maxMessagesPerTrigger="1000")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    out = spark.read.parquet(str(tmp_path / "out"))
    assert sorted((r.seq, r.subject, bytes(r.data)) for r in out.collect()) == _published()
    admin = _admin(permissions_server)
    assert {admin.consumer_info("ORDERS", f"denied-{p}")["ack_floor"]["stream_seq"] for p in range(2)} == {3000}


def test_the_readmes_batch_pull_permissions_are_enough(spark, permissions_server):
    df = _batch(spark, permissions_server, "reader", startingPosition="1001", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted((r.seq, r.subject, bytes(r.data)) for r in df.collect()) == _published()[1000:]
    assert _left_behind(permissions_server) == []


def test_streaming_read_mode_direct_without_direct_get_is_refused_at_start(spark, nats_server, make_stream, tmp_path):
    stream = make_stream(100, partitions=2, direct=False)
    start_and_expect(
        reader(spark, nats_server.url, stream, readMode="direct"),
        tmp_path,
        f"readMode=direct, but stream {stream.name!r} does not allow Direct Get: enable it with `nats stream edit "
        f"{stream.name} --allow-direct`, or set readMode to auto or pull",
    )


def _splits(folder: Path) -> dict[int, list[dict[str, list[int]]]]:
    """Batch id -> each recorded split of it ({task: [first seq, last seq, rows]}), in the order they were written."""
    found: dict[int, list[tuple[float, dict[str, list[int]]]]] = {}
    for path in folder.glob("*-*.json"):
        found.setdefault(int(path.name.split("-")[0]), []).append((path.stat().st_mtime, json.loads(path.read_text())))
    return {batch: [split for _, split in sorted(records)] for batch, records in found.items()}


def _cut_alike_after_a_kill(spark, args: list[str], splits: Path, checkpoint: Path, width: int, tasks: int) -> None:
    """Run the ``record_splits`` job of ``args`` until it hangs in batch 1, SIGKILL it, finish it on its checkpoint:
    each of the 3 batches of ``width`` seqs was read by ``tasks`` contiguous slices holding every message of their
    seqs, and the replay of batch 1 was cut exactly as the batch the crash interrupted."""
    run_then_kill([*args, "--hang-on-batch", "1"], lambda: (splits / "hanging").exists(), 240)
    assert 1 in checkpoint_log(checkpoint, "offsets") and 1 not in checkpoint_log(checkpoint, "commits")
    finish_job(spark, args)
    recorded = _splits(splits)
    assert sorted(recorded) == [0, 1, 2] and len(recorded[1]) == 2
    assert recorded[1][0] == recorded[1][1]
    for batch, (split, *_) in recorded.items():
        slices = sorted(split.values())
        assert len(slices) == tasks, (batch, split)
        assert slices[0][0] == width * batch + 1 and slices[-1][1] == width * (batch + 1)
        assert all(low == previous[1] + 1 for previous, (low, *_) in pairwise(slices))
        assert all(count == high - low + 1 == width // tasks for low, high, count in slices)


BATCH = 800
"""Seqs in each micro-batch of the ``minPartitions`` test: 8 slices of 100."""


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "through-consumers"])
def test_min_partitions_cuts_every_micro_batch_and_a_replay_after_a_crash_alike(
    spark, nats_server, conn, api, tmp_path, direct
):
    """A stream without a partition transform (one member) read with ``minPartitions=8``: every batch of 800
    seqs is read by 8 tasks of contiguous slices, the output is exact, and the batch whose driver was SIGKILLed
    before its commit is cut exactly as before when the restarted query replays it. Without Direct Get the slices
    are read through consumers of the tasks' own: the member consumer delivers nothing (the pin's one message
    aside) and keeps the floor, and no consumer of a task is left."""
    api.create_stream({"name": "SplitReplay", "subjects": ["split.>"], "allow_direct": direct})
    try:
        publish_all(conn, ((f"split.{i % 9}", f"m{i}".encode(), None) for i in range(3 * BATCH)))
        splits, checkpoint = tmp_path / "splits", tmp_path / "cp"
        args = [sys.executable, str(SPLITS_JOB), "--servers", nats_server.url, "--stream", "SplitReplay",
                "--group", "split", "--out", str(tmp_path / "out"), "--checkpoint", str(checkpoint),
                "--splits", str(splits), "--min-partitions", "8", "--max-per-trigger", str(BATCH)]  # fmt: skip
        _cut_alike_after_a_kill(spark, args, splits, checkpoint, BATCH, 8)
        out = spark.read.parquet(str(tmp_path / "out"))
        rows = sorted((r.seq, r.subject, bytes(r.data)) for r in out.collect())
        assert rows == [(i + 1, f"split.{i % 9}", f"m{i}".encode()) for i in range(3 * BATCH)]
        member = api.consumer_info("SplitReplay", "split-0")
        assert member["ack_floor"]["stream_seq"] == 3 * BATCH
        assert member["delivered"]["consumer_seq"] <= 1  # reset to the floor after the pin's taking delivery
        assert api.consumer_names("SplitReplay") == ["split-0"]
    finally:
        api.delete_stream("SplitReplay")


WIDE = 4800
"""Seqs in each micro-batch of the ``preservePartitionOrder`` test: more than ``ONE_TASK_MESSAGES``, 4 slices."""


@pytest.mark.parametrize("read_mode", ["auto", "pull"])
def test_without_partition_order_each_micro_batch_is_read_as_seq_slices_of_the_whole_stream(
    spark, nats_server, api, make_stream, tmp_path, read_mode
):
    """``preservePartitionOrder=false`` on a 4-partition stream read through its group: every batch of 4,800 seqs
    (more than one task's 4,096) is read by 4 tasks (as many as members), each a contiguous slice of 1,200 seqs
    holding every message in it (all partitions', through one unfiltered read); the batch whose driver was SIGKILLed
    before its commit is cut alike when the restarted query replays it; the output is exact and every member
    consumer's ack floor is the checkpoint's end. With ``readMode=pull`` the slices are read through consumers of the
    tasks' own (decision 0041): the member consumers keep the pins and floors, deliver nothing, and none of the
    tasks' consumers is left."""
    stream = make_stream(3 * WIDE, partitions=4)
    splits, checkpoint = tmp_path / "splits", tmp_path / "cp"
    args = [sys.executable, str(SPLITS_JOB), "--servers", nats_server.url, "--stream", stream.name,
            "--group", stream.group, "--out", str(tmp_path / "out"), "--checkpoint", str(checkpoint),
            "--splits", str(splits), "--unordered", "--max-per-trigger", str(WIDE),
            "--read-mode", read_mode]  # fmt: skip
    _cut_alike_after_a_kill(spark, args, splits, checkpoint, WIDE, 4)  # each slice every message: unfiltered
    out = spark.read.parquet(str(tmp_path / "out"))
    rows = sorted((r.seq, r.subject, bytes(r.data)) for r in out.collect())
    assert rows == [(seq, subject, data) for seq, (subject, data, _, _) in sorted(stream.messages.items())]
    assert ack_floors(api, stream) == {stream.consumer(p): 3 * WIDE for p in range(4)}
    assert api.consumer_names(stream.name) == sorted(stream.consumer(p) for p in range(4))
    delivered = [api.consumer_info(stream.name, stream.consumer(p))["delivered"]["consumer_seq"] for p in range(4)]
    assert max(delivered) <= 1  # the members delivered nothing but the pin's taking delivery, reset to the floor


def test_without_partition_order_a_read_of_part_of_the_stream_is_refused_where_spark_shows_it(
    spark, nats_server, make_stream, tmp_path
):
    """The refusal reaches the user as the connector's sentence (not PySpark's clean-up error), within seconds."""
    stream = make_stream(100, partitions=2)
    df = (
        spark.readStream.format("jetstream")
        .option("servers", nats_server.url)
        .option("stream", stream.name)
        .option("subjects", f"ev{stream.group[1:]}.k1")
        .option("preservePartitionOrder", "false")
        .load()
    )
    start_and_expect(
        df,
        tmp_path,
        f"Option 'preservePartitionOrder' is false, which reads each micro-batch as seq ranges of all of stream "
        f"{stream.name!r} through one unfiltered read, but this read covers only part of it",
    )
