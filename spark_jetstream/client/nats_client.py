"""The nats-py client the connector runs on, and opening it: the TLS guard, failing at once on refused
credentials, and the server version check (the credentials and the failure's sentence are ``credentials``'s).

Everything here touches nats-py's internals (``tests/test_nats_py_contract.py`` lists them); the loop
thread, the request retries and the connection cache that use it are in ``connection``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import platform
import re
import socket
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import ParseResult

from nats.aio.client import Client as _NatsClient
from nats.aio.client import RawCredentials, Server
from nats.errors import ProtocolError, StaleConnectionError, UnexpectedEOF
from nats.protocol.parser import Parser

from spark_jetstream.client.connection_options import DEFAULT_SILENCE_TIMEOUT, ConnectionOptions
from spark_jetstream.client.credentials import (
    TlsNotOfferedError,
    check_credentials,
    explain_failure,
    is_auth_error,
    tls_context,
)
from spark_jetstream.client.features import ANY_USE, Version, require
from spark_jetstream.client.protocol import BulkHandler, FastParser, RawHandler
from spark_jetstream.errors import ConnectError, JetStreamError

log = logging.getLogger(__name__)

RECONNECT_WAIT = 0.5
"""Seconds between reconnect attempts to one server."""

READ_SIZE = 1024 * 1024
"""Most bytes one socket read takes (``_Feed``; asyncio's stream reader takes 256 KiB, nats-py's parse 32 KiB): a read
that is behind takes all that waits at once."""
FEED_AHEAD = 4 * READ_SIZE
"""Most bytes the socket hands the parser's buffer between two parses; then it keeps the rest until the next."""
GATHER_OWED = 100
GATHER_BYTES = 1024 * 1024
GATHER_LEAST = 4 * 1024
GATHER_SPAN = 0.001
GATHER_MAX_WAIT = 0.02
"""While the bulk reads in progress are still owed at least ``GATHER_OWED`` messages by requests already sent, the
socket wakes the read loop only once it holds about ``GATHER_BYTES`` (``SO_RCVLOWAT``), or half the bytes still owed,
or what arrives within ``GATHER_MAX_WAIT`` s at the rate the last read showed, whichever is least, and not for less
than ``GATHER_LEAST``; after ``GATHER_MAX_WAIT`` s it wakes it for whatever has come. The server goes on sending
meanwhile. A read that came while the socket gathered arrived since the read before it; one that did not, since the
read or the publish (a request) before it, or within ``GATHER_SPAN`` if that is less (decisions 0024, 0047, 0048)."""


def gather_bytes(size: int, span: float, left: int, got: int) -> int:
    """Bytes the socket should hold before the next read (0: wake for any), after a read of ``size`` bytes that arrived
    over ``span`` s and brought ``got`` owed messages, ``left`` still owed: ``GATHER_BYTES``, or half the bytes still
    owed, or what arrives within ``GATHER_MAX_WAIT`` at that rate, if less."""
    owed = GATHER_BYTES if got <= 0 else size * left / got / 2
    wanted = min(GATHER_BYTES, owed, size / max(span, 1e-6) * GATHER_MAX_WAIT)
    return int(wanted) if wanted >= GATHER_LEAST else 0


SILENT_MEMORY = 60.0
"""Seconds a server that was left for its silence is tried last when the connection moves (a frozen server still
accepts a TCP connection and then says nothing: trying it first costs a whole connect timeout)."""


_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"')
"""A refused publish or subscribe as nats-py hands over the server's ``-ERR`` (lowercased)."""


class RawClient(_NatsClient):
    """nats-py client that hands messages of registered subscriptions over raw, and never sends
    CONNECT (the credentials) over plain text when TLS was asked for.

    The pull hot path needs the raw header block (repeated header keys, the pin id) and no
    per-message ``Msg`` object, header dict or queue hop; every other subscription is untouched.
    """

    def __init__(self, require_tls: bool = False, silence_timeout: float = DEFAULT_SILENCE_TIMEOUT) -> None:
        super().__init__()
        self.raw_handlers: dict[int, RawHandler] = {}
        self.bulk_handlers: dict[int, BulkHandler] = {}
        self.gathering: dict[int, Callable[[], int]] = {}  # sid -> messages that bulk read is owed
        self._ps = FastParser(self)
        self.require_tls = require_tls
        self.violations: dict[tuple[str, str], float] = {}  # ("publish" or "subscription", subject) -> when
        self.silence_timeout = silence_timeout
        self.silenced: dict[str, tuple[float, float]] = {}  # "host:port" -> (when left, seconds it was silent)
        self.heard_at = time.monotonic()  # when bytes last came from a server (``_ping_interval``, ``answering``)
        self.sent_at = 0.0  # when a message was last published (a request: what comes next is its answer)
        self._tried: dict[str, float] = {}  # "host:port" -> when a reconnect last tried it (``next_server``)
        self._moved: asyncio.Future[None] | None = None  # done at the next reconnect (``moved``)
        self.low_water: _LowWater | None = None  # the read loop's socket low-water mark (None: not on a TCP socket)

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        """A server that offers TLS without requiring it (``allow_non_tls``) is asked for it: nats-py
        upgrades when ``tls_required`` is set, and ``info`` is the dict it then looks at."""
        if self.require_tls and info.get("tls_available"):
            info["tls_required"] = True
        await super()._process_info(info, initial_connection)

    async def _process_err(self, err_msg: str) -> None:
        """Remember when the server last refused a publish or subscribe to a subject: it never answers a refused
        request, it only reports the violation (asynchronously) with ``-ERR``, so a request's timeout is explained
        from here (``refused``)."""
        found = _VIOLATION.search(err_msg)
        if found is not None:
            self.violations[(found.group(1), found.group(2))] = asyncio.get_running_loop().time()
        await super()._process_err(err_msg)

    def refused(self, subject: str, since: float = 0.0) -> tuple[str, str] | None:
        """("publish to" or "subscribe to", the subject) when, at or after loop time ``since``, the server refused a
        publish to ``subject`` or a subscription (``subject`` itself, or an inbox that replies come to); else None.
        A refused subscription to another subject (an idle query's on the stream's subjects) is not a request's."""
        wanted = subject.lower()
        inboxes = bytes(self._inbox_prefix).decode().lower()
        for (kind, refused), at in self.violations.items():
            if at >= since and (refused == wanted or (kind == "subscription" and refused.startswith(inboxes))):
                action = "publish to" if kind == "publish" else "subscribe to"
                return action, subject if refused == wanted else refused
        return None

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

    async def _read_loop(self) -> None:
        """nats-py's read loop, with the socket's bytes read straight into the parser's buffer (``_Feed``, decision
        0049) and, while bulk reads are owed many messages, a socket that wakes it only once it holds more
        (``GATHER_OWED``, decision 0048): a reader woken for every few dozen messages spends more CPU on the wake-ups
        than on the messages. Ends as nats-py's does: on close or reconnect; an end of stream, a protocol or socket
        error goes to ``_process_op_err`` (the reconnect)."""
        self.low_water = gather = _LowWater.of(self._transport)
        feed = _Feed.of(self._transport, self._ps)
        read_at = time.monotonic()  # when the last read returned
        try:
            while not (self.is_closed or self.is_reconnecting) and self._transport is not None:
                try:
                    if self._transport.at_eof():
                        eof = UnexpectedEOF()
                        await self._error_cb(eof)
                        await self._process_op_err(eof)
                        return
                    if feed is not None:
                        size = await feed.wait()
                        data = b""
                    else:
                        data = await self._transport.read(READ_SIZE)
                        size = len(data)
                    before, read_at = read_at, time.monotonic()
                    self.heard_at = read_at
                    gathered = gather is not None and gather.read()
                    owed = self._owed() if self.gathering else 0
                    await self._ps.parse(data)
                    if feed is not None:
                        feed.parsed()
                    if gather is not None:
                        left = self._owed() if owed else 0
                        span = read_at - max(before, self.sent_at)
                        span = span if gathered else min(span, GATHER_SPAN)
                        gather.wait_for(gather_bytes(size, span, left, owed - left) if left >= GATHER_OWED else 0)
                except ProtocolError:
                    await self._process_op_err(ProtocolError())
                    return
                except OSError as exc:
                    await self._process_op_err(exc)
                    return
                except asyncio.CancelledError:
                    return
                except Exception:
                    log.exception("nats: reading from the server failed")
                    return
        finally:
            if gather is not None:
                gather.stop()
            if feed is not None:
                feed.close()

    async def _ping_interval(self) -> None:
        """Replaces nats-py's pings (every 2 minutes, stale after 2 unanswered): a frozen server or a silent network
        partition sends nothing and no reset, so a connection that heard nothing from its server for
        ``silence_timeout`` s, though pinged every third of it, leaves it for another server of the pool
        (``_leave_silent``). Anything read counts as heard (a busy connection's PONG may wait behind its data),
        and only this loop's own time counts: a look that comes late (the GIL, a long callback held the loop, so
        what arrived meanwhile is unread) adds nothing to the silence."""
        tick = self.silence_timeout / 3
        silent, last = 0.0, time.monotonic()
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            heard = self.heard_at >= last
            late, last = now - last > 2 * tick, now
            if heard or not self.is_connected:
                silent = 0.0
                continue
            if late:
                continue
            silent += tick
            if silent > self.silence_timeout - tick / 2:
                await self._leave_silent(silent)
                return
            try:
                await self._send_ping()
            except (asyncio.CancelledError, RuntimeError, AttributeError):  # as nats-py's: closing, closed
                return

    async def _process_pong(self) -> None:
        """nats-py's, except that a PONG whose waiter gave up (``flush`` cancels its future on a timeout) is counted and
        dropped: nats-py sets the cancelled future's result, which raises in the read loop and ends it."""
        if self._pongs:
            pong = self._pongs.pop(0)
            if not pong.done():
                pong.set_result(True)
            self._pongs_received += 1
            self._pings_outstanding = 0

    async def busy_for(self, timeout: float) -> bool:
        """Whether the server leaves a PING unanswered for ``timeout`` s while the connection stays on it: it reads the
        connection in order, so a late PONG says it is still at work on what was sent before (the wait is not
        cancelled: a late PONG finds it). A connection that is moving has no server to be busy."""
        if not self.is_connected:
            return False
        reconnects = self.stats["reconnects"]
        pong: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        try:
            await self._send_ping(pong)
        except (AssertionError, AttributeError, RuntimeError, OSError):  # closing, closed
            return False
        done, _ = await asyncio.wait({pong}, timeout=timeout)
        return not done and self.is_connected and self.stats["reconnects"] == reconnects

    async def _leave_silent(self, silent: float) -> None:
        """Drop the connection to a server that stopped talking, at once (its socket aborted: a graceful close
        would wait for the server to read what is buffered), and reconnect to another (``next_server``)."""
        where = server_address(self)
        self.silenced[where] = (time.monotonic(), silent)
        log.warning(
            "nats: the server at %s sent nothing for %.1f s though pinged (frozen, or cut off by the network): "
            "moving the connection to another server",
            where,
            silent,
        )
        writer = getattr(self._transport, "_io_writer", None)  # TcpTransport; a websocket closes as usual
        if writer is not None:
            writer.transport.abort()
        await self._process_op_err(StaleConnectionError())

    def answering(self) -> bool:
        """Whether the server this connection is on answers it: connected, and heard from within the silence timeout
        (pinged when quiet, so a live server is heard at least that often)."""
        return self.is_connected and time.monotonic() - self.heard_at < self.silence_timeout

    def silence_since(self, since: float) -> str:
        """What a request left unanswered since ``since`` (``time.monotonic()``) may be explained by: the servers
        this connection left for their silence meanwhile (``""``: none)."""
        left = [f"{where} sent nothing for {gap:.1f} s" for where, (at, gap) in self.silenced.items() if at >= since]
        if not left:
            return ""
        return (
            f"; the server at {', '.join(left)} though pinged (frozen, or cut off by the network) and the connection "
            f"moved on (now {server_address(self)})"
        )

    def moved(self) -> asyncio.Future[None]:
        """Done when the connection next comes back after a reconnect (to whichever server): what was sent before
        it and not answered yet will not be (``retry``). One future for all waiters until then: don't cancel it."""
        if self._moved is None or self._moved.done():
            self._moved = asyncio.get_running_loop().create_future()
        return self._moved

    async def on_reconnected(self) -> None:
        """nats-py's ``reconnected_cb``: wakes ``moved``'s waiters."""
        if self._moved is not None and not self._moved.done():
            self._moved.set_result(None)

    def next_server(self, servers: list[Server], _info: dict[str, Any]) -> tuple[Server, float]:
        """nats-py's reconnect asks this before each attempt: the server of the pool tried longest ago, those left
        for their silence in the last ``SILENT_MEMORY`` s after all others; the wait keeps ``RECONNECT_WAIT``
        between two attempts on one server."""
        now = time.monotonic()

        def rank(server: Server) -> tuple[bool, float]:
            left = self.silenced.get(_address(server.uri))
            return left is not None and now - left[0] < SILENT_MEMORY, self._tried.get(_address(server.uri), -math.inf)

        chosen = min(servers, key=rank)
        tried = self._tried.get(_address(chosen.uri), -math.inf)
        self._tried[_address(chosen.uri)] = now
        return chosen, max(0.0, tried + RECONNECT_WAIT - now)

    def _owed(self) -> int:
        """Messages the bulk reads in progress are owed by requests already sent."""
        return sum(owed() for owed in self.gathering.values())

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        """nats-py's publish, timed: the read loop measures a reply's rate from its request (``GATHER_SPAN``)."""
        self.sent_at = time.monotonic()
        await super().publish(*args, **kwargs)


def lowering_wakes(system: str, release: str) -> bool:
    """Whether lowering a socket's ``SO_RCVLOWAT`` wakes its reader for the bytes already there: Linux checks when the
    mark is set from 4.18 on (``tcp_set_rcvlowat``); nothing says BSD's and macOS's kqueue do, and bytes under a
    lowered mark could wait there for more. ``system``, ``release``: ``sys.platform``, ``platform.release()``."""
    found = re.match(r"(\d+)\.(\d+)", release)
    return system.startswith("linux") and found is not None and (int(found[1]), int(found[2])) >= (4, 18)


LOWERING_WAKES = hasattr(socket, "SO_RCVLOWAT") and lowering_wakes(sys.platform, platform.release())
"""Whether this machine's read loops use the socket's low-water mark."""


class _Feed(asyncio.BufferedProtocol):
    """The connection's protocol while the read loop runs: each socket read lands in one buffer and is copied into the
    parser's, where asyncio's stream reader copies it three times and the parser once more (decision 0049). Everything
    else (the end of the stream, a lost connection, the writer's flow control) is left to the stream reader's
    protocol, as before."""

    def __init__(self, transport: asyncio.BaseTransport, original: Any, reader: asyncio.StreamReader, parser: Parser):
        self.transport = transport
        self.original = original
        self.reader = reader
        self.parser = parser  # its ``buf``: what it has still to parse
        self.area = memoryview(bytearray(READ_SIZE))  # what each socket read fills
        self.size = 0  # bytes added since the last parse
        self.waiter: asyncio.Future[None] | None = None
        self.spilled: list[bytes] = []  # bytes that came while the parser's buffer could not grow

    @classmethod
    def of(cls, transport: Any, parser: Parser) -> _Feed | None:
        """The feed of a TCP connection (TLS on it included) into ``parser``, set as its protocol; None for a
        websocket."""
        writer = getattr(transport, "_io_writer", None)  # TcpTransport
        reader = getattr(transport, "_io_reader", None)
        if writer is None or reader is None or writer.transport.is_closing():
            return None
        feed = cls(writer.transport, writer.transport.get_protocol(), reader, parser)
        if reader._buffer:  # read by the stream reader before the switch
            feed.size = len(reader._buffer)
            parser.buf += reader._buffer
            reader._buffer.clear()
        writer.transport.set_protocol(feed)
        return feed

    @property
    def paused(self) -> bool:
        """Whether the socket's reading is paused (``FEED_AHEAD``), as the transport says."""
        return not self.transport.is_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.area

    def buffer_updated(self, nbytes: int) -> None:
        data = self.area[:nbytes]
        try:
            if self.spilled:
                raise BufferError  # after bytes that wait: in order
            self.parser.buf += data
        except BufferError:  # a handler awaits while the parser holds a view of its buffer: added after the parse
            self.spilled.append(bytes(data))
        self.size += nbytes
        if self.size > FEED_AHEAD and not self.paused:  # the read loop is busy elsewhere: the socket keeps the rest
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        keep_open = self.original.eof_received()
        self._wake()
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.original.connection_lost(exc)
        self._wake()

    def pause_writing(self) -> None:
        self.original.pause_writing()

    def resume_writing(self) -> None:
        self.original.resume_writing()

    def close(self) -> None:
        """The read loop ended (a reconnect, a close): what still comes goes to the stream reader, as before."""
        self.transport.set_protocol(self.original)
        if self.paused:
            self.transport.resume_reading()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self) -> int:
        """Bytes added since the last parse, once there are any, or 0 at the end of the stream; a lost connection's
        error raised (as the stream reader's ``read``)."""
        while not self.size:
            if (exc := self.reader.exception()) is not None:
                raise exc
            if self.reader.at_eof():
                return 0
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.size

    def parsed(self) -> None:
        """The parser took what was added; what came meanwhile and could not be added is, for the next parse."""
        self.size = sum(map(len, self.spilled))
        for data in self.spilled:
            self.parser.buf += data
        self.spilled.clear()
        if self.paused:
            self.transport.resume_reading()


class _LowWater:
    """The read loop's socket low-water mark (``SO_RCVLOWAT``): the kernel wakes the loop only once the socket holds
    that many bytes, or its buffer is under pressure; a timer lowers it again after ``GATHER_MAX_WAIT``."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.mark = 0  # bytes the socket waits for (0: any)
        self.timer: asyncio.TimerHandle | None = None  # set with every mark, until the next read

    @classmethod
    def of(cls, transport: Any) -> _LowWater | None:
        """The low-water mark of a TCP connection's socket (TLS on it included); None for a websocket, or where
        lowering the mark may not wake the reader (``LOWERING_WAKES``)."""
        writer = getattr(transport, "_io_writer", None)  # TcpTransport
        sock = writer.get_extra_info("socket") if writer is not None else None
        if sock is None or not LOWERING_WAKES:
            return None
        return cls(sock)

    def read(self) -> bool:
        """A read returned: whether the socket gathered for it (a mark was set after the read before)."""
        gathered = self.timer is not None
        self.stop()
        return gathered

    def wait_for(self, wanted: int) -> None:
        """Wake the loop once the socket holds ``wanted`` bytes, or after ``GATHER_MAX_WAIT``; 0: for any byte. Whatever
        mark stays in place (the socket may refuse one), the timer lowers it."""
        self._set(wanted)
        if self.mark:
            self.timer = asyncio.get_running_loop().call_later(GATHER_MAX_WAIT, self._set, 0)

    def stop(self) -> None:
        """No timer outlives a read, nor the read loop."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _set(self, mark: int) -> None:
        """Set the mark (0: any byte); where the socket refuses it (closed meanwhile, or the platform), it stays."""
        if mark != self.mark:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(mark, 1))
            except OSError:
                return
            self.mark = mark


async def open_client(
    options: ConnectionOptions, reconnect_for: float | None = None, name: str = "spark-jetstream"
) -> RawClient:
    """A connected client for ``options``, or a ``ConnectError`` saying what went wrong: the files are
    checked first, and refused credentials or a server without TLS fail at once instead of at the timeout.
    ``reconnect_for``: seconds of reconnect attempts (each server's, refused at once) before the client closes;
    None: for ever. ``name``: the client's name in the server's connection list."""
    check_credentials(options)
    tls = tls_context(options)
    errors: list[BaseException] = []
    refused = asyncio.Event()  # retrying refused credentials or a server without TLS is pointless: fail at once

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)
        log.debug("nats client error: %s", type(exc).__name__)
        if is_auth_error(exc) or isinstance(exc, TlsNotOfferedError):
            refused.set()

    client = RawClient(require_tls=options.wants_tls, silence_timeout=options.silence_timeout)
    kwargs: dict[str, Any] = dict(
        servers=list(options.servers),
        name=name,
        connect_timeout=max(0.1, min(options.connect_timeout, 2.0)),
        allow_reconnect=True,
        max_reconnect_attempts=-1 if reconnect_for is None else max(1, math.ceil(reconnect_for / RECONNECT_WAIT)),
        reconnect_time_wait=RECONNECT_WAIT,
        reconnect_to_server_handler=client.next_server,
        reconnected_cb=client.on_reconnected,
        error_cb=on_error,
        tls=tls,
        user_credentials=RawCredentials(options.creds_secret) if options.creds_secret else options.creds,
        nkeys_seed=options.nkey,
        nkeys_seed_str=options.nkey_secret,
        token=options.token,
        user=options.user,
        password=options.password,
        pending_size=64 * 1024 * 1024,
        inbox_prefix=options.inbox_prefix,
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
        raise ConnectError(explain_failure(errors, options))
    try:
        _check_version(client, options)
    except JetStreamError:
        await client.close()
        raise
    return client


async def _abandon(client: RawClient) -> None:
    try:
        await asyncio.wait_for(client.close(), 2)
    except Exception:
        log.debug("closing a failed connection attempt failed", exc_info=True)


def server_version(client: RawClient) -> tuple[Version, str]:
    """The connected server's version, as a tuple and as shown to users (from its INFO)."""
    try:
        version = client.connected_server_version
        found = (version.major, version.minor, version.patch)
        return found, ".".join(map(str, found)) + (f"-{version.dev}" if version.dev else "")
    except ValueError:  # not a semantic version
        return (0, 0, 0), "unknown"


def server_address(client: RawClient, options: ConnectionOptions | None = None) -> str:
    """``host:port`` of the server the client is on (or was last on), else the servers option."""
    url = client.connected_url or (client._current_server.uri if client._current_server else None)
    if url is not None:
        return _address(url)
    return options.shown_servers if options is not None else "?"


def _address(url: ParseResult) -> str:
    """``host:port`` of a server URL, without any credentials it holds."""
    return f"{url.hostname}:{url.port}"


def _check_version(client: RawClient, options: ConnectionOptions) -> None:
    found, shown = server_version(client)
    require(found, shown, server_address(client, options), ANY_USE, "")
