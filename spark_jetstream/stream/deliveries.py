"""Deliveries -> rows: the pull reader's hot path, on the connection's loop thread.

A bulk handler (``protocol``) parses runs of a member consumer's deliveries straight from the
read buffer and only appends bytes to column lists; measured at 2.9 us per delivery here (one
parser pass plus a handler call per message cost 4.5 us). Keep per-message work out of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_jetstream.client.protocol import PIN_HEADER, BulkHandler, header_value
from spark_jetstream.read.rows import RowBatches, RowBuffer

if TYPE_CHECKING:
    from spark_jetstream.read.ranges import MemberRange
    from spark_jetstream.stream.config import PullSettings

_ACK_PREFIX = b"$JS.ACK."
_VERBS = (b"MSG", b"HMSG")  # a delivery's protocol line without and with headers


class Deliveries:
    """Deliveries -> rows, on the connection's loop thread: the reader's hot path.

    A bulk handler parses consecutive deliveries straight from the read buffer in one tight loop
    and only appends bytes to column lists; full buffers wait in ``ready`` for the caller's thread.
    It keeps what every delivery decides: the last seq handed out (anything at or below is a
    redelivery), the pin id, and whether the range is complete.
    """

    def __init__(
        self, member: MemberRange, settings: PullSettings, wakeup: asyncio.Event, on_run: Callable[[int], None]
    ) -> None:
        self.member = member
        self.settings = settings
        self.wakeup = wakeup  # set when rows are ready or the range is complete
        self.on_run = on_run  # called once per run of deliveries with their count
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
        """Bulk handler of the pull inbox: parses consecutive deliveries straight from the read buffer.

        One tight loop per buffer, not a parser pass plus a handler call per message. It stops at
        anything that is not a delivery (a status goes to the per-message handler) and at a message
        not yet complete.
        """
        own = b"%d" % sid

        def take(buf: bytearray, view: memoryview, pos: int) -> int:
            end_seq, batches = self.member.end, self.batches
            taken = 0
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                # HMSG <subject> <sid> <reply> <header size> <size> / MSG <subject> <sid> <reply> <size>
                args = bytes(view[pos:eol]).split()
                headed = len(args) == 6
                if (len(args) != 5 and not headed) or args[0] != _VERBS[headed] or args[2] != own:
                    break
                if not args[3].startswith(_ACK_PREFIX):
                    break
                try:
                    header_size, size = (int(args[4]), int(args[5])) if headed else (0, int(args[4]))
                except ValueError:
                    break  # malformed: the parser reports it
                start = eol + 2
                end = start + size
                if end + 2 > len(buf) or not 0 <= header_size <= size:
                    break
                pos = end + 2
                taken += 1
                if self.pin_id is None and header_size:
                    self.pin_id = header_value(bytes(view[start : start + header_size]), PIN_HEADER)
                if self.done:
                    continue
                # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>, or the 11+
                # token form with domain and account hash after "$JS.ACK."
                tokens = args[3].split(b".")
                base = 2 if len(tokens) >= 11 else 0
                seq = int(tokens[5 + base])
                if seq > self.last_seq:
                    if seq > end_seq:
                        self.finish()
                        continue
                    headers = bytes(view[start : start + header_size]) if headed and batches.keep_headers else None
                    batches.add(args[1], view[start + header_size : end], seq, int(tokens[7 + base]), headers)
                    self.last_seq = seq
                    if batches.ready:
                        self.wakeup.set()
                if seq >= end_seq or tokens[8 + base] == b"0":  # range complete, or nothing more matches
                    self.finish()
            if taken:
                self.received += taken
                self.on_run(taken)
            return pos

        return take
