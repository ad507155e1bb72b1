"""A KV bucket as a table, as a stream of its changes, and as a sink: real nats-server, real Spark, buckets made
with nats-py's KV API (as an application makes them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import nats
import pytest
from helpers import KV_OPS, SnapshotMerge, kv_ops

from spark_jetstream.client.publish import publish_all
from spark_jetstream.errors import OptionError


@pytest.fixture
def bucket(api) -> Iterator[Callable[[str], str]]:
    made: list[str] = []

    def name(bucket: str) -> str:
        made.append(bucket)
        return bucket

    yield name
    for bucket in made:
        if f"KV_{bucket}" in api.stream_names():
            api.delete_stream(f"KV_{bucket}")


OPS = KV_OPS


def table(spark, url: str, bucket: str, **options: str) -> list[tuple]:
    frame = spark.read.format("jetstream").option("servers", url).option("bucket", bucket).options(**options).load()
    return sorted(tuple(row) for row in frame.select("key", "value", "revision", "operation").collect())


@pytest.mark.parametrize(("history", "direct"), [(1, False), (1, True), (5, True), (5, False)])
def test_a_bucket_reads_as_its_live_keys_latest_values(spark, nats_server, bucket, history, direct):
    """History 1 (every stored message is its key's latest) read through consumers or with Direct Get; history 5
    (older revisions stored) asks the stream which is each key's latest, or without Direct Get reads it through
    ``last_per_subject`` consumers (more in test_kv_consumers.py)."""
    name = bucket(f"tbl{history}{direct:d}")
    revisions = kv_ops(nats_server.url, name, OPS, history=history, direct=direct)
    rev = dict(zip(range(len(OPS)), revisions, strict=True))
    assert table(spark, nats_server.url, name) == [
        ("group.a", b"admins", rev[5], "PUT"),
        ("user.1", b"ann v2", rev[3], "PUT"),
        ("user.4", b"dee", rev[7], "PUT"),
    ]
    assert table(spark, nats_server.url, name, keys="user.*") == [
        ("user.1", b"ann v2", rev[3], "PUT"),
        ("user.4", b"dee", rev[7], "PUT"),
    ]
    frame = spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", name).load()
    assert frame.schema.simpleString() == (
        "struct<key:string,value:binary,revision:bigint,created:timestamp,operation:string>"
    )


def test_a_bucket_with_history_reads_every_stored_revision(spark, nats_server, bucket):
    name = bucket("hist")
    revisions = kv_ops(nats_server.url, name, OPS, history=5)
    # The purge of user.3 removed its put; the delete of user.2 keeps the put before it (history 5).
    expected = [
        ("group.a", b"admins", revisions[5], "PUT"),
        ("user.1", b"ann", revisions[0], "PUT"),
        ("user.1", b"ann v2", revisions[3], "PUT"),
        ("user.2", b"", revisions[4], "DEL"),
        ("user.2", b"bob", revisions[1], "PUT"),
        ("user.3", b"", revisions[6], "PURGE"),
        ("user.4", b"dee", revisions[7], "PUT"),
    ]
    assert table(spark, nats_server.url, name, includeHistory="true") == expected


def test_the_changes_of_a_bucket_stream_exactly_once_across_a_restart(spark, nats_server, bucket, tmp_path):
    name = bucket("chg")
    first = kv_ops(nats_server.url, name, OPS[:5])
    out, checkpoint = tmp_path / "out", tmp_path / "cp"

    def run() -> None:
        query = (
            spark.readStream.format("jetstream").option("servers", nats_server.url).option("bucket", name)
            .option("maxMessagesPerTrigger", 2).load()
            .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run()
    second = kv_ops(nats_server.url, name, OPS[5:], make=False)
    run()
    rows = sorted(
        (r.revision, r.key, r.value, r.operation)
        for r in spark.read.parquet(str(out)).select("revision", "key", "value", "operation").collect()
    )
    ops = {"put": "PUT", "delete": "DEL", "purge": "PURGE"}
    expected = [(rev, key, value or b"", ops[op]) for rev, (op, key, value) in zip(first + second, OPS, strict=True)]
    # History 1: user.1's and user.2's first puts were gone (changed again) when the first run read the bucket;
    # every other change is there once, in the run that read it.
    assert rows == [e for e in expected if e[0] not in (first[0], first[1])]


def live(url: str, bucket: str) -> dict[str, bytes]:
    """The bucket's live keys and values, as nats-py sees them (its API timeout raised from 5 s: a loaded machine
    answered the key watcher's consumer info later, and only "no keys" means an empty bucket)."""

    async def run() -> dict[str, bytes]:
        nc = await nats.connect(url)
        kv = await nc.jetstream(timeout=30).key_value(bucket)
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        found = {key: (await kv.get(key)).value or b"" for key in keys}
        await nc.close()
        return found

    return asyncio.run(run())


@pytest.mark.parametrize("history", [1, 4])
def test_a_snapshot_then_the_changes_keep_a_table_equal_to_the_bucket(spark, nats_server, bucket, tmp_path, history):
    """``startingPosition=snapshot`` and a foreachBatch MERGE by key: the live values first (one batch, whatever
    maxMessagesPerTrigger), then each change; the table equals the bucket after every run."""
    name = bucket(f"snap{history}")
    kv_ops(nats_server.url, name, OPS, history=history, direct=True)
    snapshot = SnapshotMerge(spark, nats_server.url, name, tmp_path / "cp")
    snapshot.run()
    merged, batches = snapshot.merged, snapshot.batches
    assert merged == live(nats_server.url, name) == {"user.1": b"ann v2", "group.a": b"admins", "user.4": b"dee"}
    assert [op for _, _, _, op in batches[0]] == ["PUT"] * 3  # the snapshot: live values only, in one batch
    kv_ops(nats_server.url, name, [("put", "user.5", b"eve"), ("delete", "user.1", None)], make=False)
    snapshot.run()
    assert merged == live(nats_server.url, name) == {"group.a": b"admins", "user.4": b"dee", "user.5": b"eve"}


def test_a_bucket_s_changes_filtered_by_key(spark, nats_server, bucket, tmp_path):
    name = bucket("chgkeys")
    kv_ops(nats_server.url, name, OPS)
    query = (
        spark.readStream.format("jetstream").option("servers", nats_server.url).option("bucket", name)
        .option("keys", "group.>,user.4").load()
        .writeStream.format("memory").queryName("kvkeys").trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    )  # fmt: skip
    query.awaitTermination(120)
    rows = sorted((r.key, r.value, r.operation) for r in spark.sql("SELECT * FROM kvkeys").collect())
    assert rows == [("group.a", b"admins", "PUT"), ("user.4", b"dee", "PUT")]


def test_a_bucket_s_changes_stream_exactly_once_across_a_driver_kill(spark, nats_server, api, bucket, tmp_path):
    """The driver SIGKILLed mid-batch and the query restarted on its checkpoint: every change once."""
    import sys
    from pathlib import Path

    from helpers import checkpoint_log, finish_job, mid_batch, run_then_kill

    name = bucket("killed")
    ops = [("put", f"key.{i}", b"%d" % i) for i in range(3000)] + [("delete", f"key.{i}", None) for i in range(0, 30)]
    kv_ops(nats_server.url, name, [])
    messages = [
        (f"$KV.{name}.{key}", value or b"", None if op == "put" else {"KV-Operation": "DEL"}) for op, key, value in ops
    ]
    published = publish_all(api.conn, messages)  # what kv.put/kv.delete publish, pipelined
    revisions = list(range(published.first_seq, published.last_seq + 1))
    out, checkpoint = tmp_path / "out", tmp_path / "cp"
    job = Path(__file__).parent / "jobs" / "stream_to_parquet.py"
    args = [sys.executable, str(job), "--servers", nats_server.url, "--bucket", name, "--out", str(out),
            "--checkpoint", str(checkpoint)]  # fmt: skip
    run_then_kill([*args, "--max-per-trigger", "500", "--slow-ms", "2"], lambda: mid_batch(checkpoint), 180)
    assert len(checkpoint_log(checkpoint, "commits")) < len(checkpoint_log(checkpoint, "offsets"))
    finish_job(spark, args)
    rows = sorted((r.revision, r.key, r.operation) for r in spark.read.parquet(str(out)).collect())
    # keys 0-29 were put, then deleted: with one revision per key their puts were gone before any read
    expected = sorted(
        (rev, key, "PUT" if op == "put" else "DEL")
        for rev, (op, key, _) in zip(revisions, ops, strict=True)
        if not (op == "put" and int(key.split(".")[1]) < 30)
    )
    assert rows == expected


def test_options_of_a_stream_are_refused_with_a_bucket(spark, nats_server):
    def reader():
        return spark.read.format("jetstream").option("servers", nats_server.url)

    with pytest.raises(Exception, match="Option 'group' does not apply to a KV bucket's rows"):
        reader().option("bucket", "b").option("group", "g").load().collect()
    with pytest.raises(Exception, match="Option 'keys' applies to KV buckets"):
        reader().option("stream", "S").option("keys", "a.*").load().collect()


def test_option_rules_for_buckets():
    from spark_jetstream.options import BATCH, STREAM, parse_options

    with pytest.raises(OptionError, match="Option 'bucket' and option 'stream' are both set"):
        parse_options({"stream": "S", "bucket": "b"}, BATCH)
    with pytest.raises(OptionError, match="Option 'stream' is required: .*or .option\\('bucket'"):
        parse_options({}, BATCH)
    with pytest.raises(OptionError, match="Option 'subjects' does not apply to a KV bucket's rows .*use keys"):
        parse_options({"bucket": "b", "subjects": "a.>"}, BATCH)
    with pytest.raises(OptionError, match="startingPosition=snapshot applies to spark.readStream of a bucket"):
        parse_options({"bucket": "b", "startingPosition": "snapshot"}, BATCH)
    with pytest.raises(OptionError, match="startingPosition=snapshot applies to a KV bucket's changes"):
        parse_options({"stream": "S", "startingPosition": "snapshot"}, STREAM)
    assert parse_options({"bucket": "b", "startingPosition": "snapshot"}, STREAM)["startingPosition"] == "snapshot"


# -- writing a bucket ---------------------------------------------------------------------------


def write_kv(spark, url: str, bucket: str, rows: list[tuple], schema: str) -> None:
    frame = spark.createDataFrame(rows, schema)
    frame.write.format("jetstream").option("servers", url).option("bucket", bucket).mode("append").save()


def test_rows_are_written_as_puts_and_deletes(spark, nats_server, api, bucket):
    name = bucket("w1")
    kv_ops(nats_server.url, name, [("put", "old", b"x"), ("put", "gone", b"y")])
    rows = [("a.1", b"one"), ("a.2", b"two"), ("gone", None), ("old", b"new")]
    write_kv(spark, nats_server.url, name, rows, "key string, value binary")
    assert live(nats_server.url, name) == {"a.1": b"one", "a.2": b"two", "old": b"new"}
    history = table(spark, nats_server.url, name, includeHistory="true")
    assert ("gone", b"", history[2][2], "DEL") in history  # a delete marker, as the NATS clients write it


def test_compare_and_set_writes_at_the_row_s_revision_and_refuses_a_stale_one(spark, nats_server, bucket):
    name = bucket("w2")
    revisions = kv_ops(nats_server.url, name, [("put", "price.eur", b"1.00"), ("put", "price.usd", b"1.10")])
    schema = "key string, value string, revision bigint"
    write_kv(spark, nats_server.url, name, [("price.eur", "1.01", revisions[0]), ("price.gbp", "0.85", 0)], schema)
    assert live(nats_server.url, name) == {"price.eur": b"1.01", "price.usd": b"1.10", "price.gbp": b"0.85"}
    with pytest.raises(Exception) as refused:
        write_kv(spark, nats_server.url, name, [("price.usd", "1.20", revisions[0])], schema)
    message = str(refused.value)
    assert f"Compare-and-set refused for key 'price.usd' of KV bucket 'w2': the key is at revision {revisions[1]}" in (
        message
    )
    assert live(nats_server.url, name)["price.usd"] == b"1.10"


def test_a_streaming_write_to_a_bucket_replayed_is_stored_once(spark, nats_server, api, bucket, make_stream, tmp_path):
    """A jetstream -> KV query whose last batch Spark replays (its commit lost): every row once."""
    source = make_stream(300, partitions=2)
    name = bucket("w3")
    kv_ops(nats_server.url, name, [])
    checkpoint = tmp_path / "cp"
    for replay in (False, True):
        if replay:
            commits = checkpoint / "commits"
            last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
            (commits / str(last)).unlink()
            (commits / f".{last}.crc").unlink(missing_ok=True)
        query = (
            spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", source.name)
            .option("maxMessagesPerTrigger", 100).load()
            .selectExpr("concat('k.', seq) AS key", "data AS value")
            .writeStream.format("jetstream").option("servers", nats_server.url).option("bucket", name)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
    assert api.stream_info(f"KV_{name}")["state"]["messages"] == 300
    assert live(nats_server.url, name) == {f"k.{seq}": data for seq, (_, data, _, _) in source.messages.items()}


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("value binary", "A write to KV bucket 'b' needs a 'key' column"),
        ("key string", "A write to KV bucket 'b' needs a 'value' column"),
        ("key string, value binary, subject string", "Column 'subject' is not used by a write to KV bucket 'b'"),
        ("key bigint, value binary", "Column 'key' has type bigint, but a write to KV bucket 'b' takes string"),
    ],
)
def test_a_bucket_write_s_columns_are_checked_before_anything_is_written(spark, nats_server, schema, message):
    row = tuple(1 if "bigint" in f else (b"v" if "binary" in f else "k") for f in schema.split(", "))
    with pytest.raises(Exception, match=message):
        write_kv(spark, nats_server.url, "b", [row], schema)


def test_a_bad_key_fails_the_write_naming_it(spark, nats_server, bucket):
    name = bucket("w4")
    kv_ops(nats_server.url, name, [])
    with pytest.raises(Exception, match=r"Cannot write key 'bad key' to KV bucket 'w4'"):
        write_kv(spark, nats_server.url, name, [("good", b"1"), ("bad key", b"2")], "key string, value binary")


def test_a_compare_and_set_write_replayed_is_a_duplicate_not_a_refusal(spark, nats_server, api, bucket):
    """The server checks a revision before a msg id: a task that stored compare-and-set rows and is run again (a
    retry, a replay) finds each key's last message carrying the row's own msg id and counts it a duplicate; a key
    someone else moved on is still refused."""
    import pyarrow as pa

    from spark_jetstream.client.connection import connect
    from spark_jetstream.client.connection_options import ConnectionOptions
    from spark_jetstream.sink.config import SinkConfig
    from spark_jetstream.sink.kv import KvColumns, publish_kv

    name = bucket("w5")
    revisions = kv_ops(nats_server.url, name, [("put", "a", b"1"), ("put", "b", b"1")])
    conn = connect(ConnectionOptions(servers=(nats_server.url,)))
    config = SinkConfig(connection=conn.options, bucket=name)
    rows = pa.RecordBatch.from_pydict(
        {
            "key": ["a", "b", "c", "d"],
            "value": [b"2", b"2", b"x", None],
            "revision": [revisions[0], revisions[1], None, None],
        }
    )
    columns = KvColumns(key=0, value=1, revision=2)
    assert publish_kv(conn, config, columns, iter([rows]), "q:1:0:") == (4, 0)
    assert publish_kv(conn, config, columns, iter([rows]), "q:1:0:") == (4, 4)  # the same task again
    assert api.stream_info(f"KV_{name}")["state"]["messages"] == 4  # a, b once more each, c; d's delete
    with pytest.raises(Exception, match=r"Compare-and-set refused for key 'a' of KV bucket 'w5'"):
        publish_kv(conn, config, columns, iter([rows]), "other:1:0:")  # another writer, an old revision


def test_which_revision_is_each_keys_latest_is_asked_until_the_server_answered_every_key(api, conn):
    """``multi_last`` answers up to the request's ``max_bytes`` and at most 64 MiB whatever it asks, then says in its
    end-of-batch reply how many it left out (1,024 values of 68 KB lost 65 keys of a table read): the keys it left
    out are asked again. Keys without a message up to the point asked end the asking too."""
    from spark_jetstream.client.messages import last_seqs

    api.create_stream(
        {"name": "KV_large", "subjects": ["$KV.large.>"], "allow_direct": True, "max_msgs_per_subject": 5}
    )
    try:
        value = b"v" * (66 * 1024)
        result = publish_all(conn, ((f"$KV.large.k{i}", value, None) for i in range(1024)))
        first = result.first_seq
        subjects = [f"$KV.large.k{i}" for i in range(1024)] + ["$KV.large.none"]
        expected = {f"$KV.large.k{i}": first + i for i in range(1024)}
        for max_bytes in (8 << 20, 128 << 20):  # the read's default, and more than the server's 64 MiB
            assert last_seqs(conn, "KV_large", subjects, first + 1023, max_bytes) == expected
        assert last_seqs(conn, "KV_large", subjects[:10], first + 4, 1 << 20) == {
            subject: seq for subject, seq in expected.items() if seq <= first + 4
        }
    finally:
        api.delete_stream("KV_large")
