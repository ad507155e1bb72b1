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
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.client.features import Feature, Version, require, supports
from spark_jetstream.client.nats_client import RawClient, open_client, server_address, server_version
from spark_jetstream.client.protocol import BulkHandler, RawHandler

__all__ = [
    "ATTEMPT_TIMEOUT",
    "CLUSTER_BUSY_CODES",
    "DIRECT_ATTEMPT",
    "DIRECT_FIRST_REPLY",
    "DIRECT_MAX_WAIT",
    "DISCONNECTED",
    "JETSTREAM_ABSENT",
    "JETSTREAM_ELECTING",
    "JETSTREAM_UP",
    "Connection",
    "ConnectionOptions",
    "close_all",
    "connect",
    "disconnect",
    "event_loop",
]

T = TypeVar("T")

ATTEMPT_TIMEOUT = 2.0
"""Seconds one request waits before it is sent again (a request sent into a dropped connection is lost)."""
DIRECT_ATTEMPT = 1.0
"""Seconds a Direct Get waits for its next reply before it is sent again: a replica answers within milliseconds,
and one routed to a silent replica (frozen, or cut off: the other servers route to it for minutes) is lost, a
third of them on an R3 stream with its leader frozen (measured)."""
DIRECT_FIRST_REPLY = 0.25
"""The least a Direct Get waits for its first reply before asking again (``Connection.direct_wait``): the replicas
share Direct Gets at random, a silent one swallowing its share of every reader's requests for as long as its
routes stay up (decision 0026), so each lost one must cost little."""
DIRECT_MAX_WAIT = 8.0
"""The most a Direct Get waits for a reply before asking again, reached by doubling the wait per attempt that got
none: a server short of CPU answers seconds late, and one asked again sooner than it answers never gets ahead (the
earlier requests' work is done all the same; a reply to an abandoned inbox is lost)."""

JETSTREAM_UP = "up"
JETSTREAM_ELECTING = "electing"
JETSTREAM_ABSENT = "absent"
DISCONNECTED = "disconnected"

CLUSTER_BUSY_CODES = frozenset({10008, 10009})
"""JetStream API errors that mean "no leader right now": 10008 *JetStream system temporarily unavailable*
(a member of a leaderless group, or any server while the meta group has no leader), 10009 *JetStream
cluster can not handle request*."""


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


class Connection:
    """One connected NATS client plus the sync facade the rest of the connector uses."""

    def __init__(self, options: ConnectionOptions, client: RawClient, runner: _LoopThread) -> None:
        self.options = options
        self.client = client
        self.runner = runner
        self.reply_time = 0.0  # the slowest recent first reply to a Direct Get, decaying (``direct_wait``)

    def __repr__(self) -> str:
        return f"Connection(server={self.server_url!r}, auth={self.options.describe_auth()})"

    @property
    def server_url(self) -> str:
        url = self.client.connected_url
        return f"{url.scheme}://{url.hostname}:{url.port}" if url else self.options.shown_servers

    @property
    def server_version(self) -> Version:
        return server_version(self.client)[0]

    def supports(self, feature: Feature) -> bool:
        """Whether the server this connection is on has ``feature`` (``client.features``)."""
        return supports(self.server_version, feature)

    def require(self, feature: Feature, fix: str = "") -> None:
        """Raise ``ServerTooOldError`` naming ``feature``, the server's version and the one needed, unless the server
        has it; ``fix``: what else the user can do (", or ...")."""
        found, shown = server_version(self.client)
        require(found, shown, server_address(self.client, self.options), feature, fix)

    def direct_wait(self, stalled: int) -> float:
        """Seconds a Direct Get waits for its first reply after ``stalled`` attempts of it in a row ran out of time
        with the server still at work (``asked_too_soon``): four times the slowest recent first reply and at least
        ``DIRECT_FIRST_REPLY``, doubled per such attempt (a busy server is asked less often, not given up on), at
        most ``DIRECT_MAX_WAIT``."""
        return min(DIRECT_MAX_WAIT, max(DIRECT_FIRST_REPLY, 4 * self.reply_time) * 2**stalled)

    async def asked_too_soon(self) -> bool:
        """After a Direct Get got no reply in time: whether to wait longer for the next (``direct_wait``'s
        ``stalled``). The server the connection is on answers a Direct Get of its own replica inline, before
        anything sent after it, so a PONG later than a first reply is due says it is still at work on it (a server
        short of CPU: asked again sooner, it never gets ahead); a prompt PONG says the request went to a replica
        elsewhere that did not answer (a silent one gets a third of them on R3), asked again as soon."""
        return await self.client.busy_for(self.direct_wait(0))

    def replied(self, seconds: float) -> None:
        """A Direct Get's first reply came ``seconds`` after its request (``direct_wait``)."""
        self.reply_time = max(seconds, 0.8 * self.reply_time)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.runner.loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.runner.run(coro, timeout)

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

    def out_of_time(self, started: float) -> float:
        """The deadline (seconds) a request that has got nowhere since ``started`` (``time.monotonic()``) has run out
        of, 0 while it has not: ``requestTimeout`` (60 s, Kafka's ``default.api.timeout.ms``), whether its server
        answers the connection late (short of CPU, working off a backlog) or no server answers at all (a whole cluster
        restarting, decision 0043)."""
        waited = time.monotonic() - started
        return self.options.request_timeout if waited >= self.options.request_timeout else 0.0

    def unanswered(self, what: str, waited: float, seen: str = "") -> str:
        """The give-up sentence for a request the server it went through answered the connection around: slow, not
        silent. ``what``: the request ("Direct Get on stream 'S'"); ``seen``: what its attempts met."""
        return (
            f"{what} got no answer within {waited:g}s{f' ({seen})' if seen else ''} through {self.server_url}, "
            "which answered the connection's pings all along: the server is up but too slow to answer (short of CPU "
            "or disk, or working off a backlog), or the JetStream leader it needs was not elected. Check the "
            f"server's load (`nats server list`), or wait longer with requestTimeout (now "
            f"{self.options.request_timeout:g}s)."
        )

    async def subscribe_raw(
        self,
        handler: RawHandler,
        subject: str | None = None,
        bulk: Callable[[int], BulkHandler] | None = None,
        owed: Callable[[], int] | None = None,
    ) -> tuple[str, int]:
        """Subscribe ``subject`` (default: a new inbox); its messages go to ``handler`` on the loop thread.

        ``bulk(sid)`` makes a bulk handler that takes runs of the messages first (``protocol``);
        what it leaves goes to ``handler``. ``owed()``: a bulk read's messages still to come for requests already
        sent; while that is large, short reads wait to be gathered into larger ones (``RawClient._read_loop``).
        """
        subject = subject or self.client.new_inbox()
        sub = await self.client.subscribe(subject)
        self.client.raw_handlers[sub._id] = handler
        if bulk is not None:
            self.client.bulk_handlers[sub._id] = bulk(sub._id)
        if owed is not None:
            self.client.gathering[sub._id] = owed
        return subject, sub._id

    async def unsubscribe_raw(self, sid: int) -> None:
        self.client.raw_handlers.pop(sid, None)
        self.client.bulk_handlers.pop(sid, None)
        self.client.gathering.pop(sid, None)
        sub = self.client._subs.get(sid)
        if sub is not None and not self.client.is_closed:
            await sub.unsubscribe()


_connections: dict[ConnectionOptions, Connection] = {}
_connect_lock = threading.Lock()


def process_role() -> str:
    """What this process is to Spark: ``task`` for its pooled Python workers (tasks, data source planning), which
    outlive the work that made their connections; ``query`` for the process running a streaming query's reader (one
    per query run, on the driver); else ``""`` (a driver, the command line). Connections carry it in their name
    (``spark-jetstream query``), so the server's connection list tells them apart."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name if spec is not None else ""
    if name in ("pyspark.daemon", "pyspark.worker") or name.startswith("pyspark.sql.worker."):
        return "task"
    return "query" if name == "pyspark.sql.streaming.python_streaming_source_runner" else ""


def connect(options: ConnectionOptions) -> Connection:
    """The process's connection for ``options``, connecting on first use (again once it closed).

    One made in a pooled Spark Python worker stops reconnecting after twice the API deadline and closes: the worker
    keeps it after its task, and one dialing a server gone for good would, forever, connect to whatever listens on
    that port later (Spark's listener for a Python worker connecting back failed a query so). A driver's, and the
    streaming reader's, keep reconnecting: a query outlives an outage between batches."""
    event_loop()  # first: in a forked child it drops the parent's connections before the lookup
    with _connect_lock:
        conn = _connections.get(options)
        if conn is not None and not conn.client.is_closed:
            return conn
        role = process_role()
        reconnect_for = 2 * options.request_timeout if role == "task" else None
        conn = _connections[options] = open_connection(options, reconnect_for, f"spark-jetstream {role}".strip())
        return conn


def open_connection(options: ConnectionOptions, reconnect_for: float | None, name: str) -> Connection:
    """A new connection for ``options`` on the process's event loop, cached nowhere: its caller closes it
    (``connect`` caches what it opens). ``reconnect_for``, ``name``: as ``nats_client.open_client``'s."""
    runner = event_loop()
    client = runner.run(open_client(options, reconnect_for, name), timeout=options.connect_timeout + 5)
    return Connection(options, client, runner)


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
