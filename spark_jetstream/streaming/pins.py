"""The query holds its member consumers' pins for as long as it runs (driver, Direct Get reads).

Batches are read with Direct Get, so nothing of the query pulls from a member consumer; what the
consumer still gives is its ack floor (``stream.member_consumers``) and its pin. ``PinKeeper`` takes each
member's pin once and keeps it without a delivery: every ``KEEP_ALIVE`` seconds (``_pause``) a pull with the pin
id and ``max_bytes: 1`` (measured on nats-server 2.15.1: answered at once with ``409 Message Size
Exceeds MaxBytes`` while messages are pending, delivers nothing, and restarts ``priority_timeout``).
A standby without the pin id, say a pcgroups member joining the group, then gets nothing at all.

Taking a pin needs a delivery (the server pins the first id-less pull it delivers to): one pull of one
message, then a RESET of that consumer to the committed watermark, under the same lock as the
commit's RESETs, so the delivery leaves nothing behind (no pending message, no ack-none floor moved).

Every ``SWEEP_EVERY`` seconds (with the keep-alive pulls) the keeper also reads each member consumer's info: more
than one delivery since the last RESET (``delivered.consumer_seq`` restarts at 0 with each RESET and the query makes
none), a pin it did not take, or a config another client changed, is another client at work on Spark's consumer.
The query then fails at its next call into the source (``raise_error``), naming the consumer. One
delivery still counted is the trace of a taking (counted after its RESET, or its reply lost under
load): it is reset away like the taking's own, so an ack-none floor never stays off the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from spark_jetstream.client.jsapi import PRIORITY_GROUP, pin_holder
from spark_jetstream.client.protocol import PIN_HEADER, STATUS_PREFIX, header_value, status_of
from spark_jetstream.errors import (
    ApiError,
    ConnectError,
    ConsumerNotFoundError,
    GroupConfigError,
    JetStreamError,
    ReaderError,
)
from spark_jetstream.streaming.member_consumers import MemberConsumers

log = logging.getLogger(__name__)

KEEP_ALIVE = 20.0
"""Most seconds between keep-alive pulls while every pin is held (a quarter of ``priority_timeout`` when that is
shorter): each is a request its consumer's leader answers, so an idle query's keeper asks 2 per member per 20 s."""
RETAKE = 1.0
"""Seconds between rounds while a pin is missing or a taking's delivery waits to be reset away."""
SWEEP_EVERY = KEEP_ALIVE
"""Seconds between checks of every member consumer (``CONSUMER.INFO`` each, an API request) while the query is idle: a
foreign puller is found within about this; a busy query checks each consumer before its floor moves anyway."""

_NS = 1_000_000_000
_TAKE_WAIT = 2.0  # how long a pull that takes a pin waits for a message
_UNDO_TRIES = 50


class PinKeeper:
    """Holds the pin of every member consumer of ``members`` and watches for other clients."""

    def __init__(self, members: MemberConsumers) -> None:
        self.members = members
        self.api = members.api
        self.conn = members.api.conn
        self.pins: dict[str, str] = {}  # consumer -> the pin id this query holds
        # per consumer, takings of its pin (by a delivery) started plus ended: odd while one runs
        self.takes: dict[str, int] = {}
        # consumers whose pin came with a delivery not yet reset away; a RESET that failed (an API timeout under load)
        # is tried again next round, with the pin kept (losing its id left the pin held and the ack-none floor moved)
        self.undoing: set[str] = set()
        # consumers whose last taking's trace (its delivery counted after its RESET) was reset: one per taking
        self.traced: set[str] = set()
        self.error: JetStreamError | None = None
        self.rounds = 0  # rounds done; the first takes every pin it can, after unpinning whatever held it
        self.swept = float("-inf")  # when the last round checked every member consumer (loop time)
        self._task: asyncio.Future[None] | None = None

    def start(self) -> None:
        """Start keeping pins, once the first acknowledge set the floors a taken pin's delivery is reset to;
        from then on each floor moves only after its consumer was checked."""
        if self._task is None:
            self.members.before_reset = self.check
            self._task = asyncio.run_coroutine_threadsafe(self._run(), self.conn.loop)

    def stop(self) -> None:
        """Stop keeping the pins and release them, so a client the group is handed to next need not wait
        out ``priority_timeout``."""
        if self._task is None:
            return
        self._task.cancel()
        stream, pinned, self.pins = self.members.stream, list(self.pins), {}

        async def release() -> None:
            await asyncio.gather(*(self.api.unpin(stream, c, PRIORITY_GROUP) for c in pinned), return_exceptions=True)

        with contextlib.suppress(Exception):  # stopping: a server that is gone lets the pins lapse
            self.conn.run(release(), timeout=5)

    def settle(self, timeout: float) -> None:
        """Wait, at most ``timeout``, until the first round has taken the pins and no pin's taking delivery waits
        to be reset away: with ``ackPolicy=none`` that delivery moved the consumer's ack floor, which must equal
        the checkpoint again before a batch goes to Spark."""

        def unsettled() -> bool:
            return self._task is not None and (self.rounds == 0 or bool(self.undoing))

        async def settled() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while unsettled() and loop.time() < deadline:
                await asyncio.sleep(0.01)

        if unsettled():  # read without the loop: the common case (nothing to wait for) costs no round trip
            self.conn.run(settled())

    def raise_error(self) -> None:
        """Fail the query's current call when another client was found on a member consumer."""
        if self.error is not None:
            raise self.error

    async def _run(self) -> None:
        while self.error is None:
            try:
                await self._round(unpin=self.rounds == 0)
                self.rounds += 1
            except (ConnectError, ApiError) as exc:  # an election or a restart: try again next round
                log.info("Keeping the member consumers' pins: %s", exc)
            except JetStreamError as exc:
                self.error = exc
                return
            except Exception:  # a bug must not end the keeping silently: say so, and go on
                log.exception("Keeping the member consumers' pins failed; trying again")
            await asyncio.sleep(self._pause())

    def _pause(self) -> float:
        """Seconds to the next round: ``RETAKE`` while a pin is missing or a taking's delivery waits to be reset away,
        else what keeps the pins with a margin."""
        layout = self.members.layout
        held = not self.undoing and all(layout.consumer(member) in self.pins for member in layout.member_names)
        return min(KEEP_ALIVE, self.members.priority_timeout / 4) if held else RETAKE

    async def _round(self, unpin: bool) -> None:
        """Keep every pin, take the missing ones, and check every member consumer once."""
        layout = self.members.layout
        consumers = [layout.consumer(member) for member in layout.member_names]
        for gone in set(self.pins) - set(consumers):
            del self.pins[gone]
            self.undoing.discard(gone)
            self.traced.discard(gone)
        await asyncio.gather(*(self._keep(consumer, unpin) for consumer in consumers))
        now = asyncio.get_running_loop().time()
        if now - self.swept < SWEEP_EVERY - RETAKE:  # a round every SWEEP_EVERY s comes a moment early or late
            return
        self.swept = now
        traces = await self.check()
        self.undoing.update(traces)
        self.traced.update(traces)
        await asyncio.gather(*(self._undo(consumer, counted=True) for consumer in traces))

    async def check(self, consumer: str | None = None) -> list[str]:
        """Raise when another client pulled from, pinned, changed or deleted a member consumer (``consumer``:
        only that one). Also run for a consumer right before its floor moves (``MemberConsumers.before_reset``),
        as a RESET clears the evidence of deliveries. Returns the consumers that still count one delivery, with
        no taking at work: a taking's trace, to reset away (once per taking: another is another client's)."""
        layout, changes = self.members.layout, self.members.layout_changes
        members = [m for m in layout.member_names if consumer is None or layout.consumer(m) == consumer]
        before = dict(self.takes)
        infos = await asyncio.gather(*(self._info(layout.consumer(member)) for member in members))
        if changes % 2 or changes != self.members.layout_changes:
            return []  # the query itself changed the consumers meanwhile; the next round checks the result
        traces = []
        for member, info in zip(members, infos, strict=True):
            name = layout.consumer(member)
            takes = self.takes.get(name, 0)
            if takes == before.get(name, 0) and takes % 2 == 0 and info is not None:  # no taking delivery in the info
                self._check(name, info)
                if info["delivered"]["consumer_seq"] == 1 and name not in self.undoing:
                    traces.append(name)
        if (changed := self.members.changed_error(dict(zip(members, infos, strict=True)))) is not None:
            raise changed
        return traces

    async def _info(self, consumer: str) -> dict[str, Any] | None:
        try:
            return await self.api.consumer_info_async(self.members.stream, consumer)
        except ConsumerNotFoundError:
            return None

    async def _keep(self, consumer: str, unpin: bool) -> None:
        stream = self.members.stream
        if unpin and consumer not in self.pins:  # a new run takes over from whatever held it (an earlier run, a crash)
            await self.api.unpin(stream, consumer, PRIORITY_GROUP)
        pin = self.pins.get(consumer)
        if pin is not None and consumer not in self.undoing:
            status, _ = await self._pull(consumer, {"batch": 1, "max_bytes": 1, "expires": _NS, "id": pin})
            if status in ("423", "409 Leadership Change", "409 Server Shutdown", "503"):
                del self.pins[consumer]  # moved (found out by the check) or dropped by a new consumer leader
            return
        self.takes[consumer] = self.takes.get(consumer, 0) + 1
        try:
            if consumer not in self.undoing:  # else an earlier round took the pin and failed to reset: again
                status, pin = await self._pull(consumer, {"batch": 1, "expires": int(_TAKE_WAIT * _NS)})
                if status in ("msg", "timeout"):  # it delivered, or may have: its trace is this taking's
                    self.traced.discard(consumer)
                if pin is None:
                    return  # nothing to deliver yet, or another client is pinned (the check finds out)
                self.pins[consumer] = pin  # held from here: a failed RESET below must not lose the pin id
                self.undoing.add(consumer)
                log.info("Holding the pin of member consumer %s (%s)", consumer, status)
            await self._undo(consumer)
        finally:
            self.takes[consumer] += 1

    async def _undo(self, consumer: str, counted: bool = False) -> None:
        """Reset ``consumer``'s delivery away (it is in ``undoing``; a failed RESET leaves it there for the next
        round). ``counted``: consumer info showed it already."""
        async with self.members.locks[consumer]:  # not during a RESET of the commit's, and to the floor it set
            if not counted:
                await self._until_counted(consumer)
            await self._reset_away(consumer)
        self.undoing.discard(consumer)

    async def _until_counted(self, consumer: str) -> None:
        """Wait (a bounded while) until the server has counted the taking delivery. Measured on 2.15.1: the message
        can arrive before the server counts it, and a RESET sent at once then lands first and the delivery stays
        counted (and would read as another client's)."""
        for _ in range(_UNDO_TRIES):
            info = await self.api.consumer_info_async(self.members.stream, consumer)
            if info["delivered"]["consumer_seq"] > 0:
                return
            await asyncio.sleep(0.02)

    async def _reset_away(self, consumer: str) -> None:
        """RESET the consumer to the committed watermark, until no delivery is counted."""
        stream = self.members.stream
        committed = self.members.acked_through or 0
        for _ in range(_UNDO_TRIES):
            info = await self.api.reset(stream, consumer, committed + 1)
            if info["delivered"]["consumer_seq"] == 0:
                self.members.moved[consumer] = committed
                return
            await asyncio.sleep(0.05)
        raise ReaderError(f"Member consumer {consumer!r} kept a delivery through {_UNDO_TRIES} RESETs")

    async def _pull(self, consumer: str, request: dict[str, Any]) -> tuple[str, str | None]:
        """One pull; its first reply's status (``"409 <description>"``, ``"msg"`` for a message) and pin id."""
        subject = self.api.subject("CONSUMER", "MSG", "NEXT", self.members.stream, consumer)
        body = json.dumps({**request, "group": PRIORITY_GROUP}).encode()
        first: asyncio.Future[bytes] = self.conn.loop.create_future()

        def on_reply(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            if not first.done():
                first.set_result(headers or b"")

        inbox, sid = await self.conn.subscribe_raw(on_reply)
        try:
            await self.conn.client.publish(subject, body, reply=inbox)
            headers = await asyncio.wait_for(first, request["expires"] / _NS + 2.0)
        except TimeoutError:
            return "timeout", None
        finally:
            await self.conn.unsubscribe_raw(sid)
        pin = header_value(headers, PIN_HEADER)
        if not headers.startswith(STATUS_PREFIX):
            return "msg", pin
        code, description = status_of(headers)
        return (f"{code} {description}" if code == 409 else str(code)), pin

    def _check(self, consumer: str, info: dict[str, Any]) -> None:
        pinned = pin_holder(info)
        ours, stream = self.pins.get(consumer), self.members.stream
        # the pin's own taking delivery may still be counted once after its RESET (measured: on a clustered
        # consumer, and rarely on one server under load), so more than one delivery is another client's, and so is
        # one after that trace was reset (not while it is: a commit's RESET may check first)
        reset = consumer in self.traced and consumer not in self.undoing
        delivered, allowed = info["delivered"]["consumer_seq"], 0 if reset else 1
        if delivered > allowed or (pinned is not None and ours is not None and pinned != ours):
            what = (
                f"{delivered} {'delivery' if delivered == 1 else 'deliveries'} since the query last reset it"
                if delivered > allowed
                else f"the pin is held by {pinned}, not by this query"
            )
            raise GroupConfigError(
                f"Another client is pulling from member consumer {consumer!r} on stream {stream!r} "
                f"({what}). Spark reads this group's messages itself and keeps its member consumers to itself: stop "
                f"the other client, give it a group of its own, or keep other users off Spark's member consumers with "
                f"NATS permissions (deny `$JS.API.CONSUMER.MSG.NEXT.{stream}.{self.members.layout.group}-*` "
                "to them; see the Security guide). Restart the query: it resumes from its checkpoint."
            )
