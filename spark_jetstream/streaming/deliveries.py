"""Deliveries -> rows: the pinned pull reader's hot path, on the connection's loop thread.

``protocol.deliveries_handler`` parses runs of a member consumer's deliveries straight from the read buffer;
``Deliveries._deliver`` decides what each one means (a redelivery, the pin id, the range complete) and appends it
to the rows. Keep per-message work out of both (decision 0011).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_jetstream.client.protocol import PIN_HEADER, BulkHandler, deliveries_handler, header_value
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
        return deliveries_handler(sid, self._deliver, self.batches.keep_headers)

    def _deliver(
        self,
        subjects: list[bytes],
        payloads: list[memoryview],
        seqs: list[int],
        stamps: list[int],
        headers: list[memoryview | None],
        drained: int,
    ) -> None:
        """A run of deliveries: anything at or below the last seq handed out is a redelivery; one past the range's
        end, the last one, or one after which nothing more matches completes the range."""
        self.received += len(seqs)
        if self.pin_id is None and (block := next((b for b in headers if b is not None), None)) is not None:
            self.pin_id = header_value(bytes(block), PIN_HEADER)
        if self.done:
            return
        batches = self.batches
        self.last_seq, past_end = batches.extend_in_order(  # none after the drained one is read
            subjects, payloads, seqs[: drained + 1], stamps, headers, self.last_seq, self.member.end
        )
        if batches.ready:
            self.wakeup.set()
        if past_end or self.last_seq >= self.member.end or drained < len(seqs):
            self.finish()
        self.on_run(len(seqs))
