"""Faults production brings: servers restarting under a running query. Nothing lost, nothing doubled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    KILL_CHAIN,
    checkpoint_log,
    child_alive,
    finish_job,
    kill_chain,
    query_not_failed,
    slow_parquet_query,
    wait_for,
)

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(name="faults").start()
    yield server
    disconnect(ConnectionOptions(servers=(server.url,)))
    server.close()


def test_server_restart_mid_batch_is_survived_with_exact_output(spark, own_server, tmp_path):
    api = JetStreamApi(connect(ConnectionOptions(servers=(own_server.url,))))
    api.create_stream(partitioned_stream_config("R", "r.*", 4))
    published = publish_all(api.conn, ((f"r.k{i % 211}", f"r-{i}".encode(), None) for i in range(4000)))

    checkpoint = tmp_path / "cp"
    query = slow_parquet_query(spark, own_server.url, "R", "g", 500, 0.002, tmp_path)
    restarted = threading.Event()

    def restart_after_first_commit() -> None:
        while not checkpoint_log(checkpoint, "commits"):
            time.sleep(0.02)
        own_server.stop()  # mid-batch: the next batch is being read
        time.sleep(1.0)
        own_server.start()
        restarted.set()

    def caught_up() -> bool:
        if not restarted.is_set() or not (progress := query.lastProgress):
            return False
        end = progress["sources"][0]["endOffset"]
        return bool(end) and f'"seq": {published.last_seq}' in end

    threading.Thread(target=restart_after_first_commit, daemon=True).start()
    try:
        wait_for(caught_up, 180, "the query to catch up after the restart", poll=0.2, check=query_not_failed(query))
    finally:
        query.stop()
    seqs = sorted(r.seq for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect())
    assert seqs == list(range(1, 4001))


def test_stream_deleted_and_created_again_while_the_query_is_down_fails_clearly_or_is_read_anew(
    spark, nats_server, api, tmp_path
):
    """By default the checkpoint's seqs, which name other messages now, fail the query; with failOnDataLoss=false
    the new stream is read from its first message (as Kafka's source reads a topic created again)."""

    def run(**options: str) -> object:
        return (
            spark.readStream.format("jetstream")
            .option("servers", nats_server.url)
            .option("stream", "Again")
            .option("group", "g")
            .options(**options)
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )

    api.create_stream(partitioned_stream_config("Again", "again.*", 2))
    try:
        publish_all(api.conn, ((f"again.k{i}", b"old", None) for i in range(100)))
        run().awaitTermination(60)
        api.delete_stream("Again")
        time.sleep(0.01)
        api.create_stream(partitioned_stream_config("Again", "again.*", 2))
        publish_all(api.conn, ((f"again.k{i}", b"new", None) for i in range(300)))
        query = run()
        with pytest.raises(Exception) as caught:
            query.awaitTermination(60)
        message = caught.value.getMessage() if hasattr(caught.value, "getMessage") else str(caught.value)
        assert "Stream 'Again' was deleted and created again since the checkpoint was written" in message
        assert "or set failOnDataLoss=false to read the new stream from its first message" in message
        run(failOnDataLoss="false").awaitTermination(60)
        rows = spark.read.parquet(str(tmp_path / "out")).select("data", "seq").collect()
        assert sorted((bytes(r.data), r.seq) for r in rows) == sorted(
            [(b"old", seq) for seq in range(1, 101)] + [(b"new", seq) for seq in range(1, 301)]
        )
    finally:
        api.delete_stream("Again")


JOB = Path(__file__).parent / "jobs" / "stream_to_parquet.py"


def test_driver_killed_at_each_point_of_the_batch_cycle_restarts_exactly(
    spark, nats_server, api, make_stream, tmp_path
):
    """One checkpoint, a driver killed at each point of the batch cycle in turn (``helpers.KILL_CHAIN``, after a kill
    of a new query before its first offset), then finished in the test's session: every message once in the output,
    every floor at the last seq. A WorkQueue stream: an ack before Spark's commit (the restart's
    ``partitions(latest, latest)`` must not ack) would delete what the replay needs. PySpark 4.0 and 4.1:
    ``test_spark_versions.py``. (Mid-read: ``test_driver_kill.py``.)"""
    import sys

    from chispa import assert_df_equality

    stream = make_stream(3000, partitions=3, retention="workqueue")
    out, checkpoint = tmp_path / "out", tmp_path / "cp"
    args = [sys.executable, str(JOB), "--servers", nats_server.url, "--stream", stream.name,
            "--group", stream.group, "--out", str(out), "--checkpoint", str(checkpoint),
            "--max-per-trigger", "500"]  # fmt: skip
    kill_chain(args, ("initial#1", *KILL_CHAIN), tmp_path)
    assert checkpoint_log(checkpoint, "offsets").keys() == checkpoint_log(checkpoint, "commits").keys() == {0, 1, 2}

    finish_job(spark, args)
    rows = [(subject, payload, seq, part) for seq, (subject, payload, _, part) in stream.messages.items()]
    expected = spark.createDataFrame(rows, "subject string, data binary, seq long, partition int")
    output = spark.read.parquet(str(out)).select("subject", "data", "seq", "partition")
    assert_df_equality(output, expected, ignore_row_order=True, ignore_nullable=True)
    floors = {api.consumer_info(stream.name, stream.consumer(p))["ack_floor"]["stream_seq"] for p in range(3)}
    assert floors == {stream.last_seq}


def test_messages_purged_while_a_planned_batch_waits_for_its_tasks_fail_them(nats_server, api, make_stream, tmp_path):
    """Batch 1, ``(300, 600]``, is planned (the plan's check finds nothing missing) and its driver paused before any
    task reads it; seqs 301..400 are purged meanwhile. The tasks see it: the query fails with the loss named, under
    the default ``failOnDataLoss``, instead of going on without them."""
    import os
    import subprocess
    import sys

    stream = make_stream(1000, partitions=2)
    marker = tmp_path / "paused"
    args = [sys.executable, str(JOB), "--servers", nats_server.url, "--stream", stream.name,
            "--group", stream.group, "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp"),
            "--max-per-trigger", "300"]  # fmt: skip
    env = {**os.environ, "SPARK_JETSTREAM_FAULT": f"plan#2:{marker}"}
    child = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(marker.exists, 120, "the driver to plan batch 1", poll=0.05, check=child_alive(child))
        api.purge_stream(stream.name, keep_from_seq=401)
        marker.unlink()  # the driver goes on: batch 1's tasks read
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, 9)
            child.wait()
    assert child.returncode != 0
    assert (
        f"Messages seqs 301..400 of stream '{stream.name}' were removed (retention limits or a purge) after their "
        "micro-batch was planned, before its task read them: set failOnDataLoss=false to skip them, or raise the "
        "stream's limits." in err.decode()
    )
    assert checkpoint_log(tmp_path / "cp", "commits").keys() == {0}
