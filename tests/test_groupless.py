"""Streaming without a group, as a data team reads a stream it does not own: the checkpoint alone holds the
position, nothing on the server is created or changed, and a read-only user with exactly the subjects
``spark-jetstream rights`` lists is enough. Also the ``subjects`` filter, and every refusal of such a read where the
user sees it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import checkpoint_log, error_text, start_and_expect, stored

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.read.mode import PULL
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.coordinator import Coordinator
from spark_jetstream.streaming.offsets import Watermark
from spark_jetstream.testing import EmbeddedServer
from spark_jetstream.tools.rights import read_rights

pytestmark = pytest.mark.slow

READ_ONLY = {
    # what ``spark-jetstream rights`` prints (and the Security guide shows) for a read without a group
    "direct": list(read_rights("{s}").publish),
    "pull": [*read_rights("{s}", direct=False).publish, "$JS.API.CONSUMER.DELETE.{s}.*"],
}
"""Subjects a read-only user may publish to, by read mode (``{s}``: the stream); it subscribes to ``_INBOX.>``. The
user that reads through consumers may delete them too (``nodelete`` may not)."""


def _user(name: str, publish: list[str]) -> dict:
    return {
        "user": name,
        "password": f"{name}-pw",
        "permissions": {"publish": {"allow": publish}, "subscribe": {"allow": ["_INBOX.>"]}},
    }


@pytest.fixture(scope="module")
def team_server() -> Iterator[EmbeddedServer]:
    """The platform team's server: ``admin`` owns ``EVENTS`` (4 partitions, Direct Get) and ``LOGS`` (a client's
    defaults: no transform, no Direct Get); the data team's users may only read, by those lists, and ``blind``
    lacks ``STREAM.MSG.GET``."""
    users = [
        {"user": "admin", "password": "admin-pw"},
        _user("direct", [p.format(s="EVENTS") for p in READ_ONLY["direct"]]),
        _user("pull", [p.format(s="LOGS") for p in READ_ONLY["pull"]]),
        _user("blind", ["$JS.API.INFO", "$JS.API.STREAM.INFO.EVENTS", "$JS.API.DIRECT.GET.EVENTS"]),
        _user("nodelete", [p.format(s="LOGS") for p in READ_ONLY["pull"] if "DELETE" not in p]),
    ]
    with EmbeddedServer({"authorization": {"users": users}}, name="team") as server:
        admin = _admin(server)
        admin.create_stream(partitioned_stream_config("EVENTS", "events.*.*", 4))
        admin.create_stream({"name": "LOGS", "subjects": ["logs.>"]})
        yield server
        for user in ("admin", "direct", "pull", "blind", "nodelete"):
            disconnect(_options(server, user))


def _options(server: EmbeddedServer, user: str) -> ConnectionOptions:
    return ConnectionOptions(servers=(server.url,), user=user, password=f"{user}-pw")


def _admin(server: EmbeddedServer) -> JetStreamApi:
    return JetStreamApi(connect(_options(server, "admin")))


def _publish(server: EmbeddedServer, stream: str, count: int, tag: str) -> list[tuple[int, str, bytes]]:
    """``count`` messages on ``<stream>.<kind>.k<n>`` (kinds orders, refunds, payments); (seq, subject, data) each."""
    prefix = stream.lower()
    messages = [
        (f"{prefix}.{('orders', 'refunds', 'payments')[i % 3]}.k{i % 13}", f"{tag}-{i}".encode()) for i in range(count)
    ]
    result = publish_all(_admin(server).conn, ((s, d, None) for s, d in messages))
    return [(result.first_seq + i, s, d) for i, (s, d) in enumerate(messages)]


def _read(spark, server: EmbeddedServer, user: str, stream: str, **options: object):
    reader = spark.readStream.format("jetstream").options(servers=server.url, user=user, password=f"{user}-pw")
    return reader.option("stream", stream).options(**{k: str(v) for k, v in options.items()}).load()


def _available_now(df, folder: Path) -> None:
    writer = df.writeStream.format("parquet").option("path", str(folder / "out"))
    query = writer.option("checkpointLocation", str(folder / "cp")).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()


def _rows(df) -> list[tuple[int, str, bytes]]:
    return sorted((row.seq, row.subject, bytes(row.data)) for row in df.select("seq", "subject", "data").collect())


@pytest.mark.parametrize(("user", "stream"), [("direct", "EVENTS"), ("pull", "LOGS")])
def test_a_read_only_user_streams_a_stream_it_does_not_own(spark, team_server, tmp_path, user, stream):
    """With exactly the listed rights: every message once across a restart, in batches within the cap, and the
    server holds nothing of the query's afterwards (no consumer, no KV bucket, no stream)."""
    admin = _admin(team_server)
    before = admin.account_info()
    published = [(seq, subject, data) for seq, subject, data, _ in stored(admin, stream)]  # other tests' messages
    published = [
        (seq, subject.partition(".")[2] if stream == "EVENTS" else subject, data) for seq, subject, data in published
    ]
    published += _publish(team_server, stream, 2500, f"{user}-first")
    _available_now(_read(spark, team_server, user, stream, maxMessagesPerTrigger=600), tmp_path)
    published += _publish(team_server, stream, 700, f"{user}-second")
    _available_now(_read(spark, team_server, user, stream, maxMessagesPerTrigger=600), tmp_path)  # the restart
    assert _rows(spark.read.parquet(str(tmp_path / "out"))) == published
    offsets = checkpoint_log(tmp_path / "cp", "offsets")
    assert offsets[max(offsets)] == published[-1][0]
    assert len(offsets) >= 6 and max(_widths(offsets)) <= 600
    after = admin.account_info()
    assert (after["streams"], after["consumers"]) == (before["streams"], before["consumers"]) == (2, 0)
    assert sorted(admin.stream_names()) == ["EVENTS", "LOGS"]


def _widths(offsets: dict[int, int]) -> list[int]:
    seqs = [0, *(offsets[batch] for batch in sorted(offsets))]
    return [high - low for low, high in pairwise(seqs)]


def test_the_security_guide_shows_what_rights_prints():
    guide = (Path(__file__).parent.parent / "docs" / "guides" / "security.md").read_text()
    section = guide.split("## Least privilege", 1)[1]
    command = re.search(r"spark-jetstream rights (--stream .*?)  +#", section).group(1)
    assert command == "--stream ORDERS --inbox-prefix _INBOX.spark --subjects 'orders.>'"
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    assert shown.strip() == read_rights("ORDERS", inbox_prefix="_INBOX.spark", subjects=["orders.>"]).conf()


def test_a_group_added_to_a_checkpoint_goes_on_from_it(spark, team_server, tmp_path):
    """The offset is the same with and without a group: a query that adds one on the checkpoint makes the member
    consumers, moves their floors to the checkpoint and reads on exactly."""
    admin = _admin(team_server)
    published = _publish(team_server, "EVENTS", 900, "add-group")
    first = published[0][0]
    _available_now(_read(spark, team_server, "admin", "EVENTS", startingPosition=first), tmp_path)
    published += _publish(team_server, "EVENTS", 300, "add-group-later")
    try:
        _available_now(_read(spark, team_server, "admin", "EVENTS", group="added"), tmp_path)
        assert _rows(spark.read.parquet(str(tmp_path / "out"))) == published
        floors = {admin.consumer_info("EVENTS", f"added-{p}")["ack_floor"]["stream_seq"] for p in range(4)}
        assert floors == {published[-1][0]}
    finally:
        for p in range(4):
            admin.delete_consumer("EVENTS", f"added-{p}")


def test_two_queries_on_one_stream_are_independent(spark, team_server, tmp_path):
    """As two Kafka queries on one topic: each reads everything, neither holds anything the other needs."""
    published = _publish(team_server, "EVENTS", 1500, "two")
    first = published[0][0]
    folders = [tmp_path / "a", tmp_path / "b"]
    queries = [
        _read(spark, team_server, "direct", "EVENTS", startingPosition=first, maxMessagesPerTrigger=300)
        .writeStream.format("parquet")
        .option("path", str(folder / "out"))
        .option("checkpointLocation", str(folder / "cp"))
        .trigger(availableNow=True)
        .start()
        for folder in folders
    ]
    for query in queries:
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
    for folder in folders:
        assert _rows(spark.read.parquet(str(folder / "out"))) == published


def test_a_missing_permission_is_named_within_seconds(spark, team_server, tmp_path):
    """The server does not answer a refused request; it reports the violation on the connection, and the read fails
    with the subject and the fix instead of waiting out the API deadline."""
    start_and_expect(
        _read(spark, team_server, "blind", "EVENTS"),
        tmp_path,
        "The NATS user may not publish to $JS.API.STREAM.MSG.GET.EVENTS (asking about stream 'EVENTS'): the server "
        "refused it (a permissions violation). Allow it in the user's permissions: `spark-jetstream rights` prints "
        "what a read needs, and the Security guide lists what each kind of read and write needs.",
    )


# -- subjects ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["EVENTS", "LOGS"])
@pytest.mark.parametrize(
    ("subjects", "matches"),
    [
        ("{p}.orders.*", lambda kind, key: kind == "orders"),
        ("{p}.*.k3,{p}.*.k5", lambda kind, key: key in ("k3", "k5")),
        ("{p}.refunds.*,{p}.payments.>", lambda kind, key: kind in ("refunds", "payments")),
    ],
    ids=["one", "wildcards", "several"],
)
def test_subjects_filters_read_exactly_the_matching_messages(spark, team_server, tmp_path, stream, subjects, matches):
    """Streaming and batch, partitioned (``EVENTS``, whose rows show the subject without its partition token) and
    not; the server filters (Direct Get ``next_by_subj``, or the ephemeral consumers' filters)."""
    user = "direct" if stream == "EVENTS" else "pull"
    published = _publish(team_server, stream, 1200, f"subjects-{tmp_path.name}")
    filters = subjects.format(p=stream.lower())
    wanted = [m for m in published if matches(*m[1].split(".")[1:])]
    first, last = published[0][0], published[-1][0]
    df = _read(spark, team_server, user, stream, subjects=filters, startingPosition=first, maxMessagesPerTrigger=500)
    _available_now(df, tmp_path)
    assert _rows(spark.read.parquet(str(tmp_path / "out"))) == wanted
    batch = spark.read.format("jetstream").options(servers=team_server.url, user=user, password=f"{user}-pw")
    batch = batch.options(stream=stream, subjects=filters, startingPosition=str(first), endingPosition=str(last))
    assert _rows(batch.load()) == wanted


def test_a_read_without_a_group_plans_a_range_per_partition_and_filter(team_server):
    """A partitioned stream keeps a Spark partition per stream partition (each partition's order); a stream without
    Direct Get is read through a consumer per range, cut by ``minPartitions`` as Direct Get reads are."""
    _publish(team_server, "EVENTS", 5000, "plan")
    _publish(team_server, "LOGS", 5000, "plan")
    url = team_server.url

    def plan(user: str, stream: str, width: int = 4500, **options: str) -> list:
        config = SourceConfig.parse(
            {"servers": url, "user": user, "password": f"{user}-pw", "stream": stream, **options}
        )
        coordinator = Coordinator(config)
        try:
            end = coordinator.state(fresh=True).last_seq
            return coordinator.plan(Watermark(stream, end - width), Watermark(stream, end))
        finally:
            coordinator.close()

    assert sorted(r.filter for r in plan("direct", "EVENTS")) == ["0.>", "1.>", "2.>", "3.>"]
    filtered = plan("direct", "EVENTS", subjects="events.orders.*")
    assert sorted(r.filter for r in filtered) == [f"{p}.events.orders.*" for p in range(4)]
    (whole,) = plan("pull", "LOGS")
    assert isinstance(whole, SeqRange) and (whole.filter, whole.read_mode) == (">", PULL)
    cut = plan("pull", "LOGS", minPartitions="3")
    assert [(r.read_mode, r.end - r.start) for r in cut] == [(PULL, 1500)] * 3


# -- refusals ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"ackWait": "10s"},
            "Option 'ackWait' applies to the member consumers of a group, and this read has none: set the group "
            "option, or remove ackWait.",
        ),
        (
            {"startingPosition": "group"},
            "startingPosition=group needs the group option: whose ack floor would it start at?",
        ),
        (
            {"group": "g", "subjects": "events.>"},
            "Option 'subjects' applies to reads without a group: group 'g' reads what its member consumers' filters "
            "select. Remove subjects, or the group option.",
        ),
        (
            {"subjects": "events.>,events.orders.*"},
            "Option 'subjects' has an invalid value 'events.>,events.orders.*': filters 'events.>' and "
            "'events.orders.*' both match some subjects",
        ),
        (
            {"subjects": "events..x"},
            "Option 'subjects' has an invalid value 'events..x': 'events..x' has an empty token",
        ),
    ],
    ids=["group-option", "group-position", "subjects-with-group", "overlap", "malformed"],
)
def test_refusals_at_load(spark, team_server, options, message):
    with pytest.raises(Exception) as caught:
        _read(spark, team_server, "direct", "EVENTS", **options)
    assert message in error_text(caught.value)


@pytest.mark.parametrize(
    ("user", "stream", "options", "message"),
    [
        (
            "direct",
            "EVENTS",
            {"endingPosition": "10"},
            "Option 'endingPosition' applies to spark.read only: a streaming query has no end.",
        ),
        (
            "direct",
            "EVENTS",
            {"subjects": "payments.>"},
            "Option 'subjects': filter 'payments.>' matches none of the subjects of stream 'EVENTS' (events.*.*, as "
            "the subject column shows them), so it would read nothing",
        ),
        ("admin", "NOPE", {}, "Stream 'NOPE' does not exist"),
    ],
    ids=["batch-only-option", "subjects-outside-the-stream", "missing-stream"],
)
def test_refusals_at_start(spark, team_server, tmp_path, user, stream, options, message):
    """What ``load()`` cannot tell from a batch read's options is refused at the query's start, with the connector's
    own message (PySpark would mask an error raised while it makes the reader)."""
    start_and_expect(_read(spark, team_server, user, stream, **options), tmp_path, message)


def test_a_workqueue_stream_without_direct_get_is_refused_with_the_fix(spark, team_server, tmp_path):
    admin = _admin(team_server)
    admin.create_stream({"name": "JOBS", "subjects": ["jobs.>"], "retention": "workqueue"})
    try:
        df = spark.readStream.format("jetstream").options(servers=team_server.url, user="admin", password="admin-pw")
        start_and_expect(
            df.option("stream", "JOBS").load(),
            tmp_path,
            "Stream 'JOBS' is a WorkQueue stream, which serves each subject to one consumer only, so a read through "
            "consumers of its own cannot read it: enable Direct Get",
        )
    finally:
        admin.delete_stream("JOBS")


def test_a_user_who_may_not_delete_consumers_reads_through_them(spark, team_server):
    """``CONSUMER.DELETE`` withheld: a batch read through consumers of its own reads everything (the server removes
    each consumer after its inactive threshold); the refused delete failed the task that had read its range."""
    admin = _admin(team_server)
    _publish(team_server, "LOGS", 300, "nodelete")
    expected = [seq for seq, _, _, _ in stored(admin, "LOGS")]
    df = spark.read.format("jetstream").options(servers=team_server.url, user="nodelete", password="nodelete-pw")
    assert sorted(row.seq for row in df.option("stream", "LOGS").load().select("seq").collect()) == expected
