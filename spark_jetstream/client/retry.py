"""The one retry layer: a request asked again, with backoff, until it is answered or the deadline passes.

A restarting server, a reconnect and a JetStream leader election heal within the deadline (the connection's API
timeout: a raft election takes 4-9 s after a crash); a wrong domain, a stream or consumer the meta leader says is
gone, and a bad request do not, and fail at once with their own errors. At the deadline the one give-up message
says what was happening meanwhile (an election, a missing leader, a lost connection), never "re-create it".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection import (
    ATTEMPT_TIMEOUT,
    DISCONNECTED,
    JETSTREAM_ABSENT,
    JETSTREAM_ELECTING,
    JETSTREAM_UP,
)
from spark_jetstream.errors import ClusterUnavailableError, ConnectError, NotPermittedError

if TYPE_CHECKING:
    from spark_jetstream.client.connection import Connection

T = TypeVar("T")

_WATCH_INTERVAL = 1.0
"""Seconds between looks at JetStream while a request keeps failing (what the give-up message says)."""


class Retry(Exception):
    """Raised by a request's ``answer``: the answer only means "not now" (no leader right now), ask again. A
    signal, not a failure: hence no ``Error`` in its name."""


async def request(
    conn: Connection,
    subject: str,
    payload: bytes,
    asset: str = "",
    answer: Callable[[bytes], Awaitable[T]] | None = None,
    unanswered: Callable[[], Awaitable[None]] | None = None,
) -> T | bytes:
    """Ask ``subject`` until it is answered, or ``conn.out_of_time``: a slow server is waited for, a silent one not.

    ``answer(data)`` turns a reply into the result, or raises ``Retry`` (ask again) or a final error; without it
    the reply's bytes are the result. ``unanswered()`` runs after an attempt that timed out, or found no
    responders while JetStream answers: a stream's or consumer's leader is missing, or the thing is gone, which
    it raises as a final error once confirmed. No responders from JetStream itself as well means a wrong domain
    or no JetStream, refused after the connect timeout. A publish (not an API subject) that no stream takes is
    refused at once when the meta leader says no stream captures the subject (``captured``), and asked again while
    one does: that stream's leader is being elected. ``asset`` ("consumer 'c' on stream 's'") names what the give-up
    message talks about.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    options = conn.options
    responder_deadline = started + min(options.request_timeout, options.connect_timeout)  # a wrong domain: sooner
    watch = _ClusterWatch(conn, subject)
    delay = 0.05
    publish = not subject.startswith(f"{options.api_prefix}.")
    taken: bool | None = None  # whether a stream captures the published subject (``captured``), once answered
    try:
        while True:
            attempt = max(0.05, min(started + conn.options.request_timeout - loop.time(), ATTEMPT_TIMEOUT))
            try:
                reply = await _unless_moved(conn, conn.client.request(subject, payload, timeout=attempt))
                if reply is None:
                    watch.saw("connection moved")
                else:
                    return reply.data if answer is None else await answer(reply.data)
            except Retry as exc:
                watch.saw(str(exc))
            except NoRespondersError:
                watch.saw("no responders")
                if publish and taken is None:
                    taken = await captured(conn, subject)
                if unanswered is not None and watch.jetstream == JETSTREAM_UP:
                    await unanswered()
                elif publish and taken is False:
                    raise ConnectError(
                        f"No stream captures {subject} (the JetStream meta leader at {conn.server_url} says so): "
                        "create one, or fix the subject."
                    ) from None
                elif loop.time() + delay < responder_deadline or (publish and not conn.options.api_import):
                    pass  # a stream captures it (or the meta leader did not say): its leader is being elected
                elif watch.jetstream == JETSTREAM_ABSENT:
                    where = (
                        f"is the apiPrefix option right (now {conn.options.api_import}), and does this account "
                        "import the owning account's JetStream API under it?"
                        if conn.options.api_import
                        else "is JetStream enabled, and is the domain option right (now "
                        f"{conn.options.domain or 'none'}; a stream shared from another account is reached through "
                        "apiPrefix)?"
                    )
                    raise ConnectError(f"No responder for {subject} on {conn.server_url}: {where}") from None
                elif watch.jetstream == JETSTREAM_UP and publish:  # through an imported API: the subject's import
                    raise ConnectError(
                        f"No stream answered {subject} on {conn.server_url} within "
                        f"{conn.options.connect_timeout:g}s although JetStream answers (through the imported API "
                        f"{conn.options.api_import}, where a stream captures it): the account that owns the stream "
                        f"must export {subject.rsplit('.', 1)[0]}.> as a service and this account import it (docs: "
                        "Security guide), or the stream's leader is being elected."
                    ) from None
            except NatsTimeoutError:
                watch.saw("timeout")
                if (refused := conn.client.refused(subject, started)) is not None:
                    raise NotPermittedError(not_permitted(*refused, asset)) from None
                if unanswered is not None:
                    await unanswered()
            except ConnectionClosedError:
                raise ConnectError(f"The connection to {conn.server_url} is closed.") from None
            if deadline := conn.out_of_time(started - delay):
                raise ClusterUnavailableError(await watch.explain(deadline, asset))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    finally:
        watch.close()


async def captured(conn: Connection, subject: str) -> bool | None:
    """Whether a stream captures ``subject``, as the meta leader says (``STREAM.NAMES`` with the subject, one
    attempt); None when it does not answer (its own election). What tells a publish that no stream took (no
    responders) during a stream's election from one to a subject no stream captures."""
    request = json.dumps({"subject": conn.options.stored_subject(subject)}).encode()
    try:
        reply = await conn.client.request(f"{conn.options.api_prefix}.STREAM.NAMES", request, timeout=ATTEMPT_TIMEOUT)
        answer = json.loads(reply.data)
    except (NatsError, ValueError):
        return None
    return None if "error" in answer else bool(answer.get("streams"))


async def _unless_moved(conn: Connection, request: Coroutine[Any, Any, Msg]) -> Msg | None:
    """The reply to ``request``, or None when the connection moved to another server while it waited: a request
    sent to the server left behind (silent, or gone) is never answered, so it is asked again at once instead of at
    the attempt's timeout. A request sent while reconnecting goes out after the move and is waited for."""
    task = asyncio.ensure_future(request)
    if not conn.client.is_connected:
        return await task
    try:
        await asyncio.wait({task, conn.client.moved()}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, NatsError):
        await task
    return None


def not_permitted(action: str, subject: str, asset: str = "") -> str:
    """What a permissions violation that left a request unanswered tells the user."""
    about = f" (asking about {asset})" if asset else ""
    return (
        f"The NATS user may not {action} {subject}{about}: the server refused it (a permissions violation). Allow "
        "it in the user's permissions: `spark-jetstream rights` prints what a read needs, and the Security guide lists "
        "what each kind of read and write needs."
    )


class _ClusterWatch:
    """What a failing request met, and what JetStream looked like meanwhile: the give-up message says what was
    happening (an election, a missing leader, a reconnect) instead of "is the server up?".

    The look at JetStream runs beside the retries (at most one at a time, one per ``_WATCH_INTERVAL``), so it
    never takes time from them.
    """

    def __init__(self, conn: Connection, subject: str) -> None:
        self.conn = conn
        self.subject = subject
        self.seen: dict[str, int] = {}
        self.jetstream = ""
        self._look: asyncio.Task[str] | None = None
        self._looked_at = 0.0
        self._started = time.monotonic()

    def saw(self, what: str) -> None:
        self.seen[what] = self.seen.get(what, 0) + 1
        if self.subject == f"{self.conn.options.api_prefix}.INFO":
            self.jetstream = JETSTREAM_ABSENT if what == "no responders" else JETSTREAM_ELECTING
            return
        self.update()

    def update(self) -> None:
        """Take the last look's result and start the next one if it is time."""
        loop = asyncio.get_running_loop()
        if self._look is not None and self._look.done():
            if not self._look.cancelled() and self._look.exception() is None:
                self.jetstream = self._look.result()
            self._look = None
        if self._look is None and loop.time() - self._looked_at >= _WATCH_INTERVAL:
            self._looked_at = loop.time()
            self._look = loop.create_task(self.conn.jetstream_state())

    def close(self) -> None:
        if self._look is not None:
            self._look.cancel()

    async def explain(self, timeout: float, asset: str) -> str:
        """The give-up message, from a last look at JetStream: the actionable sentence first. A request about a
        named stream or consumer (``asset``) that JetStream answers around has lost its leader; one that only timed
        out while its server answered the connection met a slow server."""
        named, asset = bool(asset), asset or self.subject
        self.close()
        if self.subject != f"{self.conn.options.api_prefix}.INFO":
            self.jetstream = await self.conn.jetstream_state(0.5)
        seen = ", ".join(f"{what} x{count}" for what, count in self.seen.items())
        within = f"within {timeout:g}s"
        if silence := self.conn.client.silence_since(self._started):
            return (
                f"No server answered about {asset} {within} ({seen}){silence}. Check that server and the network "
                "between it and this host; the cluster's other servers went on without it."
            )
        if self.jetstream == DISCONNECTED or not self.conn.client.is_connected:
            return (
                f"The connection to NATS ({self.conn.options.shown_servers}) was down and did not come back "
                f"{within} while asking about {asset}: check that the servers are running ({seen})."
            )
        if self.jetstream == JETSTREAM_UP and (named or set(self.seen) != {"timeout"}):
            return (
                f"The leader of {asset} changed and no new leader answered {within} ({seen}); JetStream itself "
                "answers. Check that a majority of its replicas is up (`nats stream info` / `nats consumer info`)."
            )
        if set(self.seen) == {"timeout"} and self.conn.client.answering():
            return self.conn.unanswered(f"A request about {asset}", timeout, seen)
        if self.jetstream == JETSTREAM_ELECTING:
            return (
                f"The JetStream meta leader is being elected: no server answered about {asset} {within} "
                f"({seen}). The cluster lost its meta leader (a server stopped or restarted) and no new one was "
                "elected in time; check that a majority of the servers is up (`nats server report jetstream`)."
            )
        return (
            f"{self.subject} got no answer from {self.conn.server_url} {within} ({seen}): is the server up, or is "
            "a JetStream leader election under way?"
        )
