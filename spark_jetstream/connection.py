"""Connections to NATS: one asyncio loop per process, a sync facade, a cache keyed by options.

Spark calls the connector from plain threads (the driver's reader, executor tasks), while
nats-py is asyncio. Each process therefore runs one event loop in a daemon thread; sync code
submits coroutines to it. Connections are cached per process by their options, so the
driver keeps one connection per query and reused executor workers keep theirs across
micro-batches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from nats.aio.client import Client as _NatsClient
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from .errors import ConnectError, JetStreamError, ServerTooOldError
from .options import CONNECTION_OPTIONS, parse_options
from .protocol import BulkHandler, FastParser, RawHandler, wire

log = logging.getLogger(__name__)

T = TypeVar("T")

_ATTEMPT_TIMEOUT = 2.0
"""Seconds one API request waits before it is sent again (a request sent into a dropped connection is lost)."""

MIN_SERVER_VERSION = (2, 14, 5)
"""Consumer RESET needs 2.14; non-JSON pulls could crash priority-group consumers before 2.14.5."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Where and how to connect. Hashable: it is the connection cache key. Secrets stay out of repr."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    creds: str | None = None
    nkey: str | None = None
    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    domain: str | None = None
    connect_timeout: float = 5.0

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ConnectionOptions:
        """Build from parsed option values (see ``options.CONNECTION_OPTIONS``)."""
        by_attr = {f.name: f.name for f in fields(cls)}
        kwargs = {}
        for name, value in options.items():
            attr = re.sub(r"(?<!^)(?=[A-Z])", "_", name.replace(".", "_")).lower()
            if attr in by_attr:
                kwargs[attr] = value
        return cls(**kwargs)

    @classmethod
    def parse(cls, raw: dict[str, str]) -> ConnectionOptions:
        """Parse user option strings that are only connection options."""
        return cls.from_options(parse_options(raw, CONNECTION_OPTIONS))

    @property
    def api_prefix(self) -> str:
        return f"$JS.{self.domain}.API" if self.domain else "$JS.API"

    def describe_auth(self) -> str:
        """Which authentication is configured, without any secret."""
        kinds = [
            name
            for name, value in (
                ("creds", self.creds),
                ("nkey", self.nkey),
                ("token", self.token),
                ("user/password", self.user),
            )
            if value
        ]
        return ", ".join(kinds) or "no credentials"


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


class _RawClient(_NatsClient):
    """nats-py client that hands messages of registered subscriptions over raw.

    The pull hot path needs the raw header block (repeated header keys, the pin id) and no
    per-message ``Msg`` object, header dict or queue hop; every other subscription is untouched.
    """

    def __init__(self) -> None:
        super().__init__()
        self.raw_handlers: dict[int, RawHandler] = {}
        self.bulk_handlers: dict[int, BulkHandler] = {}
        self._ps = FastParser(self)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        bulk = self.bulk_handlers.get(sid)
        if bulk is not None:  # nats-py's parser had this one (rare): give the bulk handler its chance
            message = bytearray(wire(sid, subject, reply, data, headers))
            with memoryview(message) as view:
                if bulk(message, view, 0):
                    return
        handler = self.raw_handlers.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
        else:
            handler(subject, reply, data, headers)


class Connection:
    """One connected NATS client plus the sync facade the rest of the connector uses."""

    def __init__(self, options: ConnectionOptions, client: _RawClient, runner: _LoopThread) -> None:
        self.options = options
        self.client = client
        self.runner = runner

    def __repr__(self) -> str:
        return f"Connection(server={self.server_url!r}, auth={self.options.describe_auth()})"

    @property
    def server_url(self) -> str:
        url = self.client.connected_url
        return f"{url.scheme}://{url.hostname}:{url.port}" if url else ",".join(self.options.servers)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.runner.loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.runner.run(coro, timeout)

    async def request_async(self, subject: str, payload: bytes, timeout: float) -> bytes:
        """A request, retried with backoff for up to ``timeout`` seconds while nobody answers: a
        restarting server or a JetStream leader election heals within that, a wrong domain does not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Nobody listening is the answer a wrong domain gives at once: give up on it sooner.
        responder_deadline = loop.time() + min(timeout, self.options.connect_timeout)
        delay = 0.05
        while True:
            attempt = max(0.05, min(deadline - loop.time(), _ATTEMPT_TIMEOUT))
            try:
                msg = await self.client.request(subject, payload, timeout=attempt)
                return msg.data
            except NoRespondersError:
                if loop.time() + delay >= responder_deadline:
                    raise ConnectError(
                        f"No responder for {subject} on {self.server_url}: is JetStream enabled, and is the "
                        f"domain option right (now {self.options.domain or 'none'})?"
                    ) from None
            except NatsTimeoutError:
                if loop.time() + delay >= deadline:
                    raise ConnectError(
                        f"{subject} got no answer from {self.server_url} within {timeout:g}s: is the server up?"
                    ) from None
            except ConnectionClosedError:
                raise ConnectError(f"The connection to {self.server_url} is closed.") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    @property
    def api_timeout(self) -> float:
        """How long API requests keep trying: long enough for a server restart or a leader election."""
        return max(self.options.connect_timeout, 10.0)

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


_connections: dict[ConnectionOptions, Connection] = {}
_connect_lock = threading.Lock()


def connect(options: ConnectionOptions) -> Connection:
    """The process's connection for ``options``, connecting on first use."""
    runner = event_loop()
    with _connect_lock:
        conn = _connections.get(options)
        if conn is not None and not conn.client.is_closed:
            return conn
        client = runner.run(_open(options), timeout=options.connect_timeout + 5)
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


def _tls_context(options: ConnectionOptions) -> ssl.SSLContext | None:
    if not (options.tls_ca or options.tls_cert or any(s.startswith("tls://") for s in options.servers)):
        return None
    if bool(options.tls_cert) != bool(options.tls_key):
        raise ConnectError("Set both tls.cert and tls.key for mutual TLS, or neither.")
    try:
        context = ssl.create_default_context(cafile=options.tls_ca)
        if options.tls_cert:
            context.load_cert_chain(options.tls_cert, options.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConnectError(f"Cannot load the TLS files named by tls.ca/tls.cert/tls.key: {exc}.") from None
    return context


def _check_files(options: ConnectionOptions) -> None:
    for name, path in (("creds", options.creds), ("nkey", options.nkey)):
        if path and not os.path.isfile(path):
            raise ConnectError(f"The {name} file {path!r} does not exist or is not a file.")


def _explain(errors: list[BaseException], options: ConnectionOptions) -> str:
    """Turn nats-py's connect errors into one sentence that says what to do."""
    servers = ", ".join(options.servers)
    text = " ".join(str(e).lower() for e in errors)
    if "authorization" in text or "authentication" in text or "user authentication" in text:
        return (
            f"The NATS server at {servers} refused the credentials ({options.describe_auth()}): "
            "check the creds, nkey, token or user/password options."
        )
    if "ssl" in text or "certificate" in text or "tls" in text:
        detail = next((str(e) for e in errors if "ssl" in str(e).lower() or "cert" in str(e).lower()), "")
        return f"TLS handshake with {servers} failed: check tls.ca, tls.cert and tls.key ({detail})."
    return (
        f"Cannot reach a NATS server at {servers} within {options.connect_timeout:g}s: check the servers "
        "option and that nats-server is running and reachable."
    )


async def _open(options: ConnectionOptions) -> _RawClient:
    _check_files(options)
    tls = _tls_context(options)
    errors: list[BaseException] = []
    refused = asyncio.Event()  # retrying refused credentials is pointless: fail at once

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)
        log.debug("nats client error: %s", type(exc).__name__)
        if "authorization" in str(exc).lower() or "authentication" in str(exc).lower():
            refused.set()

    client = _RawClient()
    kwargs: dict[str, Any] = dict(
        servers=list(options.servers),
        name="spark-jetstream",
        connect_timeout=max(0.1, min(options.connect_timeout, 2.0)),
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        tls=tls,
        user_credentials=options.creds,
        nkeys_seed=options.nkey,
        token=options.token,
        user=options.user,
        password=options.password,
        pending_size=64 * 1024 * 1024,
    )
    connecting = asyncio.ensure_future(client.connect(**{k: v for k, v in kwargs.items() if v is not None}))
    watching = asyncio.ensure_future(refused.wait())
    await asyncio.wait({connecting, watching}, timeout=options.connect_timeout, return_when=asyncio.FIRST_COMPLETED)
    watching.cancel()
    if not connecting.done() or connecting.cancelled() or connecting.exception() is not None:
        if connecting.done() and not connecting.cancelled():
            errors.append(connecting.exception())  # type: ignore[arg-type]
        connecting.cancel()
        await _abandon(client)
        raise ConnectError(_explain(errors, options))
    try:
        _check_version(client, options)
    except JetStreamError:
        await client.close()
        raise
    return client


async def _abandon(client: _RawClient) -> None:
    try:
        await asyncio.wait_for(client.close(), 2)
    except Exception:
        log.debug("closing a failed connection attempt failed", exc_info=True)


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", text or "")
    if not match:
        return (0, 0, 0)
    major, minor, patch = (int(g) for g in match.groups())
    return (major, minor, patch)


def _check_version(client: _RawClient, options: ConnectionOptions) -> None:
    version = client._server_info.get("version", "")
    if parse_version(version) < MIN_SERVER_VERSION:
        needed = ".".join(map(str, MIN_SERVER_VERSION))
        url = client.connected_url
        where = f"{url.hostname}:{url.port}" if url else ",".join(options.servers)
        raise ServerTooOldError(
            f"The NATS server at {where} runs version {version or 'unknown'}, but spark-jetstream needs "
            f"nats-server {needed} or newer (priority groups and consumer RESET): upgrade the server."
        )
