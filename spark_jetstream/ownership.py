"""Who reads a group: one live query at a time, made visible as a core-NATS responder.

The running query answers requests on ``_SPARK_JETSTREAM.owner.<stream>.<group>``; a second query
asks there first and is refused with the owner's host, pid and start time. The responder dies with
its process, so a crashed query never blocks its own restart (a timestamp lease would).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from .connection import Connection
from .errors import GroupConfigError

_ASK_TIMEOUT = 0.5
"""Seconds a live owner has to answer: its responder runs on an idle driver's event loop."""


def owner_subject(stream: str, group: str) -> str:
    return f"_SPARK_JETSTREAM.owner.{stream}.{group}"


def describe_this_process() -> str:
    """How the owner is shown to a refused query and in the member consumers' metadata."""
    return f"{socket.gethostname()}:{os.getpid()} since {datetime.now(UTC).isoformat(timespec='seconds')}"


class GroupClaim:
    """This query's claim on a group: taken by ``claim``, given up by ``release`` (safe to call twice)."""

    def __init__(self, conn: Connection, stream: str, group: str, owner: str) -> None:
        self.conn = conn
        self.stream = stream
        self.group = group
        self.owner = owner
        self._sid: int | None = None

    def claim(self) -> None:
        """Refuse while another live query reads the group; then answer for it ourselves.

        Only "nobody answered" (no responders, or no reply in time) means the group is free; any
        other failure (a permissions error, a closed connection) is raised, not read as "free".
        """
        subject = owner_subject(self.stream, self.group)

        async def claim() -> tuple[int | None, str]:
            try:
                reply = await self.conn.client.request(subject, b"", timeout=_ASK_TIMEOUT)
            except (NoRespondersError, NatsTimeoutError):
                reply = None
            if reply is not None:
                return None, reply.data.decode(errors="replace")

            async def answer(msg: Any) -> None:
                await msg.respond(self.owner.encode())

            sub = await self.conn.client.subscribe(subject, cb=answer)
            return sub._id, ""

        sid, other = self.conn.run(claim())
        if sid is None:
            raise GroupConfigError(
                f"Group {self.group!r} on stream {self.stream!r} is already read by a running query ({other}): stop "
                "that query first; two queries on one group would steal each other's messages."
            )
        self._sid = sid

    def release(self) -> None:
        if self._sid is None:
            return
        sid, self._sid = self._sid, None
        sub = self.conn.client._subs.get(sid)
        if sub is not None:
            self.conn.run(sub.unsubscribe(), timeout=5)
