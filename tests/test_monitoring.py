"""The lag listener reads Spark's own progress events; the committed offset reads Spark's checkpoint."""

from __future__ import annotations

from helpers import ack_floors, reader, wait_for

from spark_jetstream.streaming.offsets import committed_offset
from spark_jetstream.tools.monitoring import JetStreamLagListener


def test_lag_per_batch_counts_down_to_zero_and_the_checkpoint_matches_the_floors(
    spark, nats_server, api, make_stream, tmp_path
):
    stream = make_stream(2400, partitions=2)
    listener = JetStreamLagListener()
    spark.streams.addListener(listener)
    try:
        query = (
            reader(spark, nats_server.url, stream, maxMessagesPerTrigger=1000)
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .queryName("lagged")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        wait_for(  # listener events arrive asynchronously
            lambda: sum(b.rows for b in listener.batches if b.query == "lagged") >= 2400,
            10,
            "the listener to see the batches' 2400 rows",
        )
    finally:
        spark.streams.removeListener(listener)
    batches = sorted((b for b in listener.batches if b.query == "lagged" and b.rows), key=lambda b: b.batch_id)
    last = stream.last_seq
    assert [(b.rows, b.end_seq, b.latest_seq, b.lag) for b in batches] == [
        (1000, 1000, last, last - 1000),
        (1000, 2000, last, last - 2000),
        (400, 2400, last, 0),
    ]
    offset = committed_offset(tmp_path / "cp")
    assert (offset["seq"], offset["stream"]) == (last, stream.name) and offset["created"]
    assert set(ack_floors(api, stream).values()) == {last}


def test_no_checkpoint_yet_means_no_committed_offset(tmp_path):
    assert committed_offset(tmp_path) is None
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"seq":5,"stream":"S"}\n')
    assert committed_offset(tmp_path) is None  # planned, never committed
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    assert committed_offset(tmp_path) == {"seq": 5, "stream": "S"}
