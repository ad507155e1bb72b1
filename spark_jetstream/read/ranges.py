"""What one Spark task reads: a seq range of a filter subject (Direct Get or an ephemeral consumer), or a member
consumer's range (the pinned pull reader). Plain picklable values: the planner makes them, the tasks read them."""

from __future__ import annotations

from dataclasses import dataclass

from spark_jetstream.client.jsapi import PRIORITY_GROUP
from spark_jetstream.options import default_of
from spark_jetstream.read.kv import KvView
from spark_jetstream.read.mode import DIRECT


@dataclass(frozen=True)
class SeqRange:
    """One Spark partition's read: the messages matching ``filter`` with ``start < seq <= end``, read with Direct Get
    (``read_range``) or, with ``read_mode`` ``pull``, through an ephemeral consumer (``read.consumer``)."""

    stream: str
    filter: str
    start: int
    end: int
    partitioned: bool
    include_headers: bool = False
    direct_batch: int = default_of("directGetBatch")
    direct_max_bytes: int = default_of("directGetMaxBytes")
    record_batch_size: int = default_of("recordBatchSize")
    record_batch_bytes: int = default_of("recordBatchBytes")
    read_mode: str = DIRECT
    pull_batch: int = default_of("pullBatchSize")
    pull_max_bytes: int = default_of("pullMaxBytes")
    kv: KvView | None = None  # a KV bucket's range: its rows are the bucket's (``read.kv``)


@dataclass(frozen=True)
class MemberRange:
    """One member consumer and the watermark range ``(start, end]`` to read from it."""

    stream: str
    consumer: str
    start: int
    end: int
    partitioned: bool = True
    include_headers: bool = False
    priority_group: str = PRIORITY_GROUP


@dataclass(frozen=True)
class SmallBatch:
    """A micro-batch small enough that one task reads its ranges, one after the other: a task's fixed cost
    (scheduling, a Python worker's round trip, an Arrow stream) is more than reading a few thousand messages."""

    ranges: tuple[SeqRange, ...]
