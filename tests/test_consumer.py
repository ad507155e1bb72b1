"""The consumer path of batch reads (``read/consumer.py``) against a real nats-server: exact ranges through an
ephemeral consumer per range, nothing left behind however the read ends, and a consumer that vanishes mid-read."""

from __future__ import annotations

import logging
import random
import time

import pyarrow as pa
import pytest

from spark_jetstream.read.consumer import read_by_consumer
from spark_jetstream.read.mode import PULL
from spark_jetstream.read.ranges import SeqRange

pytestmark = pytest.mark.slow


def pull_range(stream, subject: str, start: int, end: int, **settings: int) -> SeqRange:
    small = {"record_batch_size": 70, "pull_batch": 50} | settings
    return SeqRange(stream.name, subject, start, end, partitioned=True, read_mode=PULL, **small)


def read_all(conn, seq_range: SeqRange) -> pa.Table:
    batches = list(read_by_consumer(conn, seq_range))
    return pa.Table.from_batches(batches) if batches else pa.table({"seq": pa.array([], pa.int64())})


def read_consumers(api, stream) -> list[str]:
    """The stream's consumers that are not the group's member consumers: the reads' own."""
    members = {stream.consumer(p) for p in range(stream.partitions)}
    return [name for name in api.consumer_names(stream.name) if name not in members]


def test_each_partition_filter_reads_exactly_its_messages_in_any_range(conn, api, make_stream):
    stream = make_stream(3000, partitions=3, headers=True, direct=False)
    rng = random.Random(5)
    ranges = [(0, stream.last_seq), (0, 1), (stream.last_seq - 1, stream.last_seq)]
    ranges += [tuple(sorted(rng.sample(range(stream.last_seq + 1), 2))) for _ in range(5)]
    for start, end in ranges:
        for p in range(3):
            table = read_all(conn, pull_range(stream, f"{p}.>", start, end, include_headers=True))
            assert table.column("seq").to_pylist() == stream.expected(p, start, end), (p, start, end)
            for row in table.to_pylist():
                subject, payload, headers, partition = stream.messages[row["seq"]]
                assert (row["subject"], row["data"], row["partition"], row["stream"]) == (
                    subject,
                    payload,
                    partition,
                    stream.name,
                )
                assert dict(row["headers"]) == {k: [v] for k, v in headers.items()}
                assert row["timestamp"].tzinfo is not None
    whole = read_all(conn, pull_range(stream, ">", 100, 2500))
    assert whole.column("seq").to_pylist() == list(range(101, 2501))
    assert read_consumers(api, stream) == []


def test_a_range_ending_before_the_stream_does_stops_at_once(conn, make_stream):
    stream = make_stream(2000, partitions=2, direct=False)
    started = time.monotonic()
    for p in range(2):
        table = read_all(conn, pull_range(stream, f"{p}.>", 500, 800))
        assert table.column("seq").to_pylist() == stream.expected(p, 500, 800)
    assert read_all(conn, pull_range(stream, "0.>", 2000, 2000)).num_rows == 0
    assert time.monotonic() - started < 2  # no pull waited out its expiry


def test_removed_messages_inside_and_at_the_end_of_a_range_are_skipped(conn, api, make_stream):
    stream = make_stream(600, partitions=1, direct=False)
    removed = {10, 11, 300, 598, 599, 600}
    for seq in removed:
        api.call(("STREAM", "MSG", "DELETE", stream.name), {"seq": seq, "no_erase": True}, "Deleting")
    table = read_all(conn, pull_range(stream, "0.>", 0, 600))
    assert table.column("seq").to_pylist() == [seq for seq in range(1, 601) if seq not in removed]


def test_an_abandoned_read_deletes_its_consumer(conn, api, make_stream):
    stream = make_stream(3000, partitions=1, direct=False)
    partial = read_by_consumer(conn, pull_range(stream, "0.>", 0, stream.last_seq))
    assert next(partial).num_rows == 70
    assert len(read_consumers(api, stream)) == 1
    partial.close()  # Spark stops reading (a limit), or the task fails: the generator's finally runs
    assert read_consumers(api, stream) == []


def test_a_consumer_removed_mid_read_is_made_again_and_the_read_stays_exact(conn, api, make_stream, caplog):
    """What the server does to a consumer without pulls for ``inactive_threshold`` (Spark kept the task busy), or
    to one whose server restarted."""
    caplog.set_level(logging.INFO, "spark_jetstream.read.consumer")
    stream = make_stream(3000, partitions=1, direct=False)
    reader = read_by_consumer(conn, pull_range(stream, "0.>", 0, stream.last_seq))
    seqs = next(reader).column("seq").to_pylist()
    (first,) = read_consumers(api, stream)
    api.delete_consumer(stream.name, first)
    for batch in reader:
        seqs += batch.column("seq").to_pylist()
    assert seqs == list(range(1, 3001))
    assert read_consumers(api, stream) == []
    assert "with a new consumer" in caplog.text
