"""Who reads a group: one live query at a time, made visible as a core-NATS responder.

The running query answers requests on ``owner_subject``; a second query asks there first and is refused with the
owner's host, pid and start time. The responder dies with its process, so a crashed query never blocks its own restart
(a timestamp lease would). Only an answer that is the owner written into the group's member consumers' metadata
(``groups.layout.OWNER_METADATA_KEY``) counts: another client answering on the subject (a catch-all responder, a
test tool) is not taken for a query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_jetstream.client.connection import Connection
from spark_jetstream.errors import GroupConfigError

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription

log = logging.getLogger(__name__)

_ASK_TIMEOUT = 0.5
"""Seconds a live owner has to answer: its responder runs on an idle driver's event loop."""
_ECHO_TIMEOUT = 2.0
"""Seconds this query's own responder has to answer it (a refused subscription gets no responders at once)."""


def owner_subject(api_prefix: str, stream: str, group: str) -> str:
    """``_SPARK_JETSTREAM.owner.<stream>.<group>``; for a stream reached through another JetStream domain or an
    imported API, ``_SPARK_JETSTREAM.owner.<api prefix>.<stream>.<group>``: same-named streams of two domains are two
    groups. (A stream name has no dots, so the two forms never meet.)"""
    scope = "" if api_prefix == "$JS.API" else f"{api_prefix}."
    return f"_SPARK_JETSTREAM.owner.{scope}{stream}.{group}"


def describe_this_process() -> str:
    """How the owner is shown to a refused query and in the member consumers' metadata (to the millisecond: two runs
    of one process tell their consumers apart)."""
    return f"{socket.gethostname()}:{os.getpid()} since {datetime.now(UTC).isoformat(timespec='milliseconds')}"


class GroupClaim:
    """This query's claim on a group: taken by ``claim``, given up by ``release`` (safe to call twice)."""

    def __init__(
        self, conn: Connection, stream: str, group: str, owner: Callable[[], str], recorded: Callable[[], set[str]]
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.group = group
        self.owner = owner  # what this query answers: the owner its member consumers name, once they are made
        self.recorded = recorded  # the owners the member consumers' metadata names now
        self.subject = owner_subject(conn.options.api_prefix, stream, group)
        self._responder: Subscription | None = None

    def claim(self, before_answering: Callable[[], None]) -> None:
        """Refuse while another live query reads the group; else run ``before_answering`` (write this query into the
        member consumers' metadata, which its answers then match) and answer for the group ourselves.

        Only "no owner answered" (no responders, no answer in time, or answers that are not the owner the member
        consumers name) means the group is free; any other failure (a closed connection) is raised, not read as
        "free". The server reports a permissions violation on the owner subject asynchronously, so it is looked for
        after a timeout, and the new responder is asked once: without those permissions the guard cannot work.
        """
        subject, owners = self.subject, self.recorded()
        answers, silent = self.conn.run(self._ask(_ASK_TIMEOUT, until=lambda answer: answer in owners))
        if live := [answer for answer in answers if answer in owners]:
            raise GroupConfigError(
                f"Group {self.group!r} on stream {self.stream!r} is already read by a running query ({live[0]}): "
                "stop that query first; two queries on one group would steal each other's messages."
            )
        if answers:
            log.warning(
                "Something answers on %s (%r) that is not the owner the member consumers of group %r name, so not a "
                "query of this group: claiming it",
                subject,
                answers[0][:200],
                self.group,
            )
        elif not silent:
            self._check_permission(subject)
        before_answering()

        async def answer_for_it() -> Subscription:
            async def answer(msg: Any) -> None:
                await msg.respond(self.owner().encode())

            sub = await self.conn.client.subscribe(subject, cb=answer)
            # the server may refuse the SUB after answering a flush: hear the responder itself
            heard, _ = await self._ask(_ECHO_TIMEOUT, until=lambda answer: answer == self.owner())
            if self.owner() not in heard:
                await sub.unsubscribe()
                await self.conn.client.flush(timeout=_ECHO_TIMEOUT)  # give the server's -ERR time to arrive
                self._check_permission(subject)
                raise GroupConfigError(
                    f"This query's owner responder on {subject} does not answer, so another query could not tell "
                    f"that it reads group {self.group!r}: the NATS user needs publish and subscribe on that subject, "
                    "and allow_responses to answer (`spark-jetstream rights` prints what a read needs)."
                )
            return sub

        self._responder = self.conn.run(answer_for_it())

    async def _ask(self, timeout: float, until: Callable[[str], bool]) -> tuple[list[str], bool]:
        """Every answer to one request on the owner subject within ``timeout``, or up to the first that ``until``
        takes, and whether the server said at once that nobody listens (its no-responders status)."""
        client, answers, done = self.conn.client, [], asyncio.Event()
        silent = False

        async def heard(msg: Any) -> None:
            nonlocal silent
            if msg.headers and msg.headers.get("Status") == "503":
                silent = True
                done.set()
                return
            answers.append(msg.data.decode(errors="replace"))
            if until(answers[-1]):
                done.set()

        inbox = client.new_inbox()
        sub = await client.subscribe(inbox, cb=heard)
        try:
            await client.publish(self.subject, b"", reply=inbox)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        finally:
            await sub.unsubscribe()
        return answers, silent

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
