"""Connections to NATS: one asyncio loop per process, a sync facade, a cache keyed by options.

Spark calls the connector from plain threads (the driver's reader, executor tasks), while
nats-py is asyncio. Each process therefore runs one event loop in a daemon thread; sync code
submits coroutines to it. Connections are cached per process by their options, so the
driver keeps one connection per query and reused executor workers keep theirs across
micro-batches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import ssl
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nkeys
from nats.aio.client import Client as _NatsClient
from nats.errors import AuthorizationError, ConnectionClosedError, NoRespondersError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from .errors import ClusterUnavailableError, ConnectError, JetStreamError, ServerTooOldError, redact
from .options import CONNECTION_OPTIONS, config_values, default_of, parse_options
from .protocol import BulkHandler, FastParser, RawHandler, wire

log = logging.getLogger(__name__)

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

MIN_SERVER_VERSION = (2, 14, 5)
"""Consumer RESET needs 2.14; non-JSON pulls could crash priority-group consumers before 2.14.5."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Where and how to connect. Hashable: it is the connection cache key. Secrets stay out of repr."""

    servers: tuple[str, ...] = default_of("servers")
    creds: str | None = None
    nkey: str | None = None
    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    domain: str | None = None
    connect_timeout: float = default_of("connectTimeout")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ConnectionOptions:
        """Build from parsed option values (see ``options.CONNECTION_OPTIONS``)."""
        return cls(**config_values(cls, options))

    @classmethod
    def parse(cls, raw: dict[str, str]) -> ConnectionOptions:
        """Parse user option strings that are only connection options."""
        return cls.from_options(parse_options(raw, CONNECTION_OPTIONS))

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"ConnectionOptions({shown})")

    @property
    def api_prefix(self) -> str:
        return f"$JS.{self.domain}.API" if self.domain else "$JS.API"

    @property
    def shown_servers(self) -> str:
        """The servers option as messages show it: any password or token in a URL is ``***``."""
        return redact(", ".join(self.servers))

    @property
    def wants_tls(self) -> bool:
        """TLS was asked for (a ``tls://`` or ``wss://`` URL, or any ``tls.*`` option): never connect without it."""
        tls_urls = any(urlsplit(url).scheme in ("tls", "wss") for url in self.servers)
        return tls_urls or any((self.tls_ca, self.tls_cert, self.tls_key))

    def describe_auth(self) -> str:
        """Which authentication is configured, without any secret."""
        in_url = [urlsplit(url) for url in self.servers]
        kinds = [
            name
            for name, value in (
                ("creds", self.creds),
                ("nkey", self.nkey),
                ("token", self.token),
                ("user/password", self.user),
                ("user/password in the servers URL", any(u.password is not None for u in in_url)),
                ("token in the servers URL", any(u.username and u.password is None for u in in_url)),
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


class NoAnswerError(ConnectError):
    """An API request about a stream or consumer got no answer (no responders while JetStream answers,
    or a timeout): it has no leader right now, or does not exist (``request_async`` with
    ``unanswered_error``; ``jsapi`` asks the meta leader which)."""


class TlsNotOfferedError(NatsError):
    """The server offered no TLS although TLS was asked for: nothing (no credential) was sent to it."""


class _RawClient(_NatsClient):
    """nats-py client that hands messages of registered subscriptions over raw, and never sends
    CONNECT (the credentials) over plain text when TLS was asked for.

    The pull hot path needs the raw header block (repeated header keys, the pin id) and no
    per-message ``Msg`` object, header dict or queue hop; every other subscription is untouched.
    """

    def __init__(self, require_tls: bool = False) -> None:
        super().__init__()
        self.raw_handlers: dict[int, RawHandler] = {}
        self.bulk_handlers: dict[int, BulkHandler] = {}
        self._ps = FastParser(self)
        self.require_tls = require_tls

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        """A server that offers TLS without requiring it (``allow_non_tls``) is asked for it: nats-py
        upgrades when ``tls_required`` is set, and ``info`` is the dict it then looks at."""
        if self.require_tls and info.get("tls_available"):
            info["tls_required"] = True
        await super()._process_info(info, initial_connection)

    def _connect_command(self) -> bytes:
        """nats-py switches to TLS only when the server's INFO asks for it, then builds CONNECT (which
        signs the nonce and carries the credentials) right before sending it: the last moment to check
        that the connection really is TLS. Raising here drops the connection with nothing sent; nats-py
        reports the error and tries the next server (initial connect and reconnects alike)."""
        if self.require_tls and not self._tls_active():
            url = self._current_server.uri if self._current_server else None
            where = f"{url.scheme}://{url.hostname}:{url.port}" if url else "?"
            raise TlsNotOfferedError(
                f"The NATS server at {where} offers no TLS, but TLS was asked for (a tls:// URL or a tls.* "
                "option): nothing was sent to it. Enable TLS on that server, or check the servers option."
            )
        return super()._connect_command()

    def _tls_active(self) -> bool:
        writer = getattr(self._transport, "_io_writer", None)  # TcpTransport
        if writer is not None:
            return writer.get_extra_info("ssl_object") is not None
        return bool(self._current_server and self._current_server.uri.scheme == "wss")  # aiohttp's websocket

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
    if not options.wants_tls:
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


_CREDS_BLOCK = re.compile(r"-{3,}\s*BEGIN ([A-Z ]+?)\s*-{3,}\s*\n\s*(\S+)")
"""A block of a creds file as nsc writes it: ``-----BEGIN USER NKEY SEED-----`` and the line below."""


def _is_seed(text: str | None) -> bool:
    try:
        return text is not None and nkeys.from_seed(bytearray(text.encode())) is not None
    except Exception:  # nkeys raises its own errors and binascii's for malformed base32
        return False


def _check_credential_files(options: ConnectionOptions) -> None:
    """Refuse a creds or nkey file that is missing or holds no usable key before connecting: nats-py
    would fail on it with an empty message or as an authorization error from the server."""
    for name, path in (("creds", options.creds), ("nkey", options.nkey)):
        if not path:
            continue
        if not os.path.isfile(path):
            raise ConnectError(f"The {name} file {path!r} does not exist or is not a file: check the {name} option.")
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConnectError(f"Cannot read the {name} file {path!r} ({exc}): check the {name} option.") from None
        blocks = dict(match.groups() for match in _CREDS_BLOCK.finditer(text))
        if name == "nkey" and not _is_seed(text.strip()):
            raise ConnectError(
                f"The nkey file {path!r} holds no valid nkey seed: check the nkey option (the file holds one "
                "seed, SU..., as `nk -gen user` writes it)."
            )
        if name == "creds" and not (_is_seed(blocks.get("USER NKEY SEED")) and "NATS USER JWT" in blocks):
            raise ConnectError(
                f"The creds file {path!r} does not hold a user JWT and a valid nkey seed: check the creds option (a "
                ".creds file as `nsc generate creds` writes it)."
            )


def _is_auth_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, AuthorizationError) or "authorization" in text or "authentication" in text


def _explain(errors: list[BaseException], options: ConnectionOptions) -> str:
    """One sentence from what actually went wrong (the most telling of the errors seen), naming the option."""
    servers = options.shown_servers
    within = f"within {options.connect_timeout:g}s"

    def first(*kinds: type[BaseException]) -> BaseException | None:
        return next((e for e in errors if isinstance(e, kinds)), None)

    def detail(exc: BaseException) -> str:
        return str(exc).strip() or type(exc).__name__  # nats-py raises some errors with empty messages

    if (tls := first(TlsNotOfferedError)) is not None:
        return str(tls)
    if any(_is_auth_error(e) for e in errors):
        auth = options.describe_auth()
        if auth == "no credentials":
            return (
                f"The NATS server at {servers} requires credentials, and none were given: set the creds, nkey, "
                "token or user and password option."
            )
        return (
            f"The NATS server at {servers} refused the credentials ({auth}): check the creds, nkey, token or "
            "user/password options."
        )
    if (handshake := first(ssl.SSLError, ssl.CertificateError)) is not None:
        return f"TLS handshake with {servers} failed: check tls.ca, tls.cert and tls.key ({detail(handshake)})."
    if (key := first(nkeys.NkeysError)) is not None:
        return f"The nkey seed of the creds or nkey option is not valid ({detail(key)}): check that option."
    if first(ConnectionRefusedError) is not None:
        return (
            f"Cannot reach a NATS server at {servers} {within}: the connection was refused (nothing listens "
            "there): check the servers option and that nats-server is running."
        )
    if (unknown_host := first(socket.gaierror)) is not None:
        return (
            f"Cannot reach a NATS server at {servers}: the host name does not resolve ({detail(unknown_host)}): "
            "check the servers option."
        )
    if first(TimeoutError, NatsTimeoutError) is not None or not errors:
        return (
            f"Cannot reach a NATS server at {servers} {within}: no answer (timed out): check the servers option "
            "and firewalls; raise connectTimeout for a slow network."
        )
    if (network := first(OSError)) is not None:
        return f"Cannot reach a NATS server at {servers} {within} ({detail(network)}): check the servers option."
    last = errors[-1]
    what = f"{type(last).__name__}: {str(last).strip()}" if str(last).strip() else type(last).__name__
    return f"Connecting to the NATS server at {servers} failed ({what}): check the servers and connection options."


async def _open(options: ConnectionOptions) -> _RawClient:
    _check_credential_files(options)
    tls = _tls_context(options)
    errors: list[BaseException] = []
    refused = asyncio.Event()  # retrying refused credentials or a server without TLS is pointless: fail at once

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)
        log.debug("nats client error: %s", type(exc).__name__)
        if _is_auth_error(exc) or isinstance(exc, TlsNotOfferedError):
            refused.set()

    client = _RawClient(require_tls=options.wants_tls)
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
        where = f"{url.hostname}:{url.port}" if url else options.shown_servers
        raise ServerTooOldError(
            f"The NATS server at {where} runs version {version or 'unknown'}, but spark-jetstream needs "
            f"nats-server {needed} or newer (priority groups and consumer RESET): upgrade the server."
        )
