"""Exactly-once writes at any age: atomic batches with progress markers (``sink/atomic.py``), against a real
nats-server, outside Spark (the task's side) and in Spark (streaming and batch writes, a killed query)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest
from helpers import (
    checkpoint_log,
    finish_job,
    kill_mid_batch,
    query_not_failed,
    sink_job,
    source_data,
    stored,
    wait_for,
)
from pyspark.sql import functions as F

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.progress_markers import is_marker
from spark_jetstream.client.publish import PublishError, publish_all
from spark_jetstream.errors import OptionError
from spark_jetstream.read.direct import read_range
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.sink.atomic import AtomicWriter, Marker, ProgressTarget, progress_target, read_marker
from spark_jetstream.sink.config import Columns, SinkConfig
from spark_jetstream.sink.publishing import Commands

_S = 1_000_000_000
SCHEMA = pa.schema([("subject", pa.string()), ("data", pa.binary())])


@pytest.fixture
def atomic_stream(api: JetStreamApi) -> Iterator[str]:
    """A stream of rows ``at.>`` and markers ``atp.>``, atomic batches allowed, a 1 s duplicate window."""
    api.create_stream(
        {
            "name": "AT",
            "subjects": ["at.>", "atp.>"],
            "allow_atomic": True,
            "duplicate_window": _S,
            "allow_direct": True,
        }
    )
    yield "AT"
    api.delete_stream("AT")


def rows(first: int, last: int, per_batch: int = 300) -> Iterator[pa.RecordBatch]:
    """Rows ``first..last-1``: subject ``at.k<i % 7>``, data ``<i>``, in Arrow batches as Spark hands them over."""
    for low in range(first, last, per_batch):
        numbers = range(low, min(last, low + per_batch))
        yield pa.RecordBatch.from_arrays(
            [pa.array([f"at.k{i % 7}" for i in numbers]), pa.array([b"%d" % i for i in numbers])], schema=SCHEMA
        )


def writer(conn, batch_id: int = 0, partition: int = 0, max_messages: int = 100, sink: str = "a1") -> AtomicWriter:
    config = SinkConfig(connection=conn.options)
    commands = Commands(config, Columns(data=1, subject=0), None, conn.client.max_payload)
    target = ProgressTarget("AT", "atp", max_messages)
    return AtomicWriter(conn, commands, target, sink, batch_id, partition, timeout=10.0, max_bytes=1 << 20)


def data_rows(api: JetStreamApi) -> list[int]:
    return [int(data) for _, subject, data, _ in stored(api, "AT") if subject.startswith("at.")]


def test_rows_are_stored_in_atomic_batches_each_with_its_marker(conn, api, atomic_stream):
    result = writer(conn).write(rows(0, 250))
    assert (result.published, result.skipped, result.stale) == (250, 0, False)
    messages = stored(api, "AT")
    assert [int(d) for _, s, d, _ in messages if s.startswith("at.")] == list(range(250))
    markers = [(seq, s) for seq, s, _, _ in messages if not s.startswith("at.")]
    assert [s for _, s in markers] == ["atp.sjp-a1.0"] * 3  # 99 + 99 + 52 rows
    assert [seq for seq, _ in markers] == [100, 200, 253]  # each marker last in its batch
    marker = conn.run(read_marker(JetStreamApi(conn), "AT", "atp.sjp-a1.0"))
    assert (marker.seq, marker.batch, marker.chunk, marker.rows) == (253, 0, 2, 250)
    # Every read of the stream leaves the markers out.
    read = [int(v) for batch in read_range(conn, SeqRange("AT", ">", 0, 253, False)) for v in batch.column("data")]
    assert read == list(range(250))


def test_a_replay_after_the_duplicate_window_continues_after_the_stored_rows(conn, api, atomic_stream):
    """A task killed after two chunks (its input stops with an error), replayed 1.5 s later, past the stream's 1 s
    duplicate window: every row once."""

    def dies_after(count: int) -> Iterator[pa.RecordBatch]:
        for batch in rows(0, 1000, 50):
            yield batch
            if int(batch.column("data")[-1].as_py()) >= count:
                raise RuntimeError("the executor died")

    with pytest.raises(RuntimeError, match="the executor died"):
        writer(conn, batch_id=3).write(dies_after(230))
    assert data_rows(api) == list(range(198))  # two whole chunks of 99; the third never committed
    time.sleep(1.5)
    result = writer(conn, batch_id=3).write(rows(0, 1000, 50))
    assert (result.published, result.skipped) == (802, 198)
    assert data_rows(api) == list(range(1000))


def test_an_attempt_whose_input_was_cut_stores_a_short_chunk_and_the_replay_goes_on_after_it(conn, api, atomic_stream):
    """A dying executor's worker takes its cut input for the end and commits what it got: the replay, whose
    chunks are cut from there, stores the rest."""
    assert writer(conn, batch_id=1).write(rows(0, 150)).published == 150
    result = writer(conn, batch_id=1).write(rows(0, 400))
    assert (result.published, result.skipped) == (250, 150)
    assert data_rows(api) == list(range(400))


def test_a_replay_whose_first_rows_are_not_those_its_marker_counts_fails_the_task(conn, api, atomic_stream):
    """A replay skips the rows its marker says are stored only when its first rows are those rows, compared by their
    fingerprint (subjects and data), however Spark cut them into record batches: other rows (a source that cut the
    replayed batch otherwise, a plan that is not deterministic) fail the task, naming the partition, and nothing more
    is written."""
    assert writer(conn, batch_id=2).write(rows(0, 150)).published == 150  # an attempt whose input was cut
    result = writer(conn, batch_id=2).write(rows(0, 300, per_batch=40))  # the same rows in other record batches
    assert (result.published, result.skipped) == (150, 150)
    marker = conn.run(read_marker(JetStreamApi(conn), "AT", "atp.sjp-a1.0"))
    assert (marker.rows, len(marker.print)) == (300, 32)
    with pytest.raises(PublishError) as other:
        writer(conn, batch_id=2).write(rows(1000, 1400))
    assert str(other.value).startswith(
        "Partition 0 of Spark batch 2 holds other rows than the attempt that stored its first 300 rows (progress "
        f"marker 'atp.sjp-a1.0': fingerprint {marker.print}, this attempt's "
    )
    assert str(other.value).endswith(
        "skipping them by count would lose some rows and store others twice. A replayed partition must hold its first "
        "attempt's rows in the same order: a source that replays a micro-batch as it was cut (the jetstream source "
        "does) and a deterministic plan (no rand(), no shuffle or union whose order varies). Nothing more was written "
        "by this attempt."
    )
    with pytest.raises(PublishError, match=r"this attempt's 100 rows only\)"):
        writer(conn, batch_id=2).write(rows(0, 100))
    assert data_rows(api) == list(range(300))
    marker_before = Marker(1, 2, 0, 150, "x")  # a marker written before fingerprints: counted as before
    assert marker_before.print == "" and marker_before.rows_of(2) == 150


def test_two_attempts_at_once_store_every_row_once(conn, api, atomic_stream):
    """A speculative copy: both attempts write the same partition at the same time, with small chunks."""
    results = []

    def attempt() -> None:
        results.append(writer(conn, batch_id=2, max_messages=20).write(rows(0, 2000, 100)))

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(data_rows(api)) == list(range(2000))
    assert Counter(data_rows(api)).most_common(1)[0][1] == 1
    assert sum(r.published for r in results) == 2000
    assert all(r.published + r.skipped == 2000 for r in results)


def test_rows_are_committed_through_the_election_after_the_stream_leader_died(nats_cluster, cluster_api):
    """The stream's leader is killed as a task starts writing (its marker read): until a new one is elected no stream
    takes a batch (its commit is answered 503, no responders; a query failed so), so each batch is sent again after
    reading the marker, and once the new leader is up every row is stored once."""
    api = cluster_api
    config = {"name": "AT", "subjects": ["at.>", "atp.>"], "allow_atomic": True, "num_replicas": 3}
    api.create_stream({**config, "storage": "file", "allow_direct": True})
    leader_name = wait_for(lambda: api.stream_info("AT")["cluster"].get("leader"), 30, "the stream's leader")
    leader = next(server for server in nats_cluster.servers if server.name == leader_name)
    follower = next(server for server in nats_cluster.servers if server is not leader)
    options = ConnectionOptions(servers=(follower.url,))

    def killed_first() -> Iterator[pa.RecordBatch]:
        leader.kill()
        yield from rows(0, 1000)

    try:
        result = writer(connect(options)).write(killed_first())
    finally:
        leader.start()
        disconnect(options)
    try:
        assert (result.published, result.skipped) == (1000, 0)
        assert sorted(data_rows(api)) == list(range(1000))
    finally:
        api.delete_stream("AT")


def test_an_attempt_of_an_older_batch_publishes_nothing(conn, api, atomic_stream):
    writer(conn, batch_id=5).write(rows(0, 10))
    stale = writer(conn, batch_id=4).write(rows(100, 200))
    assert (stale.stale, stale.published) == (True, 0)
    assert data_rows(api) == list(range(10))


def test_the_markers_of_each_partition_and_sink_are_apart(conn, api, atomic_stream):
    writer(conn, partition=0).write(rows(0, 120))
    writer(conn, partition=1).write(rows(1000, 1120))
    writer(conn, partition=0, sink="b2").write(rows(2000, 2050))
    subjects = {s for _, s, _, _ in stored(api, "AT") if s.startswith("atp.")}
    assert subjects == {"atp.sjp-a1.0", "atp.sjp-a1.1", "atp.sjp-b2.0"}
    assert sorted(data_rows(api)) == [*range(120), *range(1000, 1120), *range(2000, 2050)]


def test_marker_subjects_are_recognised_and_nothing_else():
    subjects = pa.array(
        [
            "orders.k1",
            "orders_progress.sjp-3f2a9c1e-0b7d-4e1a-9c55-1a2b3c4d5e6f.12",
            "progress.sjp-0a1b2c.0",
            "orders.sjp-notes",
            "orders.sjp-abc.x",
            "sjp-ab.3",
        ]
    )
    assert is_marker(subjects).to_pylist() == [False, True, True, False, False, True]
    assert is_marker(pa.array(["a.b", "c.d"])) is None


def test_where_the_markers_go_is_settled_before_any_task_runs(conn, api, atomic_stream, caplog, monkeypatch):
    from spark_jetstream.sink import atomic

    assert progress_target(conn, "atp", 1000) == ProgressTarget("AT", "atp", 1000)
    with pytest.raises(OptionError, match=r"progressSubject 'nowhere': no stream captures 'nowhere\.sjp-0\.0'"):
        progress_target(conn, "nowhere", 1000)
    monkeypatch.setattr(atomic, "_said_within_window", False)
    api.create_stream({"name": "PLAIN", "subjects": ["plain.>"]})
    try:
        with caplog.at_level("WARNING", logger="spark_jetstream.sink.atomic"):
            assert progress_target(conn, "plain", 1000) is None  # works as without markers, and says so once
            assert progress_target(conn, None, 1000) is None
    finally:
        api.delete_stream("PLAIN")
    said = [r.getMessage() for r in caplog.records if "duplicate window" in r.getMessage()]
    assert len(said) == 1
    assert "exactly-once within the target stream's duplicate window only (stream 'PLAIN' does not allow" in said[0]
    assert "allow_atomic (nats-server 2.12+) and set progressSubject" in said[0]


def test_a_marker_subject_holding_something_else_is_refused(conn, api, atomic_stream):
    from spark_jetstream.client.publish import publish_all

    publish_all(conn, [("atp.sjp-a1.0", b"not a marker", None)])
    with pytest.raises(Exception, match="not a spark-jetstream progress marker"):
        writer(conn).write(rows(0, 10))
    assert Marker().rows_of(0) == 0


# -- in Spark -----------------------------------------------------------------------------------


def atomic_target(api: JetStreamApi, name: str, **extra: object) -> str:
    """Stream ``name``: rows on ``<name>.>``, markers on ``<name>_progress.>``, a 1 s duplicate window."""
    lower = name.lower()
    config = {"subjects": [f"{lower}.>", f"{lower}_progress.>"], "allow_atomic": True, "duplicate_window": _S}
    api.create_stream({"name": name, **config, **extra})
    return name


def rows_of(api: JetStreamApi, name: str) -> list[bytes]:
    return sorted(d for _, subject, d, _ in stored(api, name) if subject.startswith(f"{name.lower()}."))


def test_a_query_killed_mid_batch_and_replayed_after_the_duplicate_window_stores_each_row_once(
    spark, nats_server, api, make_stream, tmp_path
):
    """The case the msg ids cannot cover (``test_sink``: it repeats what the killed attempt stored): with
    progress markers the replay, 1.5 s after a kill mid-batch on a stream with a 1 s duplicate window, continues
    after the rows its killed attempt stored."""
    source = make_stream(6000, partitions=4)
    out = atomic_target(api, "AOUT1")
    checkpoint = tmp_path / "cp"
    try:
        extra = ("--progress-subject", "aout1_progress", "--atomic-batch-size", "40")
        args = sink_job(nats_server.url, source, out, checkpoint, *extra)
        kill_mid_batch(args, api, out, checkpoint)
        assert len(checkpoint_log(checkpoint, "commits")) < len(checkpoint_log(checkpoint, "offsets"))
        time.sleep(1.5)
        finish_job(spark, args)
        assert rows_of(api, out) == source_data(source)
        subjects = {subject for _, subject, _, _ in stored(api, out) if not subject.startswith("aout1.")}
        assert subjects and is_marker(pa.array(sorted(subjects))).to_pylist() == [True] * len(subjects)
    finally:
        api.delete_stream(out)


def test_a_batch_write_whose_task_is_retried_stores_every_row_once(spark, nats_server, api):
    """A task fails after publishing about 700 of its 1000 rows; its retry continues after the rows stored."""

    @F.udf("string")
    def payload_failing_first_attempt_late(i: int) -> str:
        from pyspark import TaskContext

        if i == 700 and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("injected failure after about 700 rows of this task were published")
        return f"{i}:" + "x" * 8000  # big rows: the UDF worker passes them on as they come

    out = atomic_target(api, "AOUT2")
    df = spark.range(0, 2000, 1, 2).select(
        F.lit("aout2.x").alias("subject"), payload_failing_first_attempt_late("id").alias("data")
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")  # rows reach the writer gradually
    try:
        writer = df.write.format("jetstream").option("servers", nats_server.url)
        writer.option("progressSubject", "aout2_progress").option("atomicBatchSize", "100").mode("append").save()
        assert sorted(int(d.split(b":")[0]) for d in rows_of(api, out)) == list(range(2000))
        assert api.subjects(out, "aout2_progress.>") == []  # the write's markers went with its end: nothing grows
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        api.delete_stream(out)


def test_a_stream_without_atomic_batches_is_written_as_before(spark, nats_server, api):
    """progressSubject on a stream without allow_atomic: the writer with msg ids (and the KV marker), no markers."""
    out = atomic_target(api, "AOUT3", allow_atomic=False)
    try:
        data = F.col("id").cast("string").alias("data")
        df = spark.range(0, 300, 1, 2).select(F.lit("aout3.x").alias("subject"), data)
        writer = df.write.format("jetstream").option("servers", nats_server.url)
        writer.option("progressSubject", "aout3_progress").mode("append").save()
        messages = stored(api, out)
        assert sorted(int(d) for _, _, d, _ in messages) == list(range(300))
        assert all("Nats-Msg-Id" in headers for _, _, _, headers in messages)
    finally:
        api.delete_stream(out)


def test_a_stream_leader_killed_mid_write_costs_no_row_and_the_query_goes_on(
    spark, nats_cluster, cluster_api, tmp_path
):
    import threading

    api, conn = cluster_api, cluster_api.conn
    api.create_stream({"name": "ASRC", "subjects": ["asrc.>"], "num_replicas": 3})
    atomic_target(api, "AOUT4", num_replicas=3)
    published = publish_all(conn, ((f"asrc.k{i % 13}", b"%d" % i, None) for i in range(8000)))
    urls = nats_cluster.urls
    checkpoint = tmp_path / "cp"
    query = (
        spark.readStream.format("jetstream").option("servers", urls).option("stream", "ASRC")
        .option("maxMessagesPerTrigger", 500).load()
        .select(F.concat(F.lit("aout4."), F.substring_index("subject", ".", -1)).alias("subject"), "data")
        .writeStream.format("jetstream").option("servers", urls).option("progressSubject", "aout4_progress")
        .option("atomicBatchSize", 50).option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds").start()
    )  # fmt: skip
    by_name = {server.name: server for server in nats_cluster.servers}
    killed: list[str] = []

    def kill_leader() -> None:
        while not (checkpoint / "commits" / "2").exists():
            time.sleep(0.05)
        leader = api.stream_info("AOUT4")["cluster"]["leader"]
        by_name[leader].kill()
        killed.append(leader)
        time.sleep(3)
        by_name[leader].start()

    def finished() -> bool:
        progress = query.lastProgress
        return (
            not killer.is_alive()
            and bool(progress)
            and f'"seq": {published.last_seq}' in str(progress["sources"][0]["endOffset"]).replace("'", '"')
        )

    killer = threading.Thread(target=kill_leader, daemon=True)
    killer.start()
    try:
        wait_for(finished, 240, "the query to write everything after the leader was killed", poll=0.2,
                 check=query_not_failed(query))  # fmt: skip
    finally:
        query.stop()
        killer.join(30)
    try:
        assert len(killed) == 1
        assert rows_of(api, "AOUT4") == sorted(b"%d" % i for i in range(8000))
    finally:
        api.delete_stream("ASRC")
        api.delete_stream("AOUT4")


def test_a_msg_id_column_is_refused_with_progress_markers(spark, nats_server, api):
    out = atomic_target(api, "AOUT5")
    try:
        frame = spark.range(0, 3).selectExpr("'aout5.x' AS subject", "string(id) AS data", "string(id) AS msg_id")
        writer = frame.write.format("jetstream").option("servers", nats_server.url)
        with pytest.raises(Exception, match="A msg_id column cannot be written with progressSubject"):
            writer.option("progressSubject", "aout5_progress").mode("append").save()
        assert api.stream_info(out)["state"]["messages"] == 0
    finally:
        api.delete_stream(out)


def test_a_writer_refused_for_batches_in_flight_sends_its_first_message_until_one_may_start(tmp_path):
    """A server that allows one atomic batch in flight a stream (``jetstream.limits.batch``), held by another
    client's batch that is never committed (abandoned after 2 s): the writer's batches are refused (10210, a 429)
    until then, and each try after the first refusal sends the batch's first message alone: a write of three batches
    costs the server under 1.5 messages a row (41 refusals of 1,000-row batches sent 3.1 a row)."""
    import json
    import urllib.request

    from spark_jetstream.testing import EmbeddedServer

    limits = {"jetstream": {"limits": {"batch": {"max_inflight_per_stream": 1, "timeout": "2s"}}}}
    server = EmbeddedServer(limits, name="inflight", store_dir=str(tmp_path)).start()
    options = ConnectionOptions(servers=(server.url,))
    conn = connect(options)

    def received() -> int:
        with urllib.request.urlopen(f"{server.monitor}/varz") as answer:
            return int(json.load(answer)["in_msgs"])

    try:
        api = JetStreamApi(conn)
        api.create_stream({"name": "AT", "subjects": ["at.>", "atp.>"], "allow_atomic": True, "allow_direct": True})

        async def hold_a_batch() -> None:  # another client's batch, started and never committed
            headers = {"Nats-Batch-Id": "held", "Nats-Batch-Sequence": "1"}
            await conn.client.request("at.held", b"x", timeout=5, headers=headers)

        conn.run(hold_a_batch())
        before = received()
        result = writer(conn, max_messages=1000).write(rows(0, 2997))
        sent = received() - before
    finally:
        disconnect(options)
        server.close()
    assert (result.published, result.skipped) == (2997, 0)
    assert sent < 1.5 * 3000, sent  # rows, markers, the refused batch, the later tries' first messages, marker reads


def test_markers_on_a_stream_that_allows_rollups_keep_only_each_partitions_last(conn, api):
    """Each marker rolls up its subject (``Nats-Rollup: sub``, in the atomic batch): one message per partition and
    sink stays, whatever the batches (without rollups, a message per write task per batch accumulates). A stream and a
    marker prefix of its own: in one full run a marker subject of ``AT`` held what an earlier test published there."""
    api.create_stream({"name": "ATR", "subjects": ["at.>", "atrp.>"], "allow_atomic": True, "allow_rollup_hdrs": True})
    try:
        target = progress_target(conn, "atrp", 100)
        assert target == ProgressTarget("ATR", "atrp", 100, rollup=True)
        config = SinkConfig(connection=conn.options)
        commands = Commands(config, Columns(data=1, subject=0), None, conn.client.max_payload)
        for batch_id in (0, 1):
            write = AtomicWriter(conn, commands, target, "a1", batch_id, 0, timeout=10.0, max_bytes=1 << 20)
            assert write.write(rows(0, 250)).published == 250
        messages = stored(api, "ATR")
        assert [subject for _, subject, _, _ in messages if subject.startswith("atrp.")] == ["atrp.sjp-a1.0"]
        assert len([subject for _, subject, _, _ in messages if subject.startswith("at.")]) == 500
        marker = conn.run(read_marker(JetStreamApi(conn), "ATR", "atrp.sjp-a1.0"))
        assert (marker.batch, marker.chunk, marker.rows) == (1, 2, 250)
    finally:
        api.delete_stream("ATR")
