"""The driver side of a streaming query: planning batches and committing them.

One ``Coordinator`` lives in the long-lived driver-side Python process of a query run. It plans
(limits -> the batch's end; partitions with data -> input partitions read with Direct Get, or
members -> pinned pulls, as ``readMode`` chose when the run started) and hands every ack to
``MemberConsumers.acknowledge``, the one place ack floors move: between batches each member's ack
floor equals the last offset in Spark's commit log. Ownership of the group is ``ownership.GroupClaim``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from spark_jetstream.client.connection import Connection, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import GroupConfigError, OptionError
from spark_jetstream.groups.layout import GroupLayout, reads_whole_stream
from spark_jetstream.groups.resolve import find_group_async, layout_of, resolve_layout
from spark_jetstream.read.direct import first_seqs, split, spread
from spark_jetstream.read.mode import DIRECT, PULL, choose_read_mode
from spark_jetstream.read.ranges import MemberRange, SeqRange, SmallBatch
from spark_jetstream.read.start import check_data_loss, start_after
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.faults import fault_point
from spark_jetstream.streaming.member_consumers import MemberConsumers, check_ack_policy
from spark_jetstream.streaming.offsets import Watermark
from spark_jetstream.streaming.ownership import GroupClaim, describe_this_process
from spark_jetstream.streaming.pins import PinKeeper
from spark_jetstream.streaming.planning import Limits, batch_end

log = logging.getLogger(__name__)

STREAM_INFO_INTERVAL = 0.1
"""Seconds between stream-info calls while Spark polls an idle stream (it asks every 10 ms)."""
FLOOR_WAIT = 0.5
"""Seconds a Direct Get query waits for its member consumers' floors before the next batch goes on without them."""
LAYOUT_WAIT = 1.0
"""Seconds planning waits for the group's config before the batch keeps the last batch's layout."""
ONE_TASK_MESSAGES = 4096
"""A Direct Get micro-batch of at most this many messages (and at most one record batch's bytes, estimated) is read
by one task (one ``>`` range on a stream that is all the group's, else a ``SmallBatch``): at 5,000 msg/s, 4 tasks
per batch made the batch cycle 1.38x a one-task source's and one task 1.00x (decisions 0016, 0017)."""


@dataclass(frozen=True)
class StreamState:
    """What ``latestOffset`` needs from stream info."""

    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    retention: str

    @property
    def average_size(self) -> float:
        return self.bytes / self.messages if self.messages else 1.0


class Coordinator:
    """Driver-side state of one query run over one group."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self._claim: GroupClaim | None = None  # close() works from here on, whatever fails below
        self.pins: PinKeeper | None = None
        self.conn: Connection = connect(config.connection)
        self.api = JetStreamApi(self.conn)
        self.source_stream = config.stream
        source_info = self.api.stream_info(config.stream)  # fails fast on a missing stream
        self._source_config = source_info["config"]
        self._state: StreamState | None = None
        self._state_at = 0.0
        self._available_now_cap: int | None = None
        self._last_batch_at = time.monotonic()
        self.owner = describe_this_process()
        layout = self.resolve_layout()
        self.stream = layout.stream  # the work stream of an elastic group
        self.members = MemberConsumers(
            self.api, layout, config.ack_wait, config.ack_policy, self.owner, config.priority_timeout
        )
        if self.stream == self.source_stream:  # the info just read (an elastic group reads its work stream)
            self._take_state(source_info)
        check_ack_policy(config.ack_policy, self.state().retention, layout)
        what = f"query on group {config.group!r}"
        self.direct = choose_read_mode(self.api, self.stream, self._stream_config, config.read_mode, what) == DIRECT
        if self.direct:
            self.pins = PinKeeper(self.members)  # nothing of the query pulls: it keeps the pins itself
        else:
            self._refuse_min_partitions()
            self._warn_crowded_members()
        # Claimed last, once nothing above can refuse the query: a refused query holds nothing.
        self._claim = GroupClaim(self.conn, self.source_stream, config.group, self.owner)
        self._claim.claim()

    @property
    def layout(self) -> GroupLayout:
        return self.members.layout

    def close(self) -> None:
        """Give up the pins and the claim on the group (safe on a half-built coordinator, and twice)."""
        if self.pins is not None:
            self.pins.stop()
        if self._claim is not None:
            self._claim.release()

    # -- stream --------------------------------------------------------------------------------

    def state(self, fresh: bool = False) -> StreamState:
        """Stream info, at most every ``STREAM_INFO_INTERVAL`` unless ``fresh``."""
        if fresh or self._state is None or time.monotonic() - self._state_at >= STREAM_INFO_INTERVAL:
            self._take_state(self.api.stream_info(self.stream))
        assert self._state is not None
        return self._state

    def _take_state(self, info: dict[str, Any]) -> None:
        """Keep the stream info ``info`` of the read stream, read just now."""
        state = info["state"]
        self._state = StreamState(
            first_seq=state["first_seq"],
            last_seq=state["last_seq"],
            messages=state["messages"],
            bytes=state["bytes"],
            retention=info["config"].get("retention", "limits"),
        )
        self._stream_config = info["config"]
        self.created = info.get("created", "")
        self._state_at = time.monotonic()

    # -- group ---------------------------------------------------------------------------------

    def resolve_layout(self) -> GroupLayout:
        """The group's layout (``groups.resolve``); an elastic group's work stream is made when missing."""
        return resolve_layout(
            self.api, self._source_config, self.config.group, self.config.members, create_work_stream=True
        )

    def _layout_now(self) -> GroupLayout:
        """The layout for the next batch: a membership change takes effect at this batch boundary. When the group's
        config cannot be read within ``LAYOUT_WAIT`` (without a config bucket, telling a missing bucket from an
        election needs the meta leader, and one killed takes 4-9 s to replace), the last batch's layout: the change
        then takes effect at a later boundary, and the query does not stall meanwhile."""
        config = self.config
        lookup = asyncio.wait_for(find_group_async(self.api, self._source_config["name"], config.group), LAYOUT_WAIT)
        try:
            found = self.conn.run(lookup)
        except TimeoutError:
            log.info("Group %r's config could not be read in %gs: keeping its layout", config.group, LAYOUT_WAIT)
            return self.layout
        return layout_of(self.api, self._source_config, config.group, config.members, found, create_work_stream=True)

    def _acknowledge(self, committed: Watermark, remade: bool = False) -> None:
        """Move the floors (``MemberConsumers.acknowledge``); fail first if another client is on a member consumer.

        On the Direct Get path the next batch waits at most ``FLOOR_WAIT`` for them: nothing of its reads needs
        a member consumer, and one whose leader is being elected (4-9 s after its server crashed) would hold up
        the query for the whole election. Pulls need their consumers: there the floors are always waited for.
        """
        if self.pins is not None:
            self.pins.raise_error()
        wait = FLOOR_WAIT if self.direct else None
        self.members.acknowledge(committed.seq, self.state().retention, remade, wait)
        if self.pins is not None:
            self.pins.start()  # the floors are set: a pin's taking delivery can be reset to them

    # -- planning ------------------------------------------------------------------------------

    def watermark(self, seq: int) -> Watermark:
        return Watermark(self.stream, seq, self.created)

    def initial(self) -> Watermark:
        """Where a new query starts (no checkpoint yet)."""
        fault_point("initial")  # a new query, nothing in its checkpoint yet
        state = self.state()  # read at most STREAM_INFO_INTERVAL ago: made with the coordinator, just now
        config = self.config
        return self.watermark(
            start_after(
                self.api,
                self.layout,
                self.stream,
                config.starting_position,
                config.starting_timestamp,
                state.first_seq,
                state.last_seq,
            )
        )

    def prepare_available_now(self) -> None:
        self._available_now_cap = self.state(fresh=True).last_seq

    def latest(self, start: Watermark, limits: Limits) -> Watermark:
        """The end of the next batch after ``start`` (``start`` itself: no batch now)."""
        if start.seq > 0:
            fault_point("latest")  # the sink committed the last batch; the source has not acked it yet
        self._acknowledge(start)  # `start` is in the commit log: the catch-up on an idle stream
        state = self.state()
        self._check_data_loss(start, state)
        now = time.monotonic()
        limits = Limits(
            limits.max_rows,
            limits.max_bytes,
            limits.min_rows,
            min_rows_waited_out=now - self._last_batch_at >= self.config.max_trigger_delay,
        )
        end = batch_end(start.seq, state.last_seq, limits, state.average_size, self._available_now_cap)
        if end > start.seq:
            self._last_batch_at = now
        return self.watermark(end)

    def _check_data_loss(self, start: Watermark, state: StreamState) -> None:
        check_data_loss(self.stream, start.seq, state.first_seq, state.last_seq, self.config.fail_on_data_loss)

    def plan(self, start: Watermark, end: Watermark) -> list[SeqRange] | list[SmallBatch] | list[MemberRange]:
        """The batch ``(start, end]``'s reads: one per filter subject with messages in it (Direct Get; a batch cut by
        seq, small or with ``minPartitions``, of a stream that is all the group's reads ``>``), or one per member
        (pulls); membership changes apply here.

        ``start`` is committed (Spark plans batch N after committing N-1), except in the empty
        range ``partitions(latest, latest)`` that Spark sends on a restart, whose end may belong to
        a batch that never finished: that call moves nothing.
        """
        if end.seq <= start.seq:
            return []
        layout = self._layout_now()
        if layout.stream != self.stream:
            raise GroupConfigError(
                f"Group {self.config.group!r} now reads stream {layout.stream!r} ({layout.kind}) instead of "
                f"{self.stream!r}: the checkpoint's offsets belong to the old stream. Start with a new checkpoint."
            )
        changed = layout != self.layout
        if changed and self.members.acked_through is not None:  # membership changes take effect at a batch boundary
            self.members.change_layout(layout, self.state().retention)
        else:  # unchanged, or a new run, whose first acknowledge makes the consumers
            self.members.layout = layout
        self._acknowledge(start, remade=changed)
        if self.pins is None:  # the pin keeper checks the member consumers every second and before floors move
            self.members.check_unchanged()
        state = self.state(fresh=True)
        self._check_data_loss(start, state)
        fault_point("plan")  # the batch is in the offset log; no task has read it
        layout = self.layout
        filters = layout.read_filters
        if self.direct:
            template = SeqRange(
                stream=self.stream,
                filter="",
                start=start.seq,
                end=end.seq,
                partitioned=layout.partitioned,
                include_headers=self.config.include_headers,
                direct_batch=self.config.direct_batch,
                direct_max_bytes=self.config.direct_max_bytes,
                record_batch_size=self.config.pull.record_batch_size,
                record_batch_bytes=self.config.pull.record_batch_bytes,
            )
            width = end.seq - start.seq
            small = width <= ONE_TASK_MESSAGES and width * state.average_size <= template.record_batch_bytes
            cut_by_seq = self.config.min_partitions is not None or small  # no task per partition: order is by seq
            if cut_by_seq and reads_whole_stream(self._stream_config, filters):
                filters = [">"]
            firsts = first_seqs(self.conn, self.stream, filters, start.seq, end.seq)
            if self.pins is not None:
                self.pins.settle(FLOOR_WAIT)
            ranges = split(template, firsts, filters, width)
            if self.config.min_partitions is not None:
                return spread(ranges, self.config.min_partitions)
            if small and len(ranges) > 1:
                return [SmallBatch(tuple(ranges))]
            return ranges
        return [
            MemberRange(
                stream=self.stream,
                consumer=layout.consumer(member),
                start=start.seq,
                end=end.seq,
                partitioned=layout.partitioned,
                include_headers=self.config.include_headers,
            )
            for member in layout.member_names
        ]

    def _refuse_min_partitions(self) -> None:
        """A member consumer is read by one task at a time (its pin fences the others): a pulled batch cannot be cut."""
        if self.config.min_partitions is None:
            return
        why = "readMode=pull" if self.config.read_mode == PULL else "Direct Get is off or denied to the NATS user"
        raise OptionError(
            f"minPartitions cannot apply to this query: {why}, so each member consumer of group "
            f"{self.config.group!r} is one Spark partition, read by one task at a time. Remove minPartitions, or "
            f"read with Direct Get (readMode=auto or direct; `nats stream edit {self.stream} --allow-direct`)."
        )

    def _warn_crowded_members(self) -> None:
        """Pulling from a member consumer with several filter subjects is ~6x slower than from one
        (measured on nats-server 2.15.1): say so once per query, with the fix."""
        layout = self.layout
        counts = [(member, len(layout.filter_subjects(member))) for member in layout.member_names]
        crowded = [(member, count) for member, count in counts if count > 1]
        if crowded:
            member, count = crowded[0]
            log.warning(
                "Group %r is read by pulling from its member consumers, and member %r (%d partitions%s) reads several "
                "times slower than a member with one partition. Direct Get (readMode=auto or direct, on a stream with "
                "`allow_direct`: `nats stream edit %s --allow-direct`) reads every partition in parallel.",
                layout.group,
                member,
                count,
                f", and {len(crowded) - 1} more members alike" if len(crowded) > 1 else "",
                self.stream,
            )

    def commit(self, end: Watermark) -> None:
        """Spark committed the batch ending at ``end``: the ack on commit."""
        self._acknowledge(end)
