"""Who reads a group: one live query at a time, made visible as a core-NATS responder.

The running query answers requests on ``_SPARK_JETSTREAM.owner.<stream>.<group>``; a second query
asks there first and is refused with the owner's host, pid and start time. The responder dies with
its process, so a crashed query never blocks its own restart (a timestamp lease would).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection import Connection
from spark_jetstream.errors import GroupConfigError

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription

_ASK_TIMEOUT = 0.5
_ECHO_TIMEOUT = 2.0
"""Seconds this query's own responder has to answer it (a refused subscription gets no responders at once)."""
"""Seconds a live owner has to answer: its responder runs on an idle driver's event loop."""


def owner_subject(stream: str, group: str) -> str:
    return f"_SPARK_JETSTREAM.owner.{stream}.{group}"


def describe_this_process() -> str:
    """How the owner is shown to a refused query and in the member consumers' metadata (to the millisecond: two runs
    of one process tell their consumers apart)."""
    return f"{socket.gethostname()}:{os.getpid()} since {datetime.now(UTC).isoformat(timespec='milliseconds')}"


class GroupClaim:
    """This query's claim on a group: taken by ``claim``, given up by ``release`` (safe to call twice)."""

    def __init__(self, conn: Connection, stream: str, group: str, owner: str) -> None:
        self.conn = conn
        self.stream = stream
        self.group = group
        self.owner = owner
        self._responder: Subscription | None = None

    def claim(self) -> None:
        """Refuse while another live query reads the group; then answer for it ourselves.

        Only "nobody answered" (no responders, or no reply in time) means the group is free; any
        other failure (a closed connection) is raised, not read as "free". The server reports a
        permissions violation on the owner subject asynchronously, so it is looked for after a
        timeout, and the new responder is asked once: without those permissions the guard cannot work.
        """
        subject = owner_subject(self.stream, self.group)
        client = self.conn.client

        async def claim() -> tuple[Subscription | None, str]:
            try:
                reply = await client.request(subject, b"", timeout=_ASK_TIMEOUT)
            except NoRespondersError:
                reply = None
            except NatsTimeoutError:
                self._check_permission(subject)
                reply = None
            if reply is not None:
                return None, reply.data.decode(errors="replace")

            async def answer(msg: Any) -> None:
                await msg.respond(self.owner.encode())

            sub = await client.subscribe(subject, cb=answer)
            try:  # the server may refuse the SUB after answering a flush: ask the responder itself
                await client.request(subject, b"", timeout=_ECHO_TIMEOUT)
            except (NoRespondersError, NatsTimeoutError):
                await sub.unsubscribe()
                await client.flush(timeout=_ECHO_TIMEOUT)  # give the server's -ERR time to arrive
                self._check_permission(subject)
                raise GroupConfigError(
                    f"This query's owner responder on {subject} does not answer, so another query could not tell "
                    f"that it reads group {self.group!r}: check the NATS user's permissions on that subject."
                ) from None
            return sub, ""

        responder, other = self.conn.run(claim())
        if responder is None:
            raise GroupConfigError(
                f"Group {self.group!r} on stream {self.stream!r} is already read by a running query ({other}): stop "
                "that query first; two queries on one group would steal each other's messages."
            )
        self._responder = responder

    def _check_permission(self, subject: str) -> None:
        """Raise when the server refused this connection a publish or subscribe on ``subject``."""
        refused = self.conn.client.refused(subject)
        if refused is not None and refused[1] == subject:
            action = refused[0]
            raise GroupConfigError(
                f"The NATS user may not {action} {subject} (a permissions violation): allow it to publish and "
                "subscribe on _SPARK_JETSTREAM.owner.> so a query can tell whether another one already reads "
                f"group {self.group!r}; without that two queries could read one group and steal each other's "
                "messages."
            )

    def release(self) -> None:
        responder, self._responder = self._responder, None
        if responder is not None and not self.conn.client.is_closed:
            self.conn.run(responder.unsubscribe(), timeout=5)
