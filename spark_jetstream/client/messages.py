"""Reading single messages: Direct Get, ``STREAM.MSG.GET`` on the leader, and whether the user may Direct Get.

Bulk Direct Get reads live in ``read/direct.py``; these are the one-message questions planning and the key-value
markers ask.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection import DIRECT_ATTEMPT, Connection
from spark_jetstream.client.jsapi import NO_MESSAGE_FOUND, JetStreamApi
from spark_jetstream.client.protocol import header_fields
from spark_jetstream.client.retry import not_permitted
from spark_jetstream.errors import ApiError, ClusterUnavailableError, ConnectError, NotPermittedError


@dataclass(frozen=True)
class DirectMessage:
    """One message returned by Direct Get."""

    seq: int
    subject: str
    num_pending: int | None
    data: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


async def last_message_async(api: JetStreamApi, stream: str, subject: str) -> DirectMessage | None:
    """The last message on ``subject``, read from the stream leader (read-after-write safe)."""
    try:
        body = {"last_by_subj": subject}
        reply = await api.call_async(("STREAM", "MSG", "GET", stream), body, f"Reading {subject}", stream)
    except ApiError as exc:
        if exc.err_code == NO_MESSAGE_FOUND:
            return None
        raise
    return _taken(reply["message"])


def _taken(message: dict[str, Any]) -> DirectMessage:
    """A ``STREAM.MSG.GET`` message as a ``DirectMessage``."""
    headers = dict(header_fields(base64.b64decode(message["hdrs"]))) if message.get("hdrs") else {}
    return DirectMessage(
        seq=int(message["seq"]),
        subject=message["subject"],
        num_pending=None,
        data=base64.b64decode(message.get("data") or ""),
        headers=headers,
    )


async def next_seq_async(api: JetStreamApi, stream: str, request: dict[str, Any]) -> int | None:
    """The seq of the first message ``request`` names (``seq`` or ``start_time``, with ``next_by_subj``), read on
    the stream leader with ``STREAM.MSG.GET``: any stream, Direct Get or not, and read-after-write safe. None
    when no message matches."""
    message = await stored_message_async(api, stream, request)
    return None if message is None else int(message["seq"])


async def stored_message_async(api: JetStreamApi, stream: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """The message ``request`` names, as ``STREAM.MSG.GET`` on the stream leader gives it: ``seq``, ``subject``,
    ``time`` (RFC 3339), base64 ``data`` and ``hdrs`` (the raw header block; absent without headers). None when no
    message matches."""
    try:
        reply = await api.call_async(("STREAM", "MSG", "GET", stream), request, f"Reading {stream!r}", stream)
    except ApiError as exc:
        if exc.err_code == NO_MESSAGE_FOUND:
            return None
        raise
    message: dict[str, Any] = reply["message"]
    return message


def time_ns(text: str) -> int:
    """A server's RFC 3339 time (nanosecond digits, ``Z``: a message's, stream info's ``last_ts``) in ns since the
    epoch."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    seconds = int(datetime.fromisoformat(whole + "+00:00").timestamp())
    return seconds * 1_000_000_000 + int((fraction + "000000000")[:9])


def time_text(ns: int) -> str:
    """ns since the epoch as RFC 3339 text with nanosecond digits, as the server writes and reads times."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:09d}Z"


async def next_on_leader(api: JetStreamApi, stream: str, subject: str, after: int) -> int | None:
    """The seq of the first message after ``after`` matching ``subject`` (a filter, wildcards too), as the stream leader
    holds it; None: none. Asked so that "none" is an answer, not an API error ("no message found", which the server
    counts in the JetStream API error counter operators alert on): the subject's last message first, and its next
    after ``after`` only when that one lies beyond. The last one is not believed missing on its word alone (for
    ``>`` the server loads the stream's last seq, which a purge or delete may have removed): the number of subjects
    that match is asked then, and a subject that held nothing at all is asked that from then on (``_HELD_NOTHING``)."""
    subject = subject or ">"
    key = (stream, subject)
    if key in _HELD_NOTHING:
        if not await subjects_matching(api, stream, subject):
            return None
        _HELD_NOTHING.discard(key)
    last = await stored_message_async(api, stream, {"last_by_subj": subject})
    if last is None:
        if not await subjects_matching(api, stream, subject):
            if len(_HELD_NOTHING) >= _HELD_NOTHING_MAX:
                _HELD_NOTHING.clear()
            _HELD_NOTHING.add(key)
            return None
    elif int(last["seq"]) <= after:
        return None
    return await next_seq_async(api, stream, {"seq": after + 1, "next_by_subj": subject})


async def subjects_matching(api: JetStreamApi, stream: str, subject: str) -> int:
    """How many of the stream's subjects match ``subject``, from the stream leader: ``STREAM.INFO`` with it as the
    subjects filter and an offset past every subject, so that the count alone comes back. Asked where a filter's last
    message was not found, which for any filter but ``>`` means it matches nothing: the server's walk of its subject
    index then finds nothing to list. For ``>`` (whose last message the server takes to be the stream's last, which
    may be deleted) the stream's own count of subjects answers, without a list of every subject built and sorted."""
    if subject == ">":
        return int((await api.stream_info_async(stream))["state"].get("num_subjects") or 0)
    body = {"subjects_filter": subject, "offset": 1 << 30}
    info = await api.call_async(("STREAM", "INFO", stream), body, f"Stream {stream!r}", stream)
    return int(info.get("total") or 0)


_HELD_NOTHING: set[tuple[str, str]] = set()
"""(stream, subject) pairs whose last look on the stream leader found no message at all (a partition no key hashed to
yet): their last message cannot be asked without an API error, their number of subjects can. The first look costs one
error per such subject and process; a wrong entry costs a request, never a wrong answer."""
_HELD_NOTHING_MAX = 10_000


async def first_on_leader(api: JetStreamApi, stream: str, filters: Sequence[str], after: int, end: int) -> int | None:
    """The first seq in ``(after, end]`` of a message matching any of ``filters``, as the stream leader holds it
    (``next_on_leader``); None: none. What a reader asks before it believes a replica, or a consumer, that says
    nothing more is left: a replica that lags, or a server cut off that does not know it yet, answers from what it
    holds."""
    found = [await next_on_leader(api, stream, subject, after) for subject in filters]
    return min((seq for seq in found if seq is not None and seq <= end), default=None)


def may_direct_get(api: JetStreamApi, stream: str) -> bool:
    """Whether the NATS user may send Direct Get requests to ``stream`` (a stream that allows Direct Get).

    The server does not answer a request its permissions refuse: it reports ``Permissions Violation for
    Publish to "$JS.API.DIRECT.GET.<stream>"`` asynchronously (``-ERR``; measured: sometimes after the answer
    to a PING sent right after the request). So one request tells: an answer (a message, or a status) means
    allowed, the violation means refused; neither within the connect timeout counts as allowed, and the read
    itself then says what is wrong.
    """
    return may_request(api, api.subject("DIRECT", "GET", stream), b'{"seq": 1}')


def may_request(api: JetStreamApi, subject: str, payload: bytes) -> bool:
    """Whether the NATS user may publish ``payload`` to the API subject ``subject``, told as ``may_direct_get``
    tells it (send a request whose answer changes nothing: an error reply means allowed)."""
    return api.conn.run(_may_request_async(api, subject, payload))


async def _may_request_async(api: JetStreamApi, subject: str, payload: bytes) -> bool:
    client = api.conn.client
    sub = await client.subscribe(client.new_inbox(), max_msgs=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + max(api.conn.options.connect_timeout, 5.0)
    try:
        await client.publish(subject, payload, reply=sub.subject)
        while loop.time() < deadline:
            refused = client.refused(subject, started)
            if refused is not None and refused[0] == "publish to":
                return False
            try:
                await sub.next_msg(timeout=0.02)
                return True
            except NatsTimeoutError:
                continue
        return True
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def direct_get(api: JetStreamApi, stream: str, request: dict[str, Any]) -> DirectMessage | None:
    """One Direct Get (``seq``/``next_by_subj``/``last_by_subj``/``start_time``); None when none matches.

    With ``batch: 1`` the reply carries ``Nats-Num-Pending``: matching messages after this one.
    """
    return api.conn.run(direct_get_async(api, stream, request))


async def direct_get_async(api: JetStreamApi, stream: str, request: dict[str, Any]) -> DirectMessage | None:
    """``direct_get`` on the connection's loop: the last message a batched request answers."""
    found = (await direct_gets_async(api, stream, request)).messages
    return found[-1] if found else None


@dataclass(frozen=True)
class DirectAnswer:
    """What one Direct Get request answered: its messages, and how many more matching messages its end-of-batch
    reply says it left out (``Nats-Num-Pending``: a batch ends at its ``max_bytes``, and at 64 MiB whatever it
    asks)."""

    messages: list[DirectMessage]
    left: int = 0


async def direct_gets_async(api: JetStreamApi, stream: str, request: dict[str, Any]) -> DirectAnswer:
    """Every message one Direct Get request answers (one without ``batch``/``multi_last``, else up to the end of the
    batch).

    Asked again on a new inbox when no reply came within ``conn.direct_wait`` (longer while the server is busy,
    ``conn.asked_too_soon``; or the next one within ``DIRECT_ATTEMPT``), until the API timeout: any replica may
    answer, and a request routed to a silent one (frozen, or cut off: the other servers keep routing to it for
    minutes) is lost (late replies to an earlier attempt are ignored)."""
    conn = api.conn
    started = time.monotonic()
    attempts = stalled = foreign = 0
    while True:
        found = await _direct_gets_once(api, stream, request, conn.direct_wait(stalled))
        attempts += 1
        if isinstance(found, DirectAnswer):
            return found
        if found is not None:  # another stream answered: a mirror (``read.direct``), asked again
            foreign += 1
            if foreign >= FOREIGN_RETRIES:
                return await _ask_leader(api, stream, request, found)
            continue
        stalled += await conn.asked_too_soon()
        if (refused := conn.client.refused(f"{api.prefix}.DIRECT.GET.{stream}", started)) is not None:
            raise NotPermittedError(not_permitted(*refused, f"stream {stream!r}"))
        if deadline := conn.out_of_time(started):
            what = f"Direct Get on stream {stream!r}"
            silence = conn.client.silence_since(started)
            if conn.client.answering() and not silence:
                raise ClusterUnavailableError(conn.unanswered(what, deadline, f"{attempts} requests"))
            raise ClusterUnavailableError(
                f"{what} got no answer from any replica within {deadline:g}s ({attempts} requests through "
                f"{conn.server_url}){silence}: are its servers up and reachable?"
            )


FOREIGN_RETRIES = 16
"""Direct Get answers in a row from another stream (a mirror) before the stream leader is asked instead: with the
origin and two mirrors answering on one server, 16 mirror answers in a row happen once in 660 requests; where only a
mirror is on the connected server (it always answers: the server prefers its own subscribers), every one."""


async def _ask_leader(api: JetStreamApi, stream: str, request: dict[str, Any], mirror: str) -> DirectAnswer:
    """``request`` asked of the stream leader (``STREAM.MSG.GET``: one message) after its mirror ``mirror`` kept
    answering the Direct Gets; a ``multi_last`` request, which the leader's API does not take, is refused with a
    sentence."""
    if "multi_last" in request:
        raise ApiError(
            f"Direct Gets of stream {stream!r} through {api.conn.server_url} are answered by its mirror {mirror!r} "
            f"({FOREIGN_RETRIES} times in a row), which may lag or hold only part of it: connect to a server that "
            f"holds {stream!r} itself."
        )
    asked = {key: value for key, value in request.items() if key not in ("batch", "max_bytes")}
    message = await stored_message_async(api, stream, asked)
    return DirectAnswer([] if message is None else [_taken(message)])


async def _direct_gets_once(
    api: JetStreamApi, stream: str, request: dict[str, Any], first_wait: float
) -> DirectAnswer | str | None:
    """One attempt of ``direct_gets_async``: None when the first reply did not come within ``first_wait`` s, or a
    later one within ``DIRECT_ATTEMPT``; the answering stream's name when another stream (a mirror) answered."""
    subject = f"{api.prefix}.DIRECT.GET.{stream}"
    inbox = api.conn.client.new_inbox()
    sub = await api.conn.client.subscribe(inbox)
    batched = "batch" in request or "multi_last" in request
    try:
        await api.conn.client.publish(subject, json.dumps(request).encode(), reply=inbox)
        sent = time.monotonic()
        found: list[DirectMessage] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=max(DIRECT_ATTEMPT, first_wait) if found else first_wait)
            except ConnectionClosedError:
                raise ConnectError(f"The connection to {api.conn.server_url} is closed.") from None
            except NatsTimeoutError:
                return None
            if not found:
                api.conn.replied(time.monotonic() - sent)
            headers = msg.headers or {}
            status = headers.get("Status")
            if status == "404":
                return DirectAnswer(found)
            if status == "204":  # the end of a batch
                return DirectAnswer(found, int(headers.get("Nats-Num-Pending") or 0))
            if status == "503":
                raise ApiError(
                    f"Stream {stream!r} does not answer Direct Get: enable it with allow_direct: true "
                    "(nats stream edit --allow-direct)."
                )
            if status:
                raise ApiError(f"Direct Get on stream {stream!r}: {status} {headers.get('Description', '')}")
            if (answered := headers.get("Nats-Stream", stream)) != stream:
                return answered
            pending = headers.get("Nats-Num-Pending")
            found.append(
                DirectMessage(
                    seq=int(headers["Nats-Sequence"]),
                    subject=headers.get("Nats-Subject", ""),
                    num_pending=int(pending) if pending is not None else None,
                    data=msg.data,
                    headers=dict(headers),
                )
            )
            if not batched:
                return DirectAnswer(found)
    finally:
        with contextlib.suppress(ConnectionClosedError):
            await sub.unsubscribe()


def last_seqs(conn: Connection, stream: str, subjects: list[str], up_to_seq: int, max_bytes: int) -> dict[str, int]:
    """The seq of the last message up to ``up_to_seq`` on each of ``subjects`` (at most 1,024, each holding one) that
    has one: Direct Get ``multi_last`` (nats-server 2.11+) of ``max_bytes`` at most, asked again for the subjects not
    answered while the server says it left some out (it stops at the request's ``max_bytes``, and at 64 MiB whatever
    it asks: 1,024 values of 68 KB lost 65 keys). An answer of none is asked again (``FOREIGN_RETRIES``): a mirror
    that holds none of them answers "not found" without its name."""
    api, latest, left, empty = JetStreamApi(conn), {}, list(subjects), 0
    while left:
        request = {"multi_last": left, "up_to_seq": up_to_seq, "batch": len(left), "max_bytes": max_bytes}
        answer = conn.run(direct_gets_async(api, stream, request))
        if not answer.messages and empty < FOREIGN_RETRIES:
            empty += 1
            continue
        latest.update((message.subject, message.seq) for message in answer.messages)
        if not answer.left or not answer.messages:
            return latest
        left = [subject for subject in left if subject not in latest]
    return latest
