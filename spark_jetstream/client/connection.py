"""Connections to NATS: one asyncio loop per process, a sync facade, a cache keyed by options.

Spark calls the connector from plain threads (the driver's reader, executor tasks), while
nats-py is asyncio. Each process therefore runs one event loop in a daemon thread; sync code
submits coroutines to it. Connections are cached per process by their options, so the
driver keeps one connection per query and reused executor workers keep theirs across
micro-batches. The client itself, and how it connects, is ``nats_client``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.client.nats_client import RawClient, open_client
from spark_jetstream.client.protocol import BulkHandler, RawHandler
from spark_jetstream.errors import ClusterUnavailableError, ConnectError

__all__ = [
    "ATTEMPT_TIMEOUT",
    "CLUSTER_BUSY_CODES",
    "DISCONNECTED",
    "JETSTREAM_ABSENT",
    "JETSTREAM_ELECTING",
    "JETSTREAM_UP",
    "Connection",
    "ConnectionOptions",
    "NoAnswerError",
    "close_all",
    "connect",
    "disconnect",
    "event_loop",
]

T = TypeVar("T")

ATTEMPT_TIMEOUT = 2.0
"""Seconds one API request waits before it is sent again (a request sent into a dropped connection is lost)."""

JETSTREAM_UP = "up"
JETSTREAM_ELECTING = "electing"
JETSTREAM_ABSENT = "absent"
DISCONNECTED = "disconnected"

CLUSTER_BUSY_CODES = frozenset({10008, 10009})
"""JetStream API errors that mean "no leader right now": 10008 *JetStream system temporarily unavailable*
(a member of a leaderless group, or any server while the meta group has no leader), 10009 *JetStream
cluster can not handle request*."""

_WATCH_INTERVAL = 1.0
"""Seconds between looks at JetStream while a request keeps failing (the wording of the error at the deadline)."""


class _LoopThread:
    """The process's event loop, running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self.loop.run_forever, name="spark-jetstream-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("sync facade called on the event loop thread: it would wait for itself forever")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise


_loop_lock = threading.Lock()
_loop: _LoopThread | None = None


def event_loop() -> _LoopThread:
    """This process's loop thread (a forked child gets a fresh one)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.pid != os.getpid():
            _loop = _LoopThread()
            _connections.clear()
        return _loop


class NoAnswerError(ConnectError):
    """An API request about a stream or consumer got no answer (no responders while JetStream answers,
    or a timeout): it has no leader right now, or does not exist (``request_async`` with
    ``unanswered_error``; ``jsapi`` asks the meta leader which)."""


class Connection:
    """One connected NATS client plus the sync facade the rest of the connector uses."""

    def __init__(self, options: ConnectionOptions, client: RawClient, runner: _LoopThread) -> None:
        self.options = options
        self.client = client
        self.runner = runner

    def __repr__(self) -> str:
        return f"Connection(server={self.server_url!r}, auth={self.options.describe_auth()})"

    @property
    def server_url(self) -> str:
        url = self.client.connected_url
        return f"{url.scheme}://{url.hostname}:{url.port}" if url else self.options.shown_servers

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.runner.loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.runner.run(coro, timeout)

    async def request_async(
        self, subject: str, payload: bytes, timeout: float, asset: str = "", unanswered_error: bool = False
    ) -> bytes:
        """A request, retried with backoff for up to ``timeout`` seconds while nobody answers: a
        restarting server or a JetStream leader election heals within that, a wrong domain does not.

        No responders to an API request while JetStream itself answers (``$JS.API.INFO``) means the
        stream's or consumer's leader is missing (an election), so it is retried to the end like a
        timeout; no responders from JetStream too means a wrong domain or no JetStream, refused after
        ``connectTimeout``, as is a publish (not an API subject) that no stream takes. ``asset``
        ("consumer 'c' on stream 's'") names what the error talks about. With ``unanswered_error``
        an attempt that timed out, or found no responders while JetStream answers, raises
        ``NoAnswerError``: the caller finds out whether the asset exists at all (RESET of a consumer
        that does not exist is never answered) and retries within its own deadline.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Nobody listening is the answer a wrong domain gives at once: give up on it sooner.
        responder_deadline = loop.time() + min(timeout, self.options.connect_timeout)
        watch = _ClusterWatch(self, subject)
        delay = 0.05
        try:
            while True:
                attempt = max(0.05, min(deadline - loop.time(), ATTEMPT_TIMEOUT))
                try:
                    msg = await self.client.request(subject, payload, timeout=attempt)
                    return msg.data
                except NoRespondersError:
                    watch.saw("no responders")
                    if unanswered_error and watch.jetstream == JETSTREAM_UP:
                        raise NoAnswerError(f"No responder for {subject} although JetStream answers.") from None
                    if loop.time() + delay < responder_deadline:
                        pass
                    elif watch.jetstream == JETSTREAM_ABSENT:
                        raise ConnectError(
                            f"No responder for {subject} on {self.server_url}: is JetStream enabled, and is the "
                            f"domain option right (now {self.options.domain or 'none'})?"
                        ) from None
                    elif watch.jetstream == JETSTREAM_UP and not subject.startswith(f"{self.options.api_prefix}."):
                        raise ConnectError(
                            f"No stream answered {subject} on {self.server_url} within "
                            f"{self.options.connect_timeout:g}s although JetStream answers: no stream captures that "
                            "subject, or its stream's leader is being elected."
                        ) from None
                except NatsTimeoutError:
                    watch.saw("timeout")
                    if unanswered_error:
                        raise NoAnswerError(f"{subject} got no answer within {attempt:g}s.") from None
                except ConnectionClosedError:
                    raise ConnectError(f"The connection to {self.server_url} is closed.") from None
                if loop.time() + delay >= deadline:
                    raise ClusterUnavailableError(watch.explain(timeout, asset or subject)) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        finally:
            watch.close()

    async def jetstream_state(self, timeout: float = 1.0) -> str:
        """One look at JetStream through ``$JS.API.INFO`` (answered by the meta leader in a cluster):
        ``JETSTREAM_UP``, ``JETSTREAM_ELECTING`` (no answer, or "temporarily unavailable": the meta
        leader is being elected), ``JETSTREAM_ABSENT`` (no responders: no JetStream in this domain) or
        ``DISCONNECTED`` (the client is reconnecting)."""
        if not self.client.is_connected:
            return DISCONNECTED
        try:
            reply = await self.client.request(f"{self.options.api_prefix}.INFO", b"", timeout=timeout)
        except NoRespondersError:
            return JETSTREAM_ABSENT
        except (NatsTimeoutError, ConnectionClosedError):
            return JETSTREAM_ELECTING if self.client.is_connected else DISCONNECTED
        try:
            error = json.loads(reply.data).get("error") or {}
        except ValueError:
            return JETSTREAM_UP
        return JETSTREAM_ELECTING if error.get("err_code") in CLUSTER_BUSY_CODES else JETSTREAM_UP

    @property
    def api_timeout(self) -> float:
        """How long API requests keep trying: long enough for a server restart or a leader election (a
        raft election takes 4-9 s after a crash; measured at 10 s, a planning call once ran out)."""
        return max(self.options.connect_timeout, 15.0)

    async def subscribe_raw(
        self, handler: RawHandler, subject: str | None = None, bulk: Callable[[int], BulkHandler] | None = None
    ) -> tuple[str, int]:
        """Subscribe ``subject`` (default: a new inbox); its messages go to ``handler`` on the loop thread.

        ``bulk(sid)`` makes a bulk handler that takes runs of the messages first (``protocol``);
        what it leaves goes to ``handler``.
        """
        subject = subject or self.client.new_inbox()
        sub = await self.client.subscribe(subject)
        self.client.raw_handlers[sub._id] = handler
        if bulk is not None:
            self.client.bulk_handlers[sub._id] = bulk(sub._id)
        return subject, sub._id

    async def unsubscribe_raw(self, sid: int) -> None:
        self.client.raw_handlers.pop(sid, None)
        self.client.bulk_handlers.pop(sid, None)
        sub = self.client._subs.get(sid)
        if sub is not None and not self.client.is_closed:
            await sub.unsubscribe()


class _ClusterWatch:
    """What a failing request met, and what JetStream looked like meanwhile: the error at the deadline
    says what was happening (an election, a missing leader, a reconnect) instead of "is the server up?".

    The look at JetStream runs beside the retries (at most one at a time, one per ``_WATCH_INTERVAL``),
    so it never takes time from them.
    """

    def __init__(self, conn: Connection, subject: str) -> None:
        self.conn = conn
        self.subject = subject
        self.seen: dict[str, int] = {}
        self.jetstream = ""
        self._look: asyncio.Task[str] | None = None
        self._looked_at = 0.0

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

    def explain(self, timeout: float, asset: str) -> str:
        """The deadline's error: the actionable sentence first, never advice to re-create anything."""
        self.update()
        seen = ", ".join(f"{what} x{count}" for what, count in self.seen.items())
        within = f"within {timeout:g}s"
        if self.jetstream == DISCONNECTED or not self.conn.client.is_connected:
            return (
                f"The connection to NATS ({self.conn.options.shown_servers}) was down and did not come back "
                f"{within} while asking about {asset}: check that the servers are running ({seen})."
            )
        if self.jetstream == JETSTREAM_ELECTING:
            return (
                f"The JetStream meta leader is being elected: no server answered about {asset} {within} "
                f"({seen}). The cluster lost its meta leader (a server stopped or restarted) and no new one was "
                "elected in time; check that a majority of the servers is up (`nats server report jetstream`)."
            )
        if self.jetstream == JETSTREAM_UP and "no responders" in self.seen:
            return (
                f"The leader of {asset} changed and no new leader answered {within} ({seen}); JetStream itself "
                "answers. Check that a majority of its replicas is up (`nats stream info` / `nats consumer info`)."
            )
        return (
            f"{self.subject} got no answer from {self.conn.server_url} {within} ({seen}): is the server up, or is "
            "a JetStream leader election under way?"
        )


_connections: dict[ConnectionOptions, Connection] = {}
_connect_lock = threading.Lock()


def connect(options: ConnectionOptions) -> Connection:
    """The process's connection for ``options``, connecting on first use."""
    runner = event_loop()
    with _connect_lock:
        conn = _connections.get(options)
        if conn is not None and not conn.client.is_closed:
            return conn
        client = runner.run(open_client(options), timeout=options.connect_timeout + 5)
        conn = _connections[options] = Connection(options, client, runner)
        return conn


def disconnect(options: ConnectionOptions) -> None:
    """Close this process's cached connection for ``options``, if any."""
    runner = event_loop()
    with _connect_lock:
        conn = _connections.pop(options, None)
        if conn is not None and not conn.client.is_closed:
            runner.run(conn.client.close(), timeout=5)


def close_all() -> None:
    """Close this process's cached connections (tests and the CLI call it on exit)."""
    runner = event_loop()
    with _connect_lock:
        for conn in _connections.values():
            if not conn.client.is_closed:
                runner.run(conn.client.close(), timeout=5)
        _connections.clear()
