"""What a task of a range read runs, streaming or batch: each ``SeqRange`` read with Direct Get or through an
ephemeral consumer of its own, as its ``read_mode`` says (a bucket's range as the bucket's rows; a bucket's latest
values through a ``last_per_subject`` consumer, ``read.kv_latest``), and a ``SmallBatch``'s ranges one after the
other."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from spark_jetstream.client.connection import Connection
from spark_jetstream.read.consumer import read_by_consumer
from spark_jetstream.read.direct import read_range
from spark_jetstream.read.kv import kv_rows
from spark_jetstream.read.kv_latest import LAST_PER_KEY, read_latest
from spark_jetstream.read.mode import PULL
from spark_jetstream.read.ranges import SeqRange, SmallBatch
from spark_jetstream.worker_heap import settle


def read_ranges(conn: Connection, task: SeqRange | SmallBatch) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``task``'s ranges, each in seq order, as record batches of the source's schema."""
    settle()
    for seq_range in task.ranges if isinstance(task, SmallBatch) else (task,):
        if seq_range.read_mode == LAST_PER_KEY:
            batches = read_latest(conn, seq_range)
        else:
            batches = (read_by_consumer if seq_range.read_mode == PULL else read_range)(conn, seq_range)
        yield from batches if seq_range.kv is None else kv_rows(conn, batches, seq_range.kv)
