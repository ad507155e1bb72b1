"""Least privilege: every read mode with exactly the rights ``tools.rights`` lists (what the security guide and
``spark-jetstream rights`` show), and nothing more. The Spark users reply to an inbox prefix of their own, so another
user's replies never reach them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats
import pytest

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer
from spark_jetstream.tools.rights import Rights, read_rights

pytestmark = pytest.mark.slow

STREAM, MESSAGES, INBOX = "ORDERS", 120, "_INBOX.spark"
MEMBERS = [f"g-{p}" for p in range(2)]
USERS = {  # user -> the read it does, and its rights
    "groupless": read_rights(STREAM, inbox_prefix=INBOX, subjects=["orders.*"]),
    "consumers": read_rights(STREAM, direct=False, inbox_prefix=INBOX),
    "group": read_rights(STREAM, group="g", consumers=MEMBERS, inbox_prefix=INBOX),
    "pulled": read_rights(STREAM, group="g", consumers=MEMBERS, direct=False, inbox_prefix=INBOX),
    "batch": read_rights(STREAM, group="g", streaming=False, inbox_prefix=INBOX),
    "reader": read_rights(STREAM, group="made", consumers=["made-0", "made-1"], create=False, inbox_prefix=INBOX),
    # the security guide's writer with progressSubject: its subjects, its markers, and reading them; no purge
    "writer": Rights(
        publish=(
            "out.>",
            "out_progress.>",
            "$JS.API.STREAM.MSG.GET.OUT",
            "$JS.API.STREAM.NAMES",
            "$JS.API.STREAM.INFO.OUT",
        ),
        subscribe=(f"{INBOX}.>",),
    ),
}


@pytest.fixture(scope="module")
def server() -> Any:
    users = [{"user": "admin", "password": "admin-pw"}]
    users += [{"user": name, "password": f"{name}-pw", "permissions": r.permissions()} for name, r in USERS.items()]
    with EmbeddedServer({"authorization": {"users": users}}, name="rights") as server:
        admin = ConnectionOptions(servers=(server.url,), user="admin", password="admin-pw")
        api = JetStreamApi(connect(admin))
        api.create_stream({**partitioned_stream_config(STREAM, "orders.*", 2), "allow_direct": True})
        assert publish_all(api.conn, ((f"orders.k{i}", f"o{i}".encode(), None) for i in range(MESSAGES))).count == 120
        api.create_stream({"name": "OUT", "subjects": ["out.>", "out_progress.>"], "allow_atomic": True})
        yield server, api
        disconnect(admin)


def options(server: EmbeddedServer, user: str, **extra: str) -> dict[str, str]:
    return {
        "servers": server.url,
        "user": user,
        "password": f"{user}-pw",
        "stream": STREAM,
        "inboxPrefix": INBOX,
        **extra,
    }


def streamed(spark: Any, server: EmbeddedServer, user: str, checkpoint: Path, **extra: str) -> list[str]:
    frame = spark.readStream.format("jetstream").options(**options(server, user, **extra)).load()
    out = checkpoint.parent / f"{checkpoint.name}-out"
    query = (
        frame.selectExpr("cast(data as string) as data")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return sorted(row.data for row in spark.read.parquet(str(out)).collect())


EVERY = sorted(f"o{i}" for i in range(MESSAGES))


@pytest.mark.parametrize(
    ("user", "extra"),
    [
        ("groupless", {}),
        ("consumers", {"readMode": "pull"}),
        ("group", {"group": "g"}),
        ("pulled", {"group": "g", "readMode": "pull"}),
    ],
)
def test_a_streaming_read_with_exactly_the_listed_rights(spark, server, tmp_path, user, extra):
    nats_server, api = server
    assert streamed(spark, nats_server, user, tmp_path / "cp", **extra) == EVERY
    if "group" in extra:
        assert {api.consumer_info(STREAM, m)["ack_floor"]["stream_seq"] for m in MEMBERS} == {MESSAGES}
        for member in MEMBERS:  # the next mode's query makes them again
            api.delete_consumer(STREAM, member)
    if user == "consumers":  # it may not delete its consumers: the server removes them after their last pull
        assert api.consumer_names(STREAM) != []


def test_a_group_is_read_by_a_user_who_may_not_create_or_change_consumers_once_they_were_made(spark, server, tmp_path):
    """An admin's run makes the member consumers (its owner metadata on them); a user without CONSUMER.CREATE then
    reads the group through them as they are, and moves their floors."""
    nats_server, api = server
    assert streamed(spark, nats_server, "admin", tmp_path / "admin", group="made") == EVERY
    for member in ("made-0", "made-1"):  # back to the start: the reader reads the group from its position
        api.conn.run(api.reset(STREAM, member, 1))
    made = {m: api.consumer_info(STREAM, m)["config"] for m in ("made-0", "made-1")}
    assert streamed(spark, nats_server, "reader", tmp_path / "reader", group="made") == EVERY
    for member, config in made.items():
        info = api.consumer_info(STREAM, member)
        assert info["ack_floor"]["stream_seq"] == MESSAGES
        assert info["config"]["metadata"] == config["metadata"]  # nothing of theirs was rewritten


def test_a_batch_read_of_a_group_with_exactly_the_listed_rights(spark, server):
    nats_server, _ = server
    frame = spark.read.format("jetstream").options(**options(nats_server, "batch", group="g")).load()
    assert sorted(row.data.decode() for row in frame.select("data").collect()) == EVERY


def test_a_reader_with_the_listed_rights_receives_no_other_users_replies(server):
    """With its own inbox prefix a reader needs ``subscribe`` on that prefix only: a subscription to every client's
    inbox (``_INBOX.>``, which the default prefix needs, and which receives other users' Direct Get replies) is
    refused, and nothing reaches it."""
    nats_server, _ = server

    async def eavesdrop() -> tuple[list[str], list[str]]:
        heard: list[str] = []
        errors: list[str] = []

        async def on_reply(msg: Any) -> None:
            heard.append(msg.subject)

        async def on_error(error: Exception) -> None:
            errors.append(str(error))

        reader = await nats.connect(
            nats_server.url, user="group", password="group-pw", inbox_prefix=INBOX, error_cb=on_error
        )
        admin = await nats.connect(nats_server.url, user="admin", password="admin-pw")
        await reader.subscribe("_INBOX.>", cb=on_reply)
        await reader.flush()
        await admin.request(f"$JS.API.DIRECT.GET.{STREAM}", b'{"seq": 1}', timeout=5)
        await asyncio.sleep(0.3)
        await reader.close()
        await admin.close()
        return heard, errors

    heard, errors = asyncio.run(eavesdrop())
    assert heard == []
    assert any('permissions violation for subscription to "_inbox.>"' in error.lower() for error in errors), errors


def test_a_batch_write_with_progress_markers_with_exactly_the_listed_rights(spark, server):
    """The writer stores every row once; without the right to purge, its progress markers stay (a WARNING says so,
    and ``commits forget`` removes them), where a writer with it leaves none (``test_atomic_writes``)."""
    nats_server, api = server
    rows = spark.range(0, 300, 1, 3).selectExpr("'out.x' AS subject", "CAST(id AS STRING) AS data")
    writer = rows.write.format("jetstream").options(servers=nats_server.url, user="writer", password="writer-pw")
    writer.options(inboxPrefix=INBOX, progressSubject="out_progress").mode("append").save()
    stored = api.stream_info("OUT")["state"]
    assert api.subjects("OUT", "out.>") == ["out.x"]
    assert stored["messages"] == 300 + 3  # every row once, and a marker per task
    assert len(api.subjects("OUT", "out_progress.>")) == 3
