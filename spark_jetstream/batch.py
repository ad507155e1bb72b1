"""Bounded batch reads: ``spark.read.format("jetstream")`` over a seq range of a stream.

The range ``(start, end]`` is fixed when Spark plans the query (default: the whole stream as it
is then). It is read with Direct Get batches (``$JS.API.DIRECT.GET.<stream>`` with ``seq``,
``next_by_subj`` and ``batch``): a read-only API that creates no consumer, so the group's member
consumers (their ack floors, pins and pending counts) are never touched, nothing is acked, and a
crashed executor leaves nothing behind on the server. It needs ``allow_direct: true`` on the
stream.

Parallelism: one Spark partition per partition filter (``<p>.>``, or the group's member filters)
and per ``maxRangePerPartition`` stream sequences. A request never asks for more messages than
its remaining seq width, so it cannot run far past the range's end. Any replica may answer a
Direct Get, so a read that seems complete is confirmed with one ``STREAM.MSG.GET`` on the leader.
Rows have the streaming source's schema (``rows.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from .connection import Connection, ConnectionOptions, connect
from .errors import ApiError, OptionError, ReaderError
from .groups import transform_partitions
from .jsapi import NO_MESSAGE_FOUND, JetStreamApi
from .options import BATCH, config_values, default_of, parse_options
from .protocol import STATUS_PREFIX, status_line
from .resolve import check_data_loss, resolve_layout, seq_at, start_after
from .rows import RowBuffer
from .spark_compat import DataSourceReader, InputPartition

log = logging.getLogger(__name__)

_DIRECT_HEADERS = b"\r\nNats-Stream: "  # the server appends its headers after the message's own
_LAGGING_RETRIES = 50


@dataclass(frozen=True)
class BatchConfig:
    """Everything ``spark.read.format("jetstream")`` was told. Picklable; secrets stay out of repr.

    Field defaults and the option each field comes from are in ``options.OPTIONS``.
    """

    connection: ConnectionOptions
    stream: str
    group: str | None = None
    members: int | None = None
    starting_position: str | int | None = None
    starting_timestamp: datetime | None = None
    ending_position: str | int = default_of("endingPosition")
    ending_timestamp: datetime | None = None
    fail_on_data_loss: bool = default_of("failOnDataLoss")
    include_headers: bool = default_of("includeHeaders")
    max_range: int = default_of("maxRangePerPartition")
    direct_batch: int = default_of("directGetBatch")
    record_batch_size: int = default_of("recordBatchSize")

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> BatchConfig:
        values = parse_options(raw, BATCH)
        if values["startingPosition"] == "group" and not values["group"]:
            raise OptionError("startingPosition=group needs the group option: whose ack floor would it start at?")
        return cls(connection=ConnectionOptions.from_options(values), **config_values(cls, values))


@dataclass(frozen=True)
class SeqRange:
    """One Spark partition of a batch read: messages matching ``filter`` with ``start < seq <= end``."""

    stream: str
    filter: str
    start: int
    end: int
    partitioned: bool
    include_headers: bool = False
    direct_batch: int = default_of("directGetBatch")
    record_batch_size: int = default_of("recordBatchSize")


class RangePartition(InputPartition):
    def __init__(self, seq_range: SeqRange) -> None:
        super().__init__(seq_range)
        self.range = seq_range


class JetStreamBatchReader(DataSourceReader):
    """Plans the ranges on the driver; executors read them with Direct Get."""

    def __init__(self, config: BatchConfig) -> None:
        self.config = config

    def partitions(self) -> list[InputPartition]:
        return [RangePartition(r) for r in plan(connect(self.config.connection), self.config)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # an empty plan: Spark still runs one task, with a placeholder partition
        yield from read_range(connect(self.config.connection), partition.range)


# -- planning (driver) ---------------------------------------------------------------------------


def _partitions_of(stream_config: dict[str, Any]) -> int | None:
    """N when the stored subjects start with a partition number: the stream's own transform, or the
    transforms through which it sources (an elastic group's work stream)."""
    own = transform_partitions(stream_config)
    if own is not None:
        return own
    counts = {
        transform_partitions({"subject_transform": transform})
        for source in stream_config.get("sources") or []
        for transform in source.get("subject_transforms") or []
    }
    return counts.pop() if len(counts) == 1 and None not in counts else None


def plan(conn: Connection, config: BatchConfig) -> list[SeqRange]:
    """The ranges to read, fixed now: ``(start, end]`` split per filter subject and seq width."""
    api = JetStreamApi(conn)
    source = api.stream_info(config.stream)
    layout = resolve_layout(api, source["config"], config.group, config.members) if config.group else None
    stream = layout.stream if layout else config.stream
    info = api.stream_info(stream) if stream != config.stream else source
    if not info["config"].get("allow_direct"):
        raise ReaderError(
            f"Stream {stream!r} does not allow Direct Get, which batch reads use (they never touch consumers): "
            f"enable it with `nats stream edit {stream} --allow-direct`."
        )
    first_seq, last_seq = info["state"]["first_seq"], info["state"]["last_seq"]
    start = start_after(
        api, layout, stream, config.starting_position or "earliest", config.starting_timestamp, first_seq, last_seq
    )
    check_data_loss(stream, start, first_seq, last_seq, config.fail_on_data_loss)
    start = max(start, first_seq - 1)
    if config.ending_timestamp is not None:
        end = seq_at(api, stream, config.ending_timestamp, last_seq) - 1
    elif config.ending_position == "latest":
        end = last_seq
    else:
        end = min(int(config.ending_position), last_seq)
    if end <= start:
        return []
    if layout is not None:
        partitioned = layout.partitioned
        filters = [f for member in layout.members for f in member.filter_subjects] or [">"]
    else:
        count = _partitions_of(info["config"])
        partitioned = count is not None
        filters = [f"{p}.>" for p in range(count)] if count is not None else [">"]
    ranges = []
    for subject in filters:
        found = api.direct_get(stream, {"seq": start + 1, "next_by_subj": subject})
        if found is None or found.seq > end:
            continue  # nothing of this filter in range: no empty task
        for low in range(found.seq - 1, end, config.max_range):
            ranges.append(
                SeqRange(
                    stream=stream,
                    filter=subject,
                    start=low,
                    end=min(low + config.max_range, end),
                    partitioned=partitioned,
                    include_headers=config.include_headers,
                    direct_batch=config.direct_batch,
                    record_batch_size=config.record_batch_size,
                )
            )
    log.info("Batch read of %s seqs (%d, %d]: %d partitions", stream, start, end, len(ranges))
    return ranges


# -- reading (executors) -------------------------------------------------------------------------


def read_range(conn: Connection, seq_range: SeqRange) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``seq_range`` in seq order, as record batches of the source's schema."""
    reader = _DirectReader(conn, seq_range)
    try:
        conn.run(reader.open())
        while (rows := conn.run(reader.next_rows())) is not None:
            stamps = pa.array(rows.times, pa.binary()).cast(pa.string()).cast(pa.timestamp("ns", tz="UTC"))
            rows.times = stamps  # type: ignore[assignment]  # RowBuffer takes any array of ns timestamps
            yield rows.to_record_batch(seq_range.stream, seq_range.partitioned, seq_range.include_headers)
    finally:
        conn.run(reader.close(), timeout=10)


class _DirectReader:
    """Sequential Direct Get batches for one range; every method runs on the connection's loop thread."""

    def __init__(self, conn: Connection, seq_range: SeqRange) -> None:
        self.conn = conn
        self.api = JetStreamApi(conn)
        self.range = seq_range
        self.subject = self.api.subject("DIRECT", "GET", seq_range.stream)
        self.last = seq_range.start  # highest seq read
        self.rows = RowBuffer()
        self.inbox = ""
        self.sid: int | None = None
        self.batch_done = asyncio.Event()
        self.received = 0  # messages in the current batch
        self.pending: int | None = None  # matching messages after the last one, as the replica saw it
        self.error: str | None = None
        self.done = False

    async def open(self) -> None:
        self.inbox, self.sid = await self.conn.subscribe_raw(self._on_message)

    async def close(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            await self.conn.unsubscribe_raw(sid)

    async def next_rows(self) -> RowBuffer | None:
        """The next record batch's worth of rows, or None once the range is read."""
        lagging = 0
        while not self.done and len(self.rows) < self.range.record_batch_size:
            await self._batch()
            if self.done or (self.received and self.pending != 0):
                continue
            # The replica that answered has nothing more: make sure the leader agrees.
            if await self._leader_has_more():
                lagging += 1
                if lagging > _LAGGING_RETRIES:
                    raise ReaderError(
                        f"The replicas answering Direct Get on stream {self.range.stream!r} stay behind its leader "
                        f"(seq {self.last} read, the leader has more up to {self.range.end}): retry later."
                    )
                await asyncio.sleep(0.1)
            else:
                self.done = True
        if not self.rows:
            return None
        rows, self.rows = self.rows, RowBuffer()
        return rows

    async def _batch(self) -> None:
        wanted = min(self.range.direct_batch, self.range.end - self.last)
        request = {"seq": self.last + 1, "next_by_subj": self.range.filter, "batch": wanted}
        self.received, self.pending, self.error = 0, None, None
        self.batch_done.clear()
        await self.conn.client.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
        try:
            await asyncio.wait_for(self.batch_done.wait(), self.conn.api_timeout)
        except TimeoutError:
            raise ReaderError(
                f"Direct Get on stream {self.range.stream!r} got no answer within {self.conn.api_timeout:g}s: is "
                "the stream available?"
            ) from None
        if self.error is not None:
            raise ReaderError(self.error)
        if self.last >= self.range.end:
            self.done = True

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Raw handler of the Direct Get inbox (loop thread, once per message: keep it lean)."""
        if headers is None:
            return
        if headers.startswith(STATUS_PREFIX):
            code = headers[len(STATUS_PREFIX) : len(STATUS_PREFIX) + 3]
            if code not in (b"204", b"404"):  # 204: end of batch; 404: nothing (more) matches
                self.error = f"Direct Get on stream {self.range.stream!r} failed: {status_line(headers)}."
            self.batch_done.set()
            return
        cut = headers.rfind(_DIRECT_HEADERS)
        fields = dict(line.split(b": ", 1) for line in headers[cut + 2 : -4].split(b"\r\n"))
        seq = int(fields[b"Nats-Sequence"])
        if seq <= self.last:
            return
        if seq > self.range.end:  # past the range: this filter has nothing more in it
            self.done = True
            return
        self.received += 1
        self.pending = int(fields.get(b"Nats-Num-Pending", b"-1"))
        rows = self.rows
        rows.subjects.append(fields[b"Nats-Subject"])
        rows.data.append(data)
        rows.seqs.append(seq)
        rows.times.append(fields[b"Nats-Time-Stamp"])  # type: ignore[arg-type]  # RFC 3339, parsed per batch
        if self.range.include_headers:
            rows.headers.append(headers[:cut] + b"\r\n\r\n")
        self.last = seq

    async def _leader_has_more(self) -> bool:
        """Whether the stream leader holds a matching message in ``(last, end]`` (read-after-write)."""
        body = {"seq": self.last + 1, "next_by_subj": self.range.filter}
        try:
            reply = await self.api.call_async(
                ("STREAM", "MSG", "GET", self.range.stream), body, f"Reading {self.range.filter}", self.range.stream
            )
        except ApiError as exc:
            if exc.err_code == NO_MESSAGE_FOUND:
                return False
            raise
        return reply["message"]["seq"] <= self.range.end
