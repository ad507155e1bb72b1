"""Bounded batch reads: ``spark.read.format("jetstream")`` over a seq range of a stream.

The range ``(start, end]`` is fixed when Spark plans the query (default: the whole stream as it
is then). Tasks read it with Direct Get (``read.direct``), like a streaming batch, or, on a stream
without Direct Get (``readMode``, ``read.mode``), each through an ephemeral consumer of its own that
it deletes when done (``read.consumer``). Either way the group's member consumers (their ack floors,
pins and pending counts) are never touched, nothing is acked, and a crashed executor leaves nothing
behind for long.

Parallelism: one Spark partition per filter subject of the read's scope (``read.scope``: ``<p>.>``, the group's
member filters, or those of option ``subjects``) and per ``maxRangePerPartition`` stream sequences, cut further for
``minPartitions``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from spark_jetstream.client.connection import Connection, ConnectionOptions, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import surfaced
from spark_jetstream.groups.layout import reads_whole_stream
from spark_jetstream.groups.resolve import resolve_layout
from spark_jetstream.options import BATCH, config_values, connection_options, default_of, parse_options
from spark_jetstream.read.consumer import check_consumer_reads
from spark_jetstream.read.direct import first_seqs, split, spread
from spark_jetstream.read.kv import KvView, bucket_read, table_view
from spark_jetstream.read.kv_latest import latest_ranges
from spark_jetstream.read.mode import DIRECT, PULL, choose_read_mode
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.read.scope import group_scope, stream_scope
from spark_jetstream.read.start import check_data_loss, seq_at, start_after, warn_skipped
from spark_jetstream.read.tasks import read_ranges
from spark_jetstream.spark_compat import DataSourceReader, InputPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchConfig:
    """Everything ``spark.read.format("jetstream")`` was told. Picklable; secrets stay out of repr.

    Field defaults and the option each field comes from are in ``options.OPTIONS``.
    """

    connection: ConnectionOptions
    stream: str
    group: str | None = None
    subjects: tuple[str, ...] | None = None
    members: int | None = None
    starting_position: str | int | None = None
    starting_timestamp: datetime | None = None
    ending_position: str | int = default_of("endingPosition")
    ending_timestamp: datetime | None = None
    fail_on_data_loss: bool = default_of("failOnDataLoss")
    include_headers: bool = default_of("includeHeaders")
    max_range: int = default_of("maxRangePerPartition")
    min_partitions: int | None = None
    read_mode: str = default_of("readMode")
    batch: int = default_of("pullBatchSize")
    max_bytes: int = default_of("pullMaxBytes")
    direct_batch: int = default_of("directGetBatch")
    direct_max_bytes: int = default_of("directGetMaxBytes")
    record_batch_size: int = default_of("recordBatchSize")
    record_batch_bytes: int = default_of("recordBatchBytes")
    bucket: str | None = None
    keys: tuple[str, ...] | None = None
    include_history: bool = default_of("includeHistory")

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> BatchConfig:
        values = bucket_read(parse_options(raw, BATCH))
        return cls(connection=connection_options(values), **config_values(cls, values))


@surfaced
class JetStreamBatchReader(DataSourceReader):
    """Plans the ranges on the driver; executors read them as ``SeqRange.read_mode`` says: Direct Get or a consumer."""

    def __init__(self, config: BatchConfig) -> None:
        self.config = config

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(r) for r in plan(connect(self.config.connection), self.config)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        seq_range = getattr(partition, "value", None)
        if not isinstance(seq_range, SeqRange):
            return  # an empty plan: Spark still runs one task, with a placeholder partition
        yield from read_ranges(connect(self.config.connection), seq_range)


# -- planning (driver) ---------------------------------------------------------------------------


def kv_view(conn: Connection, config: BatchConfig, stream_config: dict[str, Any], end: int) -> KvView | None:
    """A bucket's table read keeps each live key's latest revision up to ``end``; with ``includeHistory`` every
    revision."""
    if config.bucket is None:
        return None
    return KvView(config.bucket) if config.include_history else table_view(conn, config.bucket, stream_config, end)


def plan(conn: Connection, config: BatchConfig) -> list[SeqRange]:
    """The ranges to read, fixed now: ``(start, end]`` split per filter subject and seq width."""
    api = JetStreamApi(conn)
    source = api.stream_info(config.stream)
    layout = resolve_layout(api, source["config"], config.group, config.members) if config.group else None
    scope = group_scope(layout) if layout else stream_scope(source["config"], config.subjects)
    stream = scope.stream
    info = api.stream_info(stream) if stream != config.stream else source
    read_mode = choose_read_mode(api, stream, info["config"], config.read_mode, "batch read")
    if read_mode == PULL:
        check_consumer_reads(stream, info["config"])
    first_seq, last_seq = info["state"]["first_seq"], info["state"]["last_seq"]
    start = start_after(
        api, layout, stream, config.starting_position or "earliest", config.starting_timestamp, first_seq, last_seq
    )
    if (after := check_data_loss(stream, start, first_seq, last_seq, config.fail_on_data_loss)) > start:
        warn_skipped(stream, start, after)
    start = max(after, first_seq - 1)
    if config.ending_timestamp is not None:
        end = seq_at(api, stream, config.ending_timestamp, last_seq) - 1
    elif config.ending_position == "latest":
        end = last_seq
    else:
        end = min(int(config.ending_position), last_seq)
    if end <= start:
        return []
    filters = list(scope.filters)
    template = SeqRange(
        stream=stream,
        filter="",
        start=start,
        end=end,
        partitioned=scope.partitioned,
        include_headers=config.include_headers,
        direct_batch=config.direct_batch,
        direct_max_bytes=config.direct_max_bytes,
        record_batch_size=config.record_batch_size,
        record_batch_bytes=config.record_batch_bytes,
        read_mode=read_mode,
        pull_batch=config.batch,
        pull_max_bytes=config.max_bytes,
        kv=kv_view(conn, config, info["config"], end),
    )
    if reads_whole_stream(info["config"], filters):
        filters = [">"]  # every message is the read's: one filter, a third of the server's CPU (decision 0017)
    firsts = first_seqs(conn, stream, filters, start, end, leader=read_mode != DIRECT)
    if template.kv is not None and template.kv.per_key:
        ranges = latest_ranges(template, firsts, filters)  # a consumer per key filter (read.kv_latest)
    else:
        ranges = spread(split(template, firsts, filters, config.max_range), config.min_partitions)
    log.info("Batch read of %s seqs (%d, %d] (%s): %d partitions", stream, start, end, read_mode, len(ranges))
    return ranges
