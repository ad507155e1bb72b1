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


def test_the_lag_of_a_batch_where_spark_reports_its_end_as_the_latest_offset():
    """PySpark 4.0 and 4.1 report the batch's end as the source's latest offset: the end offset's ``last`` (the
    stream's last seq when the batch was planned) gives the lag there; 4.2+ reports the stream's end itself."""
    from types import SimpleNamespace

    from spark_jetstream.tools.monitoring import batch_progress

    def progress(end: str, latest: str | None) -> SimpleNamespace:
        source = SimpleNamespace(endOffset=end, latestOffset=latest)
        return SimpleNamespace(
            sources=[source], timestamp="2026-12-06T10:00:00.000Z", name="q", id="i", batchId=3, numInputRows=1000,
            inputRowsPerSecond=1.0, processedRowsPerSecond=2.0, durationMs={"triggerExecution": 5},
        )  # fmt: skip

    end = '{"created":"c","cut":{"tasks":[[">"]]},"last":9000,"seq":3000,"stream":"S"}'
    assert batch_progress(progress(end, end)).lag == 6000  # 4.0/4.1: latest == end
    assert batch_progress(progress(end, '{"seq":9500,"stream":"S"}')).lag == 6500  # 4.2+: reported after planning
    assert batch_progress(progress('{"seq":3000,"stream":"S"}', '{"seq":3000,"stream":"S"}')).lag == 0  # no batch
    as_python = str({"last": 9000, "seq": 3000, "stream": "S"})  # query.recentProgress holds offsets so
    assert batch_progress(progress(as_python, as_python)).lag == 6000
