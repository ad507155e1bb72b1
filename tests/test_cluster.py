"""The pinned pull reader on a 3-node JetStream cluster with R3 streams and consumers."""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import time

import pyarrow as pa
import pytest
from helpers import query_not_failed, slow_parquet_query, wait_for
from pyspark.sql.types import StringType, StructField, StructType

from spark_jetstream.client import retry
from spark_jetstream.client.connection import DIRECT_ATTEMPT, ConnectionOptions, connect, disconnect
from spark_jetstream.client.publish import MSG_ID_HEADER, Publisher, PublishError, command, header_block, publish_all
from spark_jetstream.errors import ClusterUnavailableError, ConnectError
from spark_jetstream.groups.layout import member_consumer_config, partition_filters, partitioned_stream_config
from spark_jetstream.read.direct import read_range
from spark_jetstream.read.ranges import MemberRange, SeqRange
from spark_jetstream.sink import markers
from spark_jetstream.sink.writer import stream_writer
from spark_jetstream.streaming.pull import PullSettings, read_member
from spark_jetstream.testing import move_leader

pytestmark = pytest.mark.slow

SETTINGS = PullSettings(batch=100, in_flight=3, expires=2.0, idle_heartbeat=0.5, record_batch_size=200)


def _seqs(batches: list[pa.RecordBatch]) -> list[int]:
    return [seq for batch in batches for seq in batch.column("seq").to_pylist()]


def test_r3_stream_members_read_exactly(cluster_api):
    api, conn = cluster_api, cluster_api.conn
    api.create_stream(partitioned_stream_config("R3", "r3.*", 2, num_replicas=3))
    rng = random.Random(3)
    published = publish_all(conn, ((f"r3.k{rng.randrange(500)}", b"x" * 50, None) for _ in range(4000)))
    assert published.count == 4000
    for p in range(2):
        api.create_consumer("R3", member_consumer_config("g", str(p), partition_filters([p])))
    everything = []
    for p in range(2):
        batches = list(read_member(conn, MemberRange("R3", f"g-{p}", 0, published.last_seq), SETTINGS))
        seqs = _seqs(batches)
        assert seqs == sorted(set(seqs))
        assert all(b.column("partition").to_pylist() == [p] * b.num_rows for b in batches)
        everything += seqs
    assert sorted(everything) == list(range(published.first_seq, published.last_seq + 1))


def test_consumer_leader_change_mid_read_loses_and_doubles_nothing(cluster_api):
    api, conn = cluster_api, cluster_api.conn
    api.create_stream(partitioned_stream_config("LC", "lc.*", 1, num_replicas=3))
    published = publish_all(conn, ((f"lc.k{i % 97}", b"y" * 50, None) for i in range(6000)))
    api.create_consumer("LC", member_consumer_config("g", "0", partition_filters([0])))
    reader = read_member(conn, MemberRange("LC", "g-0", 0, published.last_seq), SETTINGS)
    seqs = _seqs([next(reader)])
    api.call(("CONSUMER", "LEADER", "STEPDOWN", "LC", "g-0"), None, "stepdown")
    seqs += _seqs(list(reader))
    assert seqs == list(range(published.first_seq, published.last_seq + 1))


def leader_and_follower(cluster, api, stream: str):
    """The servers of ``stream``'s leader (once it has one) and of one of its followers."""
    leader = wait_for(lambda: api.stream_info(stream)["cluster"].get("leader"), 30, "the stream's leader")
    return (
        next(server for server in cluster.servers if server.name == leader),
        next(server for server in cluster.servers if server.name != leader),
    )


@pytest.mark.parametrize("fault", ["frozen", "killed"])
def test_publishes_a_lost_stream_leader_did_not_store_are_sent_again_and_stored_once(nats_cluster, cluster_api, fault):
    """The stream's leader freezes (SIGSTOP: no connection closes) or dies (SIGKILL) mid-write while the writer's own
    server is well: what was routed to the frozen leader gets no PubAck, and while the stream elects a new leader
    after a kill no stream takes a message (503, no responders: a query failed so, four task attempts within 2 s).
    Sent again with its msg ids, the new leader stores it, each message once, before the server is back (decision
    0026)."""
    api = cluster_api
    api.create_stream({"name": "FW", "subjects": ["fw.>"], "num_replicas": 3, "storage": "file", "allow_direct": True})
    frozen, follower = leader_and_follower(nats_cluster, api, "FW")
    options = ConnectionOptions(servers=(follower.url,))
    conn = connect(options)
    count, before = 600, 200
    publisher = conn.run(Publisher(conn, window=count, timeout=60, resend=True).open())
    first = publisher.reserve(count, lambda i: f"fw.{i % 7}")
    commands = [
        command(f"fw.{i % 7}".encode(), publisher.reply_prefix + str(first + i).encode(), f"m{i}".encode(),
                header_block({MSG_ID_HEADER: f"fw-{i}"}))
        for i in range(count)
    ]  # fmt: skip

    async def write() -> float:
        await publisher.send(b"".join(commands[:before]), before)
        while publisher.outstanding:
            await asyncio.sleep(0.01)
        assert frozen.process is not None
        frozen.freeze() if fault == "frozen" else frozen.kill()
        await publisher.send(b"".join(commands[before:]), count - before)
        await publisher.finish()
        return time.monotonic()

    frozen_at = time.monotonic()
    try:
        done_at = conn.run(write(), timeout=90)
        assert frozen.process is None if fault == "killed" else frozen.process.poll() is None  # still down
    finally:
        if fault == "frozen":
            frozen.thaw()
        else:
            frozen.start()
        conn.run(publisher.close(), timeout=10)
        disconnect(options)
    assert publisher.resent >= count - before
    # Only the oldest message owed goes out again while nothing answers (every 2 s), the others once after.
    assert publisher.resent <= count - before + 6, publisher.resent
    assert (publisher.not_taken > 0) == (fault == "killed"), publisher.not_taken
    assert publisher.result.count == count  # each message's first PubAck counted, the repeats of those sent again not
    print(f"\n{count - before} stored {done_at - frozen_at:.1f} s after the leader froze; {publisher.resent} resent")
    # The thawed old leader answers STREAM.INFO with its state from before the freeze until it hears the new leader
    # (seen once in a suite run: 200 of 600): what the stream holds is what its leader says once that has settled.
    wait_for(
        lambda: api.stream_info("FW")["state"]["messages"] == count,
        30,
        lambda: f"the stream to hold the {count} messages once: {api.stream_info('FW')['state']}",
    )
    stored = [api.call(("STREAM", "MSG", "GET", "FW"), {"seq": seq}, "read")["message"] for seq in range(1, count + 1)]
    assert sorted(int(base64.b64decode(message["data"])[1:]) for message in stored) == list(range(count))
    api.delete_stream("FW")


def test_a_publish_no_stream_captures_fails_within_seconds_with_msg_ids_too(cluster_api):
    """A 503 is also what a subject no stream captures gets: the meta leader, asked once, says so, and the write fails
    at once instead of sending it again until ``publishTimeout``."""
    conn = cluster_api.conn
    publisher = conn.run(Publisher(conn, window=10, timeout=60, resend=True).open())
    first = publisher.reserve(1, lambda _: "nowhere.x")
    reply = publisher.reply_prefix + str(first).encode()
    message = command(b"nowhere.x", reply, b"m", header_block({MSG_ID_HEADER: "n"}))

    async def write() -> None:
        await publisher.send(message, 1)
        await publisher.finish()

    began = time.monotonic()
    try:
        with pytest.raises(PublishError, match="to 'nowhere.x' failed: 503: no stream captures this subject"):
            conn.run(write(), timeout=30)
    finally:
        conn.run(publisher.close(), timeout=10)
    assert time.monotonic() - began < 5


def test_a_commit_marker_is_recorded_through_its_bucket_leaders_election(nats_cluster, cluster_api):
    """The streaming writer's commit marker goes to a KV bucket (a publish through the retry layer): with the bucket's
    leader killed, no stream takes it until a new leader is elected (no responders, 4-9 s), so it is asked again, as
    the meta leader says a stream captures the subject; it once failed after 5 s (a chaos run, seed 3)."""
    conn = cluster_api.conn
    markers.ensure_bucket(conn, "sjm", 3)
    meta = nats_cluster.wait_for_meta_leader()
    names = [server.name for server in nats_cluster.servers]
    tokens = ("STREAM", "LEADER", "STEPDOWN", "KV_sjm")
    move_leader(cluster_api, tokens, lambda: cluster_api.stream_info("KV_sjm"), {meta}, names)  # JetStream stays up
    leader, follower = leader_and_follower(nats_cluster, cluster_api, "KV_sjm")
    assert leader.name != meta
    options = ConnectionOptions(servers=(follower.url,))
    try:
        leader.kill()
        began = time.monotonic()
        markers.write_marker(connect(options), "sjm", "q1", 7)
        took = time.monotonic() - began
    finally:
        leader.start()
        disconnect(options)
    assert markers.read_marker(conn, "sjm", "q1") == 7
    print(f"\nthe marker was recorded {took:.1f} s after the bucket's leader was killed")
    cluster_api.delete_stream("KV_sjm")


def test_a_publish_no_stream_captures_is_refused_at_once_naming_the_subject(cluster_api):
    conn = cluster_api.conn
    began = time.monotonic()
    with pytest.raises(ConnectError, match="No stream captures nowhere.y .*create one, or fix the subject"):
        conn.run(retry.request(conn, "nowhere.y", b"x"), timeout=30)
    assert time.monotonic() - began < 3


def test_the_commit_bucket_has_as_many_replicas_as_the_target_stream(nats_cluster, cluster_api):
    """A streaming writer's commit bucket is made with the target stream's replicas unless told otherwise: with one
    replica, one server's loss loses the markers of an R3 stream's writes."""
    cluster_api.create_stream({"name": "R3T", "subjects": ["r3t.>"], "num_replicas": 3})
    cluster_api.create_stream({"name": "R2T", "subjects": ["r2t.>"], "num_replicas": 2})
    schema = StructType([StructField("data", StringType())])
    url = nats_cluster.servers[0].url
    stream_writer({"servers": url, "subject": "r3t.a", "commitBucket": "c-subject"}, schema)
    stream_writer({"servers": url, "subject": "r3t.a", "expectedStream": "R2T", "commitBucket": "c-expected"}, schema)
    with_subjects = StructType([StructField("subject", StringType()), StructField("data", StringType())])
    stream_writer({"servers": url, "commitBucket": "c-unknown"}, with_subjects)  # each row names its subject
    stream_writer({"servers": url, "subject": "r3t.a", "commitBucket": "c-told", "commitBucketReplicas": "2"}, schema)
    replicas = {
        bucket: cluster_api.stream_info(f"KV_{bucket}")["config"]["num_replicas"]
        for bucket in ("c-subject", "c-expected", "c-unknown", "c-told")
    }
    assert replicas == {"c-subject": 3, "c-expected": 2, "c-unknown": 1, "c-told": 2}


def current_replicas(api, stream: str) -> int:
    """How many followers of ``stream`` its leader counts current (0 while it has none)."""
    try:
        return sum(bool(peer.get("current")) for peer in api.stream_info(stream)["cluster"].get("replicas", []))
    except ClusterUnavailableError:
        return 0


def test_direct_gets_a_frozen_replica_swallows_are_asked_again_within_a_fraction_of_an_attempt(
    nats_cluster, cluster_api, caplog
):
    """The replicas share Direct Gets at random (a queue group over the cluster), so a frozen stream leader
    swallows about a third of those sent through a healthy server while its routes stay up (measured: 30-40% for
    25 s, never answered). The reader asks again after ``Connection.direct_wait``, not a whole ``DIRECT_ATTEMPT``,
    and not later after a lost one (its own server is not busy: ``Connection.asked_too_soon``), and reads the range
    exactly."""
    api = cluster_api
    api.create_stream({"name": "FD", "subjects": ["fd.>"], "num_replicas": 3, "allow_direct": True})
    frozen, follower = leader_and_follower(nats_cluster, api, "FD")
    options = ConnectionOptions(servers=(follower.url,))
    conn = connect(options)
    try:
        publish_all(conn, ((f"fd.{i % 5}", b"%d" % i, None) for i in range(2000)))
        wait_for(
            lambda: current_replicas(api, "FD") == 2, 30, "the followers to catch up (they answer Direct Gets then)"
        )
        time.sleep(2.0)  # a caught-up follower subscribes to Direct Gets on its next check
        seq_range = SeqRange("FD", ">", 0, 2000, False, direct_batch=10)
        assert frozen.process is not None
        frozen.freeze()
        try:
            started = time.monotonic()
            with caplog.at_level(logging.INFO, logger="spark_jetstream.read.direct"):
                rows = [int(v) for batch in read_range(conn, seq_range) for v in batch.column("data").to_pylist()]
            took = time.monotonic() - started
            assert frozen.process.poll() is None  # still frozen
        finally:
            frozen.thaw()
    finally:
        disconnect(options)
    assert rows == list(range(2000))
    wait_for(lambda: current_replicas(api, "FD") == 2, 30, "the thawed server to catch up")
    api.delete_stream("FD")
    waits = [record.args[4] for record in caplog.records if "no reply within" in record.getMessage()]
    longer = [wait for wait in waits if wait > min(waits)]
    print(
        f"\n200 Direct Get batches, {len(waits)} lost to the frozen leader, {len(longer)} of them after a longer "
        f"wait, read in {took:.1f} s"
    )
    assert waits, "200 Direct Get batches and none lost to the frozen leader: the test shows nothing"
    assert min(waits) < DIRECT_ATTEMPT, f"every lost request waited a whole attempt: {waits}"
    # The server the reader is on answers pings at once, so a request lost after another was not waited for longer
    # (before: a quarter of them, up to 2 s); a ping late on a loaded machine may still lengthen a few.
    assert len(longer) <= len(waits) // 10, f"lost requests waited longer after a lost one: {sorted(waits)}"


def test_query_survives_the_stream_and_consumer_leaders_being_killed(spark, nats_cluster, cluster_api, tmp_path):
    import threading
    import time

    api, conn = cluster_api, cluster_api.conn
    api.create_stream(partitioned_stream_config("KL", "kl.*", 3, num_replicas=3))
    published = publish_all(conn, ((f"kl.k{i % 101}", f"kl-{i}".encode(), None) for i in range(6000)))

    checkpoint = tmp_path / "cp"
    query = slow_parquet_query(spark, nats_cluster.urls, "KL", "g", 800, 0.001, tmp_path)
    by_name = {server.name: server for server in nats_cluster.servers}
    killed: list[str] = []

    def kill_leaders() -> None:
        while not (checkpoint / "commits" / "1").exists():
            time.sleep(0.05)
        leader = api.stream_info("KL")["cluster"]["leader"]
        by_name[leader].kill()  # the stream leader, and every consumer it led
        killed.append(leader)
        time.sleep(3)
        by_name[leader].start()
        consumer_leader = api.consumer_info("KL", "g-0")["cluster"]["leader"]
        by_name[consumer_leader].kill()
        killed.append(consumer_leader)
        time.sleep(3)
        by_name[consumer_leader].start()

    target = f'"seq": {published.last_seq}'

    def finished() -> bool:
        if killer.is_alive() or not (progress := query.lastProgress):
            return False
        return target in (progress["sources"][0]["endOffset"] or "")

    killer = threading.Thread(target=kill_leaders, daemon=True)
    killer.start()
    try:
        wait_for(
            finished, 240, "the query to finish after the leaders were killed", poll=0.2, check=query_not_failed(query)
        )
    finally:
        query.stop()
        killer.join(30)
    assert len(killed) == 2
    seqs = sorted(r.seq for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect())
    assert seqs == list(range(published.first_seq, published.last_seq + 1))


def test_a_cluster_started_again_leaves_the_callers_connection_to_it_open():
    """``EmbeddedCluster.start`` checks the cluster with connections of its own: a whole cluster started again (as
    the restart tests do) leaves a caller's cached connection for the same servers open, and it reconnects."""
    from spark_jetstream.client.jsapi import JetStreamApi
    from spark_jetstream.testing import EmbeddedCluster

    cluster = EmbeddedCluster(3, name="again").start()
    options = ConnectionOptions(servers=tuple(server.url for server in cluster.servers))
    try:
        conn = connect(options)
        for server in cluster.servers:
            server.kill()
        cluster.start()
        assert not conn.client.is_closed, "starting the cluster closed the caller's connection"
        wait_for(lambda: conn.client.is_connected, 30, "the caller's connection did not reconnect")
        assert JetStreamApi(conn).call(("INFO",), None, "account info")["streams"] == 0
    finally:
        disconnect(options)
        cluster.close()
