"""A stream shared from another account, reached through an imported JetStream API (``apiPrefix``).

One real server, two accounts (``../shared/TESTING.md``): OWNER has JetStream and the stream, and exports its
JetStream API (streamed responses), its subjects and its acks; TEAM has no JetStream, imports them with the API
under ``JS.OWNER.API``, and connects with an nkey seed given as text (``nkeySecret``). Every read mode, a group
read and both writers run as TEAM, exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import error_text, stored, wait_for

from spark_jetstream.client.connection import connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import JetStreamError
from spark_jetstream.options import parse_connection_options
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow

PREFIX = "JS.OWNER.API"
COUNT = 300


@dataclass
class SharedStream:
    server: EmbeddedServer
    owner: JetStreamApi
    team: dict[str, str]
    """The TEAM account's connection options, as a query gives them."""


def accounts(team_public: str) -> dict[str, Any]:
    """The two accounts, as README, Security shows them."""
    return {
        "accounts": {
            "OWNER": {
                "jetstream": "enabled",
                "users": [{"user": "owner", "password": "owner-pw"}],
                "exports": [
                    {"service": "$JS.API.>", "response": "stream"},
                    {"service": "orders.>"},
                    {"service": "$JS.ACK.>"},
                    {"service": "$KV.>"},
                ],
            },
            "TEAM": {
                "users": [{"nkey": team_public}],
                "imports": [
                    {"service": {"account": "OWNER", "subject": "$JS.API.>"}, "to": f"{PREFIX}.>"},
                    {"service": {"account": "OWNER", "subject": "orders.>"}},
                    {"service": {"account": "OWNER", "subject": "$JS.ACK.>"}},
                    {"service": {"account": "OWNER", "subject": "$KV.>"}},
                ],
            },
        }
    }


@pytest.fixture(scope="module")
def shared() -> Iterator[SharedStream]:
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    with EmbeddedServer(accounts(public), name="accounts") as server:
        owner_options = parse_connection_options({"servers": server.url.replace("://", "://owner:owner-pw@")})
        owner = JetStreamApi(connect(owner_options))
        owner.create_stream({"name": "ORDERS", "subjects": ["orders.>"], "allow_direct": True})
        published = publish_all(owner.conn, ((f"orders.k{i % 7}", f"m{i}".encode(), None) for i in range(COUNT)))
        assert published.count == COUNT
        team = {"servers": server.url, "nkeySecret": seed.decode(), "apiPrefix": PREFIX}
        yield SharedStream(server, owner, team)
        disconnect(owner_options)


def _rows(df: Any) -> list[tuple[int, str, bytes]]:
    return sorted((r.seq, r.subject, bytes(r.data)) for r in df.select("seq", "subject", "data").collect())


def _expected(shared: SharedStream) -> list[tuple[int, str, bytes]]:
    return [(seq, subject, data) for seq, subject, data, _ in stored(shared.owner, "ORDERS")]


def test_without_the_prefix_the_team_account_is_told_to_set_it(shared, spark):
    team = {k: v for k, v in shared.team.items() if k != "apiPrefix"}
    with pytest.raises(Exception) as caught:
        spark.read.format("jetstream").options(**team, stream="ORDERS").load().collect()
    message = error_text(caught.value)
    assert (
        "JetStream not enabled for account (error 10039). A stream shared from another account is reached through"
        in message
    )
    assert "set the apiPrefix option to the import's prefix" in message
    assert shared.team["nkeySecret"] not in message


@pytest.mark.parametrize("mode", ["direct", "pull"])
def test_batch_reads_through_the_import_are_exact(shared, spark, mode):
    df = spark.read.format("jetstream").options(**shared.team, stream="ORDERS", readMode=mode).load()
    assert _rows(df) == _expected(shared)


def test_a_bucket_reads_through_the_import(shared, spark):
    from spark_jetstream.sink.markers import ensure_bucket

    ensure_bucket(shared.owner.conn, "PRICES", 1)
    puts = [("$KV.PRICES.a", b"1"), ("$KV.PRICES.b", b"2"), ("$KV.PRICES.a", b"3")]
    assert publish_all(shared.owner.conn, ((subject, data, None) for subject, data in puts)).count == 3
    df = spark.read.format("jetstream").options(**shared.team, bucket="PRICES").load()
    assert sorted((r.key, bytes(r.value), r.revision) for r in df.collect()) == [("a", b"3", 3), ("b", b"2", 2)]


@pytest.mark.parametrize(("mode", "group"), [("direct", None), ("pull", "team")])
def test_streaming_reads_through_the_import_are_exact(shared, spark, tmp_path, mode, group):
    options = {**shared.team, "stream": "ORDERS", "readMode": mode, **({"group": group} if group else {})}
    name = f"shared_{mode}"
    query = (
        spark.readStream.format("jetstream")
        .options(**options)
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    expected = _expected(shared)
    assert _rows(spark.table(name)) == expected
    if group:  # the commit moved the member consumers' ack floors, through the import too

        def floors() -> dict[str, int]:
            names = [n for n in shared.owner.consumer_names("ORDERS") if n.startswith(f"{group}-")]
            return {n: shared.owner.consumer_info("ORDERS", n)["ack_floor"]["stream_seq"] for n in names}

        wait_for(lambda: floors() and set(floors().values()) == {expected[-1][0]}, 30, lambda: f"ack floors {floors()}")


def test_writes_through_the_import_are_exact(shared, spark, tmp_path):
    before = shared.owner.stream_info("ORDERS")["state"]["last_seq"]
    rows = [(f"orders.w{i}", f"w{i}") for i in range(200)]
    df = spark.createDataFrame(rows, "subject string, data string")
    df.write.format("jetstream").options(**shared.team).mode("append").save()
    source = spark.readStream.format("jetstream").options(**shared.team, stream="ORDERS").load()
    streaming = (
        source.where(source.subject.startswith("orders.w"))
        .selectExpr("concat('orders.s', substr(subject, 9)) as subject", "data")
        .writeStream.format("jetstream")
        .options(**shared.team)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    streaming.awaitTermination(120)
    after = [(subject, data) for seq, subject, data, _ in stored(shared.owner, "ORDERS") if seq > before]
    written = [(subject, data.encode()) for subject, data in rows]
    copied = [(f"orders.s{subject[8:]}", data) for subject, data in written]
    assert sorted(after) == sorted(written + copied)


def test_a_commit_bucket_not_imported_is_named_with_the_export_it_needs():
    """The streaming writer records its commits in a KV bucket: through an import, its ``$KV`` subjects must be
    exported too. Without, the failure says which export is missing (the rows stay deduplicated for the retry)."""
    import nkeys

    from spark_jetstream.sink.markers import ensure_bucket, write_marker

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    config = accounts(nkeys.from_seed(bytearray(seed)).public_key.decode())
    for account, key in (("OWNER", "exports"), ("TEAM", "imports")):
        config["accounts"][account][key] = [e for e in config["accounts"][account][key] if "$KV" not in str(e)]
    with EmbeddedServer(config, name="no-kv-import") as server:
        owner = parse_connection_options({"servers": server.url.replace("://", "://owner:owner-pw@")})
        ensure_bucket(connect(owner), "commits", 1)
        team = parse_connection_options({"servers": server.url, "nkeySecret": seed.decode(), "apiPrefix": PREFIX})
        with pytest.raises(JetStreamError) as caught:
            write_marker(connect(team), "commits", "q1", 0)
        disconnect(owner)
        disconnect(team)
    assert str(caught.value).endswith(
        "although JetStream answers (through the imported API JS.OWNER.API, where a stream captures it): the account "
        "that owns the stream must export $KV.commits.> as a service and this account import it (docs: Security "
        "guide), or the stream's leader is being elected."
    ), str(caught.value)
