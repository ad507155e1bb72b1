"""The pinned pull reader: read one member consumer's messages in ``(start, end]``.

Protocol (DESIGN section 4.2): UNPIN the consumer so this attempt takes the pin (an older attempt
still pulling gets 423 and stops), or, in a task's first attempt, take over the pin the query's last
reader of the member left; RESET it to ``start + 1`` (drops whatever an earlier attempt left
pending), then pull with JSON requests carrying the priority group and, once known, the pin id.
Until the pin id is known exactly one request is outstanding; after that several are pipelined.
Nothing is ever acked here: the ack floor moves only when Spark commits (with
``ackPolicy=none`` the server itself counts delivery as the ack until the commit resets the floor).

Messages arrive on the connection's loop thread, where a bulk handler parses runs of deliveries
straight from the read buffer and only appends to the columns' buffers; the caller's thread turns
full buffers into Arrow record batches. Memory is bounded by the pull window (``pull_window``): new
pulls are sent only while fewer than two record batches wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from spark_jetstream.client import messages
from spark_jetstream.client.connection import Connection
from spark_jetstream.client.jsapi import PRIORITY_GROUP_UNKNOWN, JetStreamApi, pin_holder
from spark_jetstream.client.protocol import JS_ACK_PREFIX, STATUS_PREFIX, status_of, unreadable_delivery
from spark_jetstream.errors import ApiError, ConnectError, FencedError, JetStreamError, ReaderError
from spark_jetstream.read.ranges import MemberRange
from spark_jetstream.read.rows import RowBuffer
from spark_jetstream.streaming.config import PullSettings
from spark_jetstream.streaming.deliveries import Deliveries
from spark_jetstream.streaming.pull_window import PullWindow

log = logging.getLogger(__name__)

SAMPLE = 100
"""Messages a read takes before the share of seqs they take bounds its pulls (``_in_range``)."""

_NS = 1_000_000_000
_MAX_RECOVERIES = 5
_MAX_BEHIND = 10
"""Confirmations in a row that the stream leader holds more of the range than the member consumer delivers (waiting
longer each time) before the consumer is RESET to where the read is (a recovery)."""
T = TypeVar("T")


def read_member(
    conn: Connection, member: MemberRange, settings: PullSettings, first_attempt: bool = False
) -> Iterator[pa.RecordBatch]:
    """Yield the member's messages with ``start < seq <= end`` in seq order, as record batches.

    Raises ``FencedError`` when a newer reader takes the pin, ``ReaderError`` when the read
    cannot make progress. Closing the generator early releases the subscription. A task's
    ``first_attempt`` may take over the pin of the query's last reader instead of releasing it.
    """
    if member.end <= member.start:
        return
    pull = _PinnedPull(conn, member, settings, first_attempt)
    try:
        conn.run(pull.open())
        while (rows := conn.run(pull.next_rows())) is not None:
            yield rows.to_record_batch(member.stream, member.partitioned, member.include_headers)
    finally:
        conn.run(pull.close(), timeout=10)


class _PinnedPull:
    """One read: the pin, RESETs, the status replies and recovery from lost pulls and leader changes.

    Every method runs on the connection's loop thread; deliveries are parsed by ``Deliveries``
    and pulls paced by ``pull_window.PullWindow``.
    """

    def __init__(
        self, conn: Connection, member: MemberRange, settings: PullSettings, first_attempt: bool = False
    ) -> None:
        self.conn = conn
        self.first_attempt = first_attempt
        self.api = JetStreamApi(conn)
        self.member = member
        self.settings = settings
        self.pull_subject = self.api.subject("CONSUMER", "MSG", "NEXT", member.stream, member.consumer)
        self.inbox = ""
        self.sid: int | None = None
        self.wakeup = asyncio.Event()
        self.window = PullWindow(settings, member.priority_group)
        self.deliveries = Deliveries(member, settings, self.wakeup, self._delivered)
        self.sending: set[asyncio.Task[None]] = set()  # pull requests being written (kept, or they may vanish)
        self.error: JetStreamError | None = None
        self.needs_check = False
        self.leader_changed = False  # pins seen since then may stem from this reader's own pulls
        self.pin_refused: str | None = None  # a 423's description, until the progress check weighs it
        self.leader: str | None = None  # the consumer's leader at the last RESET or progress check
        self.reset_to = member.start + 1  # the seq the last RESET put the consumer at
        self.recoveries = 0
        self.behind = (0, 0)  # (the last seq read, confirmations since it that the stream leader holds more)
        self.filters: list[str] = []  # the consumer's filter subjects (``_reset``), for the stream leader's answer
        self.heard = 0  # `deliveries.received` when next_rows last looked, at `last_activity`
        self.last_activity = 0.0

    @property
    def name(self) -> str:
        return f"consumer {self.member.consumer!r} on stream {self.member.stream!r}"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        if not await self._take_over_pin():
            try:
                await self.api.unpin(self.member.stream, self.member.consumer, self.member.priority_group)
            except ApiError as exc:
                if exc.err_code != PRIORITY_GROUP_UNKNOWN:
                    raise
                config = (await self.api.consumer_info_async(self.member.stream, self.member.consumer))["config"]
                self._check_config(config)
                raise
        await self._reset(self.member.start + 1)
        if self.deliveries.done:
            return
        await self._new_inbox()
        self._pull()

    async def _take_over_pin(self) -> bool:
        """In a task's first attempt, pull with the pin the query's last reader of this member left rather than
        release it: a released pin goes to whichever id-less pull waits first, a standby's as well as ours. The pin
        is that reader's when nothing was delivered since the commit's RESET (a pin is only ever given with a
        delivery). A retry or speculative copy, or any doubt, UNPINs: the older attempt gets 423."""
        if not self.first_attempt:
            return False
        info = await self.api.consumer_info_async(self.member.stream, self.member.consumer)
        pinned = pin_holder(info, self.member.priority_group)
        if not pinned or info["delivered"]["consumer_seq"] != 0:
            return False
        self.deliveries.pin_id = pinned
        return True

    async def _new_inbox(self) -> None:
        """Receive on a fresh inbox: late replies to pulls sent before are ignored from now on."""
        old, (self.inbox, self.sid) = (
            self.sid,
            await self.conn.subscribe_raw(self._on_message, bulk=self.deliveries.handler, owed=self.window.owed),
        )
        self.window.restart()
        self.last_activity = self.conn.loop.time()
        if old is not None:
            await self.conn.unsubscribe_raw(old)

    async def close(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            await self.conn.unsubscribe_raw(sid)

    async def _reset(self, seq: int) -> None:
        info = await self.api.reset(self.member.stream, self.member.consumer, seq)
        self.reset_to = seq
        self.leader = _leader(info)
        self.window.reset(info["num_pending"])
        config = info["config"]
        self._check_config(config)
        self.filters = config.get("filter_subjects") or [config.get("filter_subject") or ">"]
        if self.window.budget == 0:
            self.deliveries.drained = True

    def _check_config(self, config: dict[str, Any]) -> None:
        group = self.member.priority_group
        if config.get("priority_policy") != "pinned_client" or group not in config.get("priority_groups", []):
            raise ReaderError(
                f"The {self.name} is not a pinned member consumer (priority_policy must be pinned_client "
                f"with priority group {group!r}): recreate it with the group tooling."
            )
        max_ack_pending = config.get("max_ack_pending", 0)
        if 0 < max_ack_pending < min(self.window.budget, self.member.end - self.member.start):
            raise ReaderError(
                f"The {self.name} has max_ack_pending={max_ack_pending}, but nothing is acked while Spark "
                "works, so the read would stall: set max_ack_pending to -1 (the group tooling does)."
            )
        expires_ns = self.settings.expires * _NS
        timeout = config.get("priority_timeout", 0)
        if timeout and expires_ns * 2 >= timeout:
            raise ReaderError(
                f"pullExpires ({self.settings.expires:g}s) must stay under half the {self.name}'s "
                f"priority_timeout ({timeout / _NS:g}s), or the pin lapses between pulls: lower pullExpires."
            )

    # -- the caller's side -------------------------------------------------------------------

    async def next_rows(self) -> RowBuffer | None:
        """The next full buffer of rows, or None once the range is read."""
        stall_after = 3 * self.settings.idle_heartbeat
        deliveries = self.deliveries
        while True:
            if self.error is not None:
                raise self.error
            if deliveries.ready:
                rows = deliveries.ready.popleft()
                self._pull()
                return rows
            if deliveries.done:
                return None
            if deliveries.drained:
                await self._confirm_drained()
                continue
            now = self.conn.loop.time()
            if deliveries.received != self.heard:  # something arrived since the last look
                self.heard, self.last_activity = deliveries.received, now
            quiet = now - self.last_activity > stall_after
            if self.needs_check or quiet or not self.window.requests:  # no pull could be sent: budget used up
                self.needs_check = False
                await self._check_progress()
                continue
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), stall_after)

    # -- pulls -------------------------------------------------------------------------------

    def _pull(self) -> None:
        """Send the pull requests the window allows."""
        if self.deliveries.done or self.error is not None or self.sid is None or self.needs_check:
            return
        deliveries, client = self.deliveries, self.conn.client
        buffered, in_range = deliveries.batches.buffered(), max(1, self._in_range())
        for request in self.window.next_requests(deliveries.pin_id, buffered, client.max_payload, in_range):
            task = self.conn.loop.create_task(client.publish(self.pull_subject, request, reply=self.inbox))
            self.sending.add(task)
            task.add_done_callback(self._sent)

    def _in_range(self) -> int:
        """About how many of the member's messages the range still holds: never more than its seqs left (a filter
        matches a seq at most once), one pull's worth until ``SAMPLE`` messages showed the share of seqs they take,
        then that share of the seqs left, a twentieth more. Without it the pulls near a range's end brought the next
        batch's messages (dropped, and sent again after the next RESET): 8 partitions read in 8 batches, 1.16 messages
        sent per message read, 1.09 with it."""
        left = self.member.end - self.deliveries.last_seq
        taken, advanced = self.window.taken, self.deliveries.last_seq - self.reset_to + 1
        if taken < SAMPLE or advanced <= 0:
            return min(left, self.settings.batch)
        return min(left, math.ceil(left * taken / advanced * 1.05) + 1)

    def _delivered(self, count: int) -> None:
        """A run of deliveries arrived: a pull it completed, or the pin id it brought, lets the next pulls go now
        rather than at the pull's status, which the server may send late (the in-flight pulls stay served)."""
        self.window.delivered(count)
        self._pull()

    def _sent(self, task: asyncio.Task[None]) -> None:
        """A pull request was written, or not: one that was not is found missing by the progress check."""
        self.sending.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("A pull request to the %s was not sent: %s", self.name, exc)
            self.needs_check = True
            self.wakeup.set()

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Raw handler for what the bulk handler leaves on the pull inbox: statuses (loop thread)."""
        self.deliveries.received += 1
        if reply.startswith(JS_ACK_PREFIX):
            self._fail(ReaderError(unreadable_delivery(self.name, reply)))
            self.wakeup.set()
        elif headers is not None and headers.startswith(STATUS_PREFIX):
            self._on_status(*status_of(headers))

    def _on_status(self, code: int, description: str) -> None:
        if code == 100 or self.deliveries.done:
            return
        if code == 409 and description in ("Batch Completed", "Message Size Exceeds MaxBytes"):
            # A pull ended (all its messages or bytes were delivered); a too-large next message
            # gets a pull of its own.
            completed = description == "Batch Completed"
            self.window.ended(completed=completed, oversize=not completed)
            self._pull()
            return
        if code in (404, 408):
            # A pull expired without filling its batch: nothing was deliverable for a whole `expires`.
            self.window.ended()
            self.needs_check = True
        elif code == 503 or (code == 409 and description in ("Leadership Change", "Server Shutdown")):
            # No consumer leader right now (an election), or a new one: pin state is not
            # replicated and waiting pulls are gone. Whether the consumer still exists, and
            # what was lost, is found out by the progress check.
            self.needs_check = True
            self.window.restart()
            self.deliveries.pin_id = None
            self.leader_changed = True
        elif code == 423:
            # A pull of ours held a pin id the consumer no longer has: a newer reader took the pin, or
            # (after a leader change) the pull waited with an id from before this reader's own re-pin.
            # The progress check tells the two apart by who holds the pin now.
            self.pin_refused = description
            self.needs_check = True
        elif code == 409 and description == "Consumer Deleted":
            self._fail(ReaderError(f"The {self.name} was deleted while it was being read."))
        else:
            self._fail(ReaderError(f"Pull from the {self.name} failed: {code} {description}. Check the pull options."))
        self.wakeup.set()

    def _fail(self, error: JetStreamError) -> None:
        if self.error is None:
            self.error = error
        self.wakeup.set()

    # -- recovery ----------------------------------------------------------------------------

    async def _check_progress(self) -> None:
        """A pull ended empty or the server went quiet: find out why, then finish, recover or fail."""
        info = await self._api(self.api.consumer_info_async(self.member.stream, self.member.consumer))
        delivered = info["delivered"]["stream_seq"]
        pinned = pin_holder(info, self.member.priority_group)
        deliveries = self.deliveries
        if deliveries.done or self.error is not None:
            return
        if (leader := _leader(info)) != self.leader:  # a change whose 409 did not reach this reader counts too
            self.leader, self.leader_changed = leader, True
        if (refused := self.pin_refused) is not None:
            self.pin_refused = None
            if (not pinned or pinned != deliveries.pin_id) and not self.leader_changed:
                self._fail(
                    FencedError(
                        f"Read of {self.name} was fenced: a newer reader of this member took the pin "
                        f"({refused}). This attempt is obsolete and stops; the newer one reads the range."
                    )
                )
                return
            log.info(
                "A pull to the %s was refused (%s): it waited with a pin id from before this reader's own "
                "re-pin; reading on",
                self.name,
                refused,
            )
        if not pinned:
            deliveries.pin_id = None  # a leader change or an expired priority_timeout dropped the pin
        if delivered > deliveries.last_seq:
            # The server delivered messages this reader never saw (lost pulls after a reconnect
            # or a leader change): deliver them again from where this reader is.
            await self._recover(f"deliveries up to seq {delivered} did not arrive")
        elif info["num_pending"] == 0:
            deliveries.drained = True
        elif pinned and pinned != deliveries.pin_id and self.leader_changed:
            # A pull this reader sent around the election may hold the new pin: take it back.
            self.leader_changed = False
            await self._recover(f"the pin moved to {pinned} during a leader change", unpin=True)
        elif pinned and pinned != deliveries.pin_id:
            self._fail(
                ReaderError(
                    f"Another client is pulling from the {self.name} (it holds pin {pinned}) while "
                    f"{info['num_pending']} messages are pending: stop that client; only Spark may read "
                    "a member consumer."
                )
            )
        else:
            if not pinned:
                await self._new_inbox()  # replies to pulls sent under the lost pin must not count
            self.window.restart(info["num_pending"])
            self._pull()

    async def _confirm_drained(self) -> None:
        """The consumer counts nothing more pending before the range's end: believe it only when the stream leader
        holds no matching message in what is left. A consumer's leader counts what the stream's replica on its own
        server holds, which may lag (a server frozen or cut off a moment ago), and a leader cut off that does not know
        it yet answers too: the rest of the range would be left out of the batch for good (a chaos run lost 920
        messages of two members so). While the leader holds more, the consumer gets longer each time to deliver it,
        then is RESET to where the read is."""
        deliveries = self.deliveries
        deliveries.drained = False
        stream, end = self.member.stream, self.member.end
        found = await self._api(messages.first_on_leader(self.api, stream, self.filters, deliveries.last_seq, end))
        if found is None:
            deliveries.finish()
            return
        read, times = self.behind
        times = times + 1 if read == deliveries.last_seq else 1
        self.behind = (deliveries.last_seq, times)
        if times > _MAX_BEHIND:
            self.behind = (deliveries.last_seq, 0)
            await self._recover(f"the stream leader holds seq {found}, which the consumer did not deliver")
            return
        log.info("The %s has not delivered seq %d yet, which the stream leader holds: reading on", self.name, found)
        await asyncio.sleep(min(1.0, 0.05 * 2**times))
        self.needs_check = True  # what it delivered meanwhile, or a RESET where deliveries went missing

    async def _recover(self, why: str, unpin: bool = False) -> None:
        self.recoveries += 1
        if self.recoveries > _MAX_RECOVERIES:
            self._fail(ReaderError(f"Gave up reading the {self.name} after {_MAX_RECOVERIES} recoveries: {why}."))
            return
        log.warning("Re-reading the %s from seq %d: %s", self.name, self.deliveries.last_seq + 1, why)
        await self._new_inbox()
        if unpin:
            self.deliveries.pin_id = None
            await self._api(self.api.unpin(self.member.stream, self.member.consumer, self.member.priority_group))
        await self._api(self._reset(self.deliveries.last_seq + 1))
        self._pull()

    async def _api(self, call: Awaitable[T]) -> T:
        """An API call of the recovery. API calls go through the one retry layer (``client.retry``): they already
        ride through leader changes within the connection's API deadline, so what it gives up with
        (``ClusterUnavailableError``, a lost connection) is final here and becomes a ``ReaderError``
        naming the consumer. A missing stream or consumer, and any other API error, keep their own error.
        """
        try:
            return await call
        except ConnectError as exc:
            raise ReaderError(f"The {self.name} stayed unavailable: {exc}") from None


def _leader(info: dict[str, Any]) -> str | None:
    return (info.get("cluster") or {}).get("leader")
