"""A KV bucket's latest values read through a consumer: how a table read (and a snapshot) reads a bucket that keeps
several revisions per key and has no Direct Get, as nats-py makes buckets (decision 0023).

**One consumer per key filter.** Each Spark task reads one filter of the read's scope (the whole bucket, or one of
the ``keys`` filters, which do not overlap) through an ephemeral consumer of its own with ``deliver_policy:
last_per_subject`` (what the NATS clients' KV watchers use): the server hands over each key's last revision, in
revision order, then every later message. A task that reads a filter of a million keys reads them alone; ``keys``
filters that split the keys read in parallel. Seq ranges cannot split such a read: the server would build the
whole filter's list for every consumer and deliver it from the lowest revision, whatever range a task holds.

**The bound.** The rows are the keys' latest revisions up to the planned end ``E`` of the read (a batch read's end,
a snapshot's offset), as Direct Get's ``multi_last`` with ``up_to_seq`` gives them. The server builds the consumer's
list at some seq ``T`` it does not tell; the stream leader's last seq before (``L0``) and after (``L1``) making the
consumer bracket it (one server: ``L0 <= T <= L1``), and ``E <= L0``. A delivery at or below ``E`` is its key's
latest revision up to ``E``: a row. One in ``(E, L0]`` is a key's last revision, changed after the bound: that
key's latest revision up to ``E`` is read from the leader (``STREAM.MSG.GET`` with ``next_by_subj``, at most the
bucket's history a key). One in ``(L0, L1]`` may be a key's last revision or a newer message: the keys that have a
message there are asked of the leader before the first pull (usually none), and such a key is read from the leader
at its first delivery only. A delivery past ``L1``, or a pull that finds nothing more, ends the read.

**Pulls.** One ``no_wait`` pull at a time, of a message count, without ``max_bytes``: a pull that ends on
``max_bytes`` makes nats-server drop the list entry it was about to deliver (measured, 50 keys of 300-350 B and
``max_bytes`` 1000: 2.15.1 delivered 34, 2.10.26 49), and a second ``no_wait`` pull is answered ``408 Requests
Pending`` when fewer messages are left than the first asked for (a status no reader can tell from the first pull's).
A pull asks for as many messages as ``pullMaxBytes`` holds at the largest size seen so far (before any, the
bucket's largest value, or the server's ``max_payload``), at most ``pullBatchSize``; none goes while two record
batches wait, or while ``_RESOLVE_AT`` keys changed after the bound wait for the leader. ``404 No Messages`` ends
the read: everything was delivered.

**Limits.** The consumer cannot be made again where the last one stopped (a new list would be built at a new
``T``): a consumer lost mid-read fails the task, which Spark retries. A key changed ``history`` times (or purged)
while the read was under way may be left out, as a revision removed under a Direct Get read is. The consumer's
server answers from its own copy of the stream: a replica that lags the leader by more than the time between
planning and the task would answer for an earlier point (Direct Get's ``multi_last`` has the same exposure).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import operator
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from spark_jetstream.client import messages
from spark_jetstream.client.connection import Connection
from spark_jetstream.client.protocol import STATUS_PREFIX, Columns, status_of
from spark_jetstream.errors import ReaderError
from spark_jetstream.read.consumer import _ConsumerRead, ephemeral_config, read_by_consumer
from spark_jetstream.read.kv import key_prefix
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.read.rows import texts

LAST_PER_KEY = "last-per-key"
"""``SeqRange.read_mode`` of a range read here."""
INACTIVE_THRESHOLD = 60.0
"""Seconds without a pull after which the server removes the consumer: longer than a range read's, because this
read cannot go on with a new one."""
_RESOLVE_AT = 256
"""Keys changed after the bound that are read from the leader together (and the most that wait)."""
_RESOLVING = 32
"""``STREAM.MSG.GET`` requests in flight while keys changed after the bound are read."""


def latest_ranges(template: SeqRange, firsts: Sequence[int | None], filters: Sequence[str]) -> list[SeqRange]:
    """A bucket's latest values read through consumers: one range ``(start, end]`` per filter with a message in it."""
    return [
        replace(template, filter=subject, read_mode=LAST_PER_KEY)
        for subject, first in zip(filters, firsts, strict=True)
        if first is not None and first <= template.end
    ]


def read_latest(conn: Connection, seq_range: SeqRange) -> Iterator[pa.RecordBatch]:
    """Yield the latest revision up to ``seq_range.end`` (above ``seq_range.start``) of each key of the range's filter
    that has one, deletes and purges included (``read.kv`` keeps the live ones), as record batches of the source's
    schema; not in seq order."""
    yield from read_by_consumer(conn, seq_range, _LatestRead)


class _LatestRead(_ConsumerRead):
    """One key filter through one ``last_per_subject`` consumer; every method runs on the connection's loop
    thread."""

    def __init__(self, conn: Connection, seq_range: SeqRange) -> None:
        super().__init__(conn, seq_range)
        kv = seq_range.kv
        if kv is None:
            raise ValueError("a read of a bucket's latest values needs its KvView")
        self.filter = key_prefix(kv.bucket) + ">" if seq_range.filter == ">" else seq_range.filter
        self.before = 0  # L0: the leader's last seq before the consumer was made
        self.after: int | None = None  # L1: after; None until the first pull may go
        self.unsure: set[bytes] = set()  # subjects with a message in (L0, L1]
        self.seen: set[bytes] = set()  # of those, the ones delivered so far
        self.changed: list[bytes] = []  # keys whose last revision is past the bound: read from the leader
        self.largest = 0  # the largest payload seen so far
        self.guess = 0  # the largest payload there may be, until one is seen

    @property
    def name(self) -> str:
        return f"the read of {self.filter}'s latest values in stream {self.range.stream!r} (up to seq {self.range.end})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        info = await self.api.stream_info_async(self.range.stream)
        self.before = max(int(info["state"]["last_seq"]), self.range.end)
        self.guess = int(info["config"].get("max_msg_size") or -1)
        if self.guess <= 0:
            self.guess = self.conn.client.max_payload
        await self._start()
        after = max(await self._last_seq(), self.before)
        self.unsure = await self._subjects_between(self.before, after)
        self.after = after
        self._pull()

    def _config(self) -> dict[str, Any]:
        return ephemeral_config(
            self.consumer,
            f"spark-jetstream read of {self.filter}'s latest values up to seq {self.range.end}",
            INACTIVE_THRESHOLD,
            deliver_policy="last_per_subject",
            filter_subject=self.filter,
        )

    async def _last_seq(self) -> int:
        return int((await self.api.stream_info_async(self.range.stream))["state"]["last_seq"])

    async def _subjects_between(self, low: int, high: int) -> set[bytes]:
        """The subjects of the filter's messages in ``(low, high]``, from the leader."""
        found: set[bytes] = set()
        seq = low + 1
        while seq <= high:
            message = await messages.stored_message_async(
                self.api, self.range.stream, {"seq": seq, "next_by_subj": self.filter}
            )
            if message is None or message["seq"] > high:
                break
            found.add(message["subject"].encode())
            seq = message["seq"] + 1
        return found

    # -- the caller's side -------------------------------------------------------------------

    async def _recover(self, why: str) -> None:
        raise ReaderError(
            f"{self.name[0].upper()}{self.name[1:]} lost its consumer ({why}); a read of a bucket's latest values "
            "cannot go on with a new one: run it again (Spark retries the task)."
        )

    async def _settle(self) -> bool:
        """Read the keys that changed after the bound from the leader (in bulk, or all once the consumer is done);
        finish once a pull found nothing more, or a delivery came from after the consumer was made."""
        if self.changed and (self.confirm or len(self.changed) >= _RESOLVE_AT):
            await self._resolve()
            return True
        if self.confirm:
            self._finish()
            return True
        return False

    async def _resolve(self) -> None:
        """Read each waiting key's latest revision up to the bound from the leader, into the rows."""
        keys, self.changed = self.changed[:_RESOLVE_AT], self.changed[_RESOLVE_AT:]
        limit = asyncio.Semaphore(_RESOLVING)

        async def latest(subject: bytes) -> None:
            async with limit:
                message = await self._as_of_bound(subject.decode())
            if message is not None:
                headers = base64.b64decode(message["hdrs"]) if message.get("hdrs") else None
                data = base64.b64decode(message.get("data") or "")
                self.batches.add(
                    message["subject"].encode(), data, message["seq"], messages.time_ns(message["time"]), headers
                )

        await asyncio.gather(*(latest(key) for key in keys))
        self._pull()

    async def _as_of_bound(self, subject: str) -> dict[str, Any] | None:
        """The last message on ``subject`` in ``(start, end]``, walked on the leader (at most the bucket's history
        requests, and one more)."""
        found, seq = None, self.range.start + 1
        while seq <= self.range.end:
            message = await messages.stored_message_async(
                self.api, self.range.stream, {"seq": seq, "next_by_subj": subject}
            )
            if message is None or message["seq"] > self.range.end:
                break
            found, seq = message, message["seq"] + 1
        return found

    # -- pulls -------------------------------------------------------------------------------

    def _pull(self) -> None:
        """Send the pull the memory bound allows (``no_wait``, a message count and no ``max_bytes``)."""
        if (
            self.after is None
            or self.done
            or self.confirm
            or self.sid is None
            or self.recover is not None
            or self.error is not None
            or len(self.changed) >= _RESOLVE_AT
        ):
            return
        rows, nbytes = self.batches.buffered()
        seq_range = self.range
        if not self.requests and rows < 2 * seq_range.record_batch_size and nbytes < 2 * seq_range.record_batch_bytes:
            wanted = max(1, min(seq_range.pull_batch, seq_range.pull_max_bytes // max(self.largest or self.guess, 1)))
            self.requests.append(wanted)
            request = json.dumps({"batch": wanted, "no_wait": True}).encode()
            task = self.conn.loop.create_task(self._send(request, self.inbox))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    def _delivered(self, count: int) -> None:
        """``count`` messages arrived: they come off the oldest pulls; a pull that got all it asked for ends silently
        (no ``max_bytes``: no status follows)."""
        requests = self.requests
        while count and requests:
            used = min(requests[0], count)
            requests[0] -= used
            count -= used
            if not requests[0]:
                requests.pop(0)

    # -- what arrives (loop thread) ----------------------------------------------------------

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Statuses as a range read takes them (``404``: nothing more, the read is complete), except ``408``: that
        pull is over, not the read (a ``no_wait`` pull has no expiry; ``Requests Pending`` should not come with one
        pull at a time)."""
        status = status_of(headers)[0] if not reply and headers and headers.startswith(STATUS_PREFIX) else None
        if status == 408 and not self.done:
            self.heard += 1
            self._ended()
            self._pull()
            self.wakeup.set()
            return
        super()._on_message(subject, reply, data, headers)

    def _deliver(self, rows: Columns, first: int, header: bytes | None, drained: int) -> None:
        """A run of deliveries appended to the rows from ``first`` on, in seq order (the keys' last revisions, then
        newer messages): rows up to the bound, keys changed after it to read from the leader, and the end of the read
        at a delivery past ``L1``."""
        seqs, offsets = rows.seqs, rows.offsets
        self._counted(len(seqs) - first)
        if self.done or self.confirm or self.after is None:
            self.batches.keep(first, first, first)  # none
            return
        self.largest = max(self.largest, *map(operator.sub, offsets[first + 1 :], offsets[first:-1]))
        first_row = bisect.bisect_right(seqs, self.range.start, first)
        past_rows = bisect.bisect_right(seqs, self.range.end, first)
        past_sure = bisect.bisect_right(seqs, self.before, first)
        past_unsure = bisect.bisect_right(seqs, self.after, first)
        if self.unsure or past_rows < past_unsure:  # subjects to look at (rarely)
            subjects = texts(rows.subjects, rows.subject_ends, first, past_unsure)
            if self.unsure:
                self.seen.update(subject for subject in subjects[: past_sure - first] if subject in self.unsure)
            self.changed.extend(subjects[past_rows - first : past_sure - first])
            for subject in subjects[past_sure - first :]:
                if subject not in self.seen:  # its first delivery: the key's last revision when the consumer was made
                    self.seen.add(subject)
                    self.changed.append(subject)
        if past_unsure < len(seqs):
            self.confirm = True  # from after the consumer was made: every key's last revision is in
            self.wakeup.set()
        self.batches.keep(first, first_row, past_rows)
