"""Deliveries -> rows: the pinned pull reader's hot path, on the connection's loop thread.

``protocol.deliveries_handler`` parses runs of a member consumer's deliveries straight from the read buffer into the
rows' columns; ``Deliveries._deliver`` decides what the run means (redeliveries, the pin id, the range complete) and
keeps what is read. Keep per-message work out of both (decisions 0011 and 0033).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_jetstream.client.protocol import PIN_HEADER, BulkHandler, Columns, deliveries_handler, header_value
from spark_jetstream.read.rows import RowBatches, RowBuffer

if TYPE_CHECKING:
    from spark_jetstream.read.ranges import MemberRange
    from spark_jetstream.streaming.config import PullSettings


class Deliveries:
    """Deliveries -> rows, on the connection's loop thread: the reader's hot path.

    A bulk handler parses consecutive deliveries straight from the read buffer in one tight loop
    and only appends to the columns' buffers; full buffers wait in ``ready`` for the caller's thread.
    It keeps what every delivery decides: the last seq handed out (anything at or below is a
    redelivery), the pin id, and whether the range is complete.
    """

    def __init__(
        self, member: MemberRange, settings: PullSettings, wakeup: asyncio.Event, on_run: Callable[[int], None]
    ) -> None:
        self.member = member
        self.settings = settings
        self.wakeup = wakeup  # set when rows are ready or the range is complete
        self.on_run = on_run  # after each run of deliveries, with their count (none once the range is done)
        self.last_seq = member.start
        self.pin_id: str | None = None
        self.batches = RowBatches(settings.record_batch_size, settings.record_batch_bytes, member.include_headers)
        self.done = False
        self.drained = False  # the consumer counted nothing more pending before the range's end (the reader confirms)
        self.received = 0  # messages and statuses that arrived (counted, not timed: the hot path stays lean)

    @property
    def ready(self) -> deque[RowBuffer]:
        return self.batches.ready

    def finish(self) -> None:
        self.done = True
        self.batches.flush()
        self.wakeup.set()

    def handler(self, sid: int) -> BulkHandler:
        """Bulk handler of the pull inbox (``protocol.deliveries_handler``): deliveries straight into the rows."""
        return deliveries_handler(sid, self.batches, self._deliver)

    def _deliver(self, rows: Columns, first: int, header: bytes | None, drained: int) -> None:
        """A run of deliveries appended to the rows from ``first`` on: anything at or below the last seq handed out is
        a redelivery; one past the range's end, or the last one, completes the range; after one that the consumer
        counted nothing more pending after, the reader asks the stream leader (``drained``)."""
        count = len(rows.seqs) - first
        self.received += count
        if self.pin_id is None and header is not None:
            self.pin_id = header_value(header, PIN_HEADER)
        batches = self.batches
        if self.done:
            batches.keep(first, first, first)  # none: the range is complete
            return
        kept = batches.keep_in_order(first, self.last_seq, self.member.end, first + drained + 1)  # none after drained
        self.last_seq = kept.last
        if batches.ready:
            self.wakeup.set()
        if kept.past_end or self.last_seq >= self.member.end:
            self.finish()
        elif drained < count:
            self.drained = True
            self.wakeup.set()
        self.on_run(count)
