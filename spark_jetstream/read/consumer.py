"""Reading a seq range through an ephemeral consumer: how batch reads read a stream without Direct Get
(``readMode=pull``, or ``auto`` where the stream or the NATS user does not allow Direct Get).

Each task makes a consumer of its own for its range: no durable name, ``deliver_policy: by_start_sequence`` at
``start + 1``, the range's filter, ``ack_policy: none`` (nothing to ack, no pending state on the server), memory
storage, one replica and a short ``inactive_threshold``. It pulls with JSON requests carrying ``max_bytes`` and
deletes the consumer when the read ends, however it ends; a task that dies leaves a consumer the server removes
after ``inactive_threshold``. Nothing else on the server changes: the group's consumers are not touched.

The consumer lives on one of the stream's servers, not necessarily its leader, so like a Direct Get read it may
see a replica that lags: the range counts as read at a delivery at or past ``end``, or when the stream leader
holds no matching message in what is left (``STREAM.MSG.GET``). A delivery's pending count alone never ends a
read: it was seen off by 1-3 on a stream of 200,000 subjects. A consumer that vanished (its server restarted,
the server removed it while Spark kept the task busy for longer than ``inactive_threshold``) is made again at
the next seq, on a new inbox, so a replay of the range is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from spark_jetstream.client import messages
from spark_jetstream.client.connection import Connection
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.protocol import (
    JS_ACK_PREFIX,
    STATUS_PREFIX,
    BulkHandler,
    Columns,
    deliveries_handler,
    status_of,
    unreadable_delivery,
)
from spark_jetstream.errors import (
    ApiError,
    ConnectError,
    ConsumerNotFoundError,
    NotPermittedError,
    ReaderError,
    StreamNotFoundError,
)
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.read.rows import RowBatches, RowBuffer

log = logging.getLogger(__name__)

_NS = 1_000_000_000
INACTIVE_THRESHOLD = 10.0
"""Seconds without a pull after which the server removes a read's consumer (the task died, or Spark kept it busy)."""
PULL_EXPIRES = 2.0
"""Seconds one pull waits at the server; one that ends empty makes the reader ask the stream leader what is left."""
PULL_HEARTBEAT = 0.5
"""Seconds between the server's heartbeats while a pull waits: silence for ``_SILENCE`` means the consumer is gone."""
_SILENCE = 3 * PULL_HEARTBEAT
_IN_FLIGHT = 2
_MAX_RECOVERIES = 5
_MAX_BEHIND = 10
"""Confirmations in a row (each after a pull expired empty) that the leader holds more than the consumer delivers."""
_CONSUMER_GONE = ("Consumer Deleted", "Leadership Change", "Server Shutdown")
"""409 statuses after which the read goes on with a new consumer (503: there is none, or it has no server)."""


def ephemeral_config(
    name: str, description: str, inactive: float = INACTIVE_THRESHOLD, **delivery: Any
) -> dict[str, Any]:
    """A consumer of a read's own: named ``name``, delivering as ``delivery`` says, nothing to ack, in memory on one
    server, removed by the server ``inactive`` seconds after its last pull (a task that died leaves nothing)."""
    return {
        "name": name,
        "description": description,
        **delivery,
        "ack_policy": "none",
        "replay_policy": "instant",
        "mem_storage": True,
        "num_replicas": 1,
        "inactive_threshold": int(inactive * _NS),
    }


def check_consumer_reads(stream: str, stream_config: dict[str, Any], grouped: bool = False) -> None:
    """Refuse, before any task runs, a stream that cannot be read through a consumer of the read's own (``grouped``:
    a group query that reads by seq instead of pulling from its member consumers)."""
    if stream_config.get("retention") == "workqueue":
        pulled = (
            "read without minPartitions and with preservePartitionOrder true (the group's member consumers then take "
            "the queue's messages)"
            if grouped
            else "stream it with a group (its member consumers take the queue's messages)"
        )
        raise ReaderError(
            f"Stream {stream!r} is a WorkQueue stream, which serves each subject to one consumer only, so a read "
            f"through consumers of its own cannot read it: enable Direct Get (`nats stream edit {stream} "
            f"--allow-direct`) and read with readMode=auto or direct, or {pulled}."
        )


def read_by_consumer(
    conn: Connection, seq_range: SeqRange, reader_class: type[_ConsumerRead] | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``seq_range`` in seq order, as record batches of the source's schema (``reader_class``:
    another way through a consumer, ``read.kv_latest``'s)."""
    if seq_range.end <= seq_range.start:
        return
    reader = (reader_class or _ConsumerRead)(conn, seq_range)
    try:
        conn.run(reader.open())
        while (rows := conn.run(reader.next_rows())) is not None:
            yield rows.to_record_batch(seq_range.stream, seq_range.partitioned, seq_range.include_headers)
    finally:
        conn.run(reader.close(), timeout=20)


class _ConsumerRead:
    """One range through one ephemeral consumer at a time; every method runs on the connection's loop thread."""

    def __init__(self, conn: Connection, seq_range: SeqRange) -> None:
        self.conn = conn
        self.api = JetStreamApi(conn)
        self.range = seq_range
        self.consumer = ""
        self.pull_subject = ""
        self.inbox = ""
        self.sid: int | None = None
        self.last = seq_range.start  # highest seq read
        self.batches = RowBatches(seq_range.record_batch_size, seq_range.record_batch_bytes, seq_range.include_headers)
        self.requests: list[int] = []  # messages each outstanding pull may still bring, oldest first
        self.oversize = False  # the next message is larger than pull_max_bytes: the next pull must fit it
        self.wakeup = asyncio.Event()
        self.sending: set[asyncio.Task[None]] = set()  # pulls being written (kept, or the loop may drop them)
        self.heard = 0  # messages and statuses received on the current inbox
        self.confirm = False  # the consumer has nothing more right now: ask the stream leader what is left
        self.recover: str | None = None  # why the consumer must be made again
        self.recoveries = 0  # in a row, without a message between them
        self.behind = 0  # times in a row the leader held more than the consumer delivered
        self.error: ReaderError | None = None
        self.done = False

    @property
    def name(self) -> str:
        return f"the read of stream {self.range.stream!r} ({self.range.filter}, seqs {self.last + 1}..{self.range.end})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self._start()

    async def close(self) -> None:
        """Stop receiving and delete the consumer (a failure is logged: the server removes it soon anyway)."""
        await self._drop_inbox()
        await self._delete_consumer()

    async def _start(self) -> None:
        """A new inbox and a new consumer from ``last + 1``; late replies to the old ones are ignored."""
        await self._drop_inbox()
        await self._delete_consumer()
        self.inbox, self.sid = await self.conn.subscribe_raw(self._on_message, bulk=self._bulk)
        self.requests.clear()
        self.heard = 0
        self.consumer = f"spark-read-{secrets.token_hex(8)}"
        self.pull_subject = self.api.subject("CONSUMER", "MSG", "NEXT", self.range.stream, self.consumer)
        try:
            info = await self.api.create_consumer_async(self.range.stream, self._config(), action="create")
        except ConnectError as exc:
            raise ReaderError(f"Could not create a consumer for {self.name}: {exc}") from None
        if info["num_pending"] == 0:
            self.confirm = True  # nothing matches from last + 1 now: check with the leader before stopping
        self._pull()

    def _config(self) -> dict[str, Any]:
        """The consumer's config: the range's filter from ``last + 1``."""
        config = ephemeral_config(
            self.consumer,
            f"spark-jetstream batch read of seqs {self.last + 1}..{self.range.end}",
            deliver_policy="by_start_sequence",
            opt_start_seq=self.last + 1,
        )
        if self.range.filter != ">":
            config["filter_subject"] = self.range.filter
        return config

    async def _drop_inbox(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            await self.conn.unsubscribe_raw(sid)

    async def _delete_consumer(self) -> None:
        if not self.consumer:
            return
        consumer, self.consumer = self.consumer, ""
        try:
            await asyncio.wait_for(self.api.delete_consumer_async(self.range.stream, consumer), 10)
        except (ConsumerNotFoundError, StreamNotFoundError):
            pass
        except NotPermittedError:  # DELETE may be withheld from a read-only user: the server removes it anyway
            log.info(
                "The NATS user may not delete consumer %r of stream %r: the server removes it after %gs without pulls",
                consumer,
                self.range.stream,
                INACTIVE_THRESHOLD,
            )
        except (ApiError, ConnectError, TimeoutError) as exc:
            log.warning(
                "Could not delete consumer %r of stream %r (the server removes it after %gs without pulls): %s",
                consumer,
                self.range.stream,
                INACTIVE_THRESHOLD,
                exc,
            )

    # -- the caller's side -------------------------------------------------------------------

    async def next_rows(self) -> RowBuffer | None:
        """The next full buffer of rows, or None once the range is read."""
        ready = self.batches.ready
        while True:
            if self.error is not None:
                raise self.error
            if ready:
                rows = ready.popleft()
                self._pull()
                return rows
            if self.done:
                return None
            if self.recover is not None:
                why, self.recover = self.recover, None
                await self._recover(why)
                continue
            if await self._settle():
                continue
            self._pull()
            heard = self.heard
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), _SILENCE)
            if self.heard == heard and not self.wakeup.is_set() and self.requests:
                self.recover = f"no answer to a pull for {_SILENCE:g}s"

    async def _settle(self) -> bool:
        """What to do before pulling again, if anything (True: it did something): here, check with the stream leader
        once the consumer had nothing more."""
        if not self.confirm:
            return False
        self.confirm = False
        await self._confirm()
        return True

    async def _confirm(self) -> None:
        """The consumer had nothing more: finish, unless the stream leader holds a matching message in ``(last, end]``
        (the consumer's server lags, or its pending count was off): then pull on."""
        stream, end = self.range.stream, self.range.end
        try:
            found = await messages.first_on_leader(self.api, stream, [self.range.filter], self.last, end)
        except ConnectError as exc:
            raise ReaderError(f"Could not finish {self.name}: {exc}") from None
        if found is None:
            self._finish()
            return
        self.behind += 1
        if self.behind > _MAX_BEHIND:  # its server does not catch up: try a consumer on another one
            self.recover = f"the consumer did not deliver seq {found} (the stream leader has it)"
        log.debug("The consumer of %s has not delivered seq %d yet: pulling on", self.name, found)

    async def _recover(self, why: str) -> None:
        self.recoveries += 1
        if self.recoveries > _MAX_RECOVERIES:
            raise ReaderError(f"Gave up {self.name} after {_MAX_RECOVERIES} attempts to go on: {why}.")
        log.info("Reading stream %s on from seq %d with a new consumer: %s", self.range.stream, self.last + 1, why)
        await self._start()

    def _finish(self) -> None:
        self.done = True
        self.batches.flush()
        self.wakeup.set()

    # -- pulls -------------------------------------------------------------------------------

    def _pull(self) -> None:
        """Send the pulls the memory bound allows: at most ``_IN_FLIGHT``, none while two record batches wait, and
        never more messages than seqs are left in the range."""
        if self.done or self.sid is None or self.recover is not None or self.error is not None:
            return
        rows, nbytes = self.batches.buffered()
        seq_range, client = self.range, self.conn.client
        while (
            len(self.requests) < _IN_FLIGHT
            and rows < 2 * seq_range.record_batch_size
            and nbytes < 2 * seq_range.record_batch_bytes
            and (wanted := min(seq_range.pull_batch, seq_range.end - self.last - sum(self.requests))) > 0
        ):
            request = {
                "batch": wanted,
                "expires": int(PULL_EXPIRES * _NS),
                "idle_heartbeat": int(PULL_HEARTBEAT * _NS),
                # With max_bytes every pull ends with a status; a message larger than that gets a pull of its own.
                "max_bytes": 2 * client.max_payload + 65536 if self.oversize else seq_range.pull_max_bytes,
            }
            self.oversize = False
            self.requests.append(wanted)
            task = self.conn.loop.create_task(self._send(json.dumps(request).encode(), self.inbox))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def _send(self, request: bytes, inbox: str) -> None:
        try:
            await self.conn.client.publish(self.pull_subject, request, reply=inbox)
        except Exception as exc:  # the connection dropped: the silence check makes the consumer again
            log.info("A pull for %s was not sent: %s", self.name, exc)

    def _delivered(self, count: int) -> None:
        """``count`` messages arrived: they come off the oldest pulls still owed any."""
        requests = self.requests
        for index, owed in enumerate(requests):  # a full pull stays listed until its status
            if not count:
                break
            used = min(owed, count)
            requests[index] = owed - used
            count -= used

    # -- what arrives (loop thread) ----------------------------------------------------------

    def _bulk(self, sid: int) -> BulkHandler:
        """Bulk handler of the pull inbox (``protocol.deliveries_handler``): deliveries straight into the rows."""
        return deliveries_handler(sid, self.batches, self._deliver)

    def _deliver(self, rows: Columns, first: int, header: bytes | None, drained: int) -> None:
        """A run of deliveries appended to the rows from ``first`` on: seqs at or below the last read come from a
        consumer made before the last recovery; one past the range's end completes it, and so does its last seq."""
        count = len(rows.seqs) - first
        self._counted(count)
        if self.done:
            self.batches.keep(first, first, first)  # none: the range is read
            return
        kept = self.batches.keep_in_order(first, self.last, self.range.end)
        self.last = kept.last
        if kept.past_end or self.last >= self.range.end:
            self._finish()
        elif drained < count:
            self.confirm = True  # nothing more right now: the leader says whether that is the end

    def _counted(self, taken: int) -> None:
        self.heard += taken
        self.recoveries = self.behind = 0
        self._delivered(taken)
        self.wakeup.set()

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """What the bulk handler leaves on the pull inbox: statuses (loop thread)."""
        self.heard += 1
        if reply.startswith(JS_ACK_PREFIX) and not self.done:
            self.error = ReaderError(unreadable_delivery(self.name, reply))
            self.wakeup.set()
        if reply or headers is None or not headers.startswith(STATUS_PREFIX) or self.done:
            return
        code, description = status_of(headers)
        if code == 100:
            return
        if code == 409 and description in ("Batch Completed", "Message Size Exceeds MaxBytes"):
            self._ended()
            self.oversize = description != "Batch Completed"
            self._pull()
        elif code in (404, 408):
            self._ended()  # a pull expired with nothing deliverable: is the range read?
            self.confirm = True
        elif code == 503 or (code == 409 and description in _CONSUMER_GONE):
            self.recover = f"{code} {description}"  # the consumer is gone, or its server is
        else:
            self.error = ReaderError(f"Pull for {self.name} failed: {code} {description}.")
        self.wakeup.set()

    def _ended(self) -> None:
        """The oldest pull ended (its status arrived)."""
        if self.requests:
            self.requests.pop(0)
