"""An idle streaming query waits for the stream's next message instead of asking for stream info every 0.1 s.

Spark calls ``latestOffset`` about every 10 ms while nothing arrives, and planning read stream info at most every
``STREAM_INFO_INTERVAL`` (0.1 s): about 10 JetStream API requests a second per idle query, each answered by the
stream's leader. Once the stream's last seq has not moved for ``IDLE_AFTER`` s, the query subscribes (core NATS) to the
subjects the stream takes and asks only every ``idleInterval`` (option, 1 s); the first message published there wakes
it, and it unsubscribes and asks at once (then often, for ``IDLE_AFTER`` s: a stream that sources another gets the
message a moment later). The server sends the query one message per idle spell. A stream without subjects of its own
(a mirror, one that only sources) is not subscribed to and is asked every ``idleInterval``; a subscription the NATS
user may not make (a permissions violation) is given up on, and the query polls as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from spark_jetstream.client.connection import Connection

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription

log = logging.getLogger(__name__)

IDLE_AFTER = 2.0
"""Seconds without a change of the stream's last seq after which the query waits for a message instead of polling."""


class Waker:
    """A core subscription on ``subjects`` while the query is idle (``arm``); ``woken`` once a message came."""

    def __init__(
        self, conn: Connection, subjects: list[str], instead: str = "an idle query asks for stream info"
    ) -> None:
        self.conn = conn
        self.subjects = subjects
        self.instead = instead  # what is done without the subscription, for the log
        self.woken = False
        self.refused = False  # the server refused the subscription: polling is all there is
        self._subs: list[Subscription] = []
        self._armed_at = 0.0

    @property
    def armed(self) -> bool:
        return bool(self._subs)

    def arm(self) -> None:
        """Subscribe (once per idle spell); a message on any subject sets ``woken``."""
        if self._subs or self.refused or not self.subjects:
            return
        self.woken = False

        async def wake(_: Any) -> None:
            self.woken = True

        async def subscribe() -> list[Subscription]:
            self._armed_at = asyncio.get_running_loop().time()
            return [await self.conn.client.subscribe(subject, cb=wake) for subject in self.subjects]

        self._subs = self.conn.run(subscribe())

    def check(self) -> None:
        """Give up on a subscription the server refused (its violation arrives after the SUB, when it does)."""
        if self._subs and any(self.conn.client.refused(s, self._armed_at) for s in self.subjects):
            log.info("The NATS user may not subscribe to %s: %s instead", self.subjects, self.instead)
            self.refused = True
            self.disarm()

    def disarm(self) -> None:
        subs, self._subs = self._subs, []
        if subs and not self.conn.client.is_closed:

            async def unsubscribe() -> None:
                for sub in subs:
                    await sub.unsubscribe()

            self.conn.run(unsubscribe(), timeout=5)
