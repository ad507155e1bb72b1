"""The JetStream API calls the connector makes, as raw JSON requests.

nats-py's JetStream manager lacks the priority-group fields, UNPIN and Direct Get batches, so
every call here is a plain request on ``$JS.API.*`` (or ``$JS.<domain>.API.*``) with the
server's JSON, and API errors become the connector's exceptions with actionable messages.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client import retry
from spark_jetstream.client.connection import CLUSTER_BUSY_CODES, JETSTREAM_UP, Connection
from spark_jetstream.client.retry import Retry
from spark_jetstream.errors import (
    ApiError,
    ConsumerNotFoundError,
    StreamNotFoundError,
)

STREAM_NOT_FOUND = 10059
CONSUMER_NOT_FOUND = 10014
JETSTREAM_NOT_ENABLED = 10039
"""JetStream not enabled for the account: also what an account without JetStream hears that should reach a stream
shared from another account through that account's imported API."""
NO_JETSTREAM_HINT = (
    ". A stream shared from another account is reached through the JetStream API this account imports: set the "
    "apiPrefix option to the import's prefix (e.g. JS.OWNER.API; docs: Security guide)."
)
PRIORITY_GROUP_UNKNOWN = 10160
NO_MESSAGE_FOUND = 10037
ASSET_OFFLINE_CODES = frozenset({10118, 10119})
"""*stream is offline* / *consumer is offline*: every peer of its group is down (a whole-cluster
restart); retried within the deadline. The variants with a reason (10194/10195) are real and raised."""

_CONFIRM_TIMEOUT = 1.0
"""Seconds to wait for the meta leader's list of names (it answers in milliseconds when there is one)."""
NOT_FOUND_GRACE = 2.0
"""Seconds a not-found is retried when the meta leader cannot be asked for the names (a user without
``$JS.API.STREAM.NAMES``/``CONSUMER.NAMES``) although ``$JS.API.INFO`` answers; then it is believed."""

STORE_RACE = (10049, "error creating store for stream")
"""A stream create that raced nats-server's own clean-up: deleting an account's last stream removes its then-empty
``streams`` directory in the background, and a create meanwhile fails to make its directory (2.15; measured: 19
of 11,974 create-after-delete pairs under load). Asked again for ``STORE_RACE_GRACE`` (a create of the same
config is idempotent); a store error that lasts (a full or read-only disk) is then raised as the server gave it."""
STORE_RACE_GRACE = 1.0

log = logging.getLogger(__name__)

PRIORITY_GROUP = "PCG"
"""The priority group every member consumer uses (as pcgroups does)."""


def pin_holder(info: dict[str, Any], group: str | None = PRIORITY_GROUP) -> str | None:
    """The pin id a consumer's priority group holds, from its consumer info (``group`` None: whichever group)."""
    groups = info.get("priority_groups") or []
    return next((g.get("pinned_client_id") for g in groups if group is None or g.get("group") == group), None)


def describe_asset(stream: str, consumer: str = "") -> str:
    """How messages name what a call is about."""
    if consumer:
        return f"consumer {consumer!r} on stream {stream!r}"
    return f"stream {stream!r}" if stream else "the JetStream API"


class JetStreamApi:
    """Sync JetStream API calls over one ``Connection``."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.prefix = conn.options.api_prefix

    def __repr__(self) -> str:
        return f"JetStreamApi({self.conn!r})"

    # -- plumbing ----------------------------------------------------------------------------

    def subject(self, *tokens: str) -> str:
        return ".".join((self.prefix, *tokens))

    def decode(self, raw: bytes, what: str, stream: str = "", consumer: str = "") -> dict[str, Any]:
        """Parse an API reply; raise the connector's error for an API error.

        A missing stream or consumer gets a message that names it and says what to check.
        """
        reply = json.loads(raw)
        error = reply.get("error")
        if not error:
            return reply
        code, err_code = error.get("code", 0), error.get("err_code", 0)
        if (err_code == STREAM_NOT_FOUND and stream) or (err_code == CONSUMER_NOT_FOUND and consumer):
            raise self.not_found(err_code, stream, consumer)
        description = error.get("description", "unknown error")
        hint = NO_JETSTREAM_HINT if err_code == JETSTREAM_NOT_ENABLED and not self.conn.options.api_import else ""
        raise ApiError(f"{what}: {description} (error {err_code}){hint}", code, err_code, description)

    def not_found(self, err_code: int, stream: str, consumer: str = "") -> StreamNotFoundError | ConsumerNotFoundError:
        """The error for a stream (``STREAM_NOT_FOUND``) or consumer that does not exist: it names it and
        says what to check. Raised only once the meta leader confirmed it (``call_async``)."""
        where = self.conn.server_url + (f" in domain {self.conn.options.domain}" if self.conn.options.domain else "")
        if err_code == STREAM_NOT_FOUND:
            return StreamNotFoundError(
                f"Stream {stream!r} does not exist on {where}: check the stream option or create the stream.",
                404,
                err_code,
            )
        return ConsumerNotFoundError(
            f"Consumer {consumer!r} on stream {stream!r} does not exist on {where}: check the group "
            "option, or create the group's member consumers.",
            404,
            err_code,
        )

    def call(
        self,
        tokens: tuple[str, ...],
        body: dict[str, Any] | None,
        what: str,
        stream: str = "",
        consumer: str = "",
    ) -> dict[str, Any]:
        """``call_async`` from sync code."""
        return self.conn.run(self.call_async(tokens, body, what, stream, consumer))

    async def call_async(
        self,
        tokens: tuple[str, ...],
        body: dict[str, Any] | None,
        what: str,
        stream: str = "",
        consumer: str = "",
    ) -> dict[str, Any]:
        """One API request with a JSON body, through the one retry layer (``retry.request``); errors become the
        connector's exceptions.

        Answers that only mean "no leader right now" (``CLUSTER_BUSY_CODES``, ``ASSET_OFFLINE_CODES``) are asked
        again, and so is a stream's or consumer's request that got no answer or no responders; a "not found" is
        believed only once the meta leader confirms it (``_missing``): during an election, and from a server still
        replaying its store after a restart, the API answers "not found" for streams and consumers that exist. If
        the names cannot be asked but JetStream answers, a not-found that lasts ``NOT_FOUND_GRACE`` is believed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.conn.options.request_timeout
        unconfirmed = 0.0  # when a not-found that the meta leader could not confirm was first seen
        store_failed = 0.0  # when a create first failed to make its store (``STORE_RACE``)

        async def answer(raw: bytes) -> dict[str, Any]:
            nonlocal unconfirmed, store_failed
            try:
                return self.decode(raw, what, stream, consumer)
            except (StreamNotFoundError, ConsumerNotFoundError) as exc:
                confirmed, answered = await self._missing(stream, consumer, deadline)
                if confirmed is not None:
                    raise confirmed from None
                if answered:  # the meta leader lists it: a server still recovering answered
                    unconfirmed = 0.0
                    raise Retry("a server answered 'not found' although the meta leader lists it") from None
                unconfirmed = unconfirmed or loop.time()
                lasted = loop.time() - unconfirmed >= NOT_FOUND_GRACE
                if lasted and await self.conn.jetstream_state(0.5) == JETSTREAM_UP:
                    raise exc from None  # the names cannot be asked (permissions?), but JetStream has its leader
                raise Retry("a server answered 'not found' and no meta leader answered to confirm it") from None
            except ApiError as exc:
                if exc.err_code in CLUSTER_BUSY_CODES | ASSET_OFFLINE_CODES:
                    raise Retry(str(exc)) from None
                if (exc.err_code, exc.description) == STORE_RACE:
                    store_failed = store_failed or loop.time()
                    if loop.time() - store_failed < STORE_RACE_GRACE:
                        raise Retry(str(exc)) from None
                raise

        async def unanswered() -> None:  # no leader now (RESET is served by the leader alone), or no such thing
            confirmed, _ = await self._missing(stream, consumer, deadline)
            if confirmed is not None:
                raise confirmed from None

        payload = json.dumps(body).encode() if body is not None else b""
        asset = describe_asset(stream, consumer)
        return await retry.request(
            self.conn, self.subject(*tokens), payload, asset, answer, unanswered if stream else None
        )

    async def _missing(
        self, stream: str, consumer: str, deadline: float
    ) -> tuple[StreamNotFoundError | ConsumerNotFoundError | None, bool]:
        """The not-found error to raise if the meta leader confirms it, and whether it answered at all.

        ``STREAM.NAMES`` and ``CONSUMER.NAMES`` are answered by the meta leader alone, from the
        cluster's assignments: authoritative, unlike the "not found" a recovering server or a leaderless
        group gives. No answer from them (an election) confirms nothing.
        """
        remaining = deadline - asyncio.get_running_loop().time()
        timeout = max(0.05, min(remaining, _CONFIRM_TIMEOUT))
        try:
            if not await self._listed(("STREAM", "NAMES"), "streams", stream, timeout):
                return self.not_found(STREAM_NOT_FOUND, stream), True
            if consumer and not await self._listed(("CONSUMER", "NAMES", stream), "consumers", consumer, timeout):
                return self.not_found(CONSUMER_NOT_FOUND, stream, consumer), True
        except (NoRespondersError, NatsTimeoutError, ConnectionClosedError, ApiError) as exc:
            log.debug("Could not confirm that %s is missing: %s", describe_asset(stream, consumer), exc)
            return None, False
        return None, True

    async def _listed(self, tokens: tuple[str, ...], key: str, name: str, timeout: float) -> bool:
        """Whether ``name`` is among the names the meta leader lists (paged); raises if it cannot answer."""
        offset = 0
        while True:
            body = json.dumps({"offset": offset}).encode()
            reply = json.loads((await self.conn.client.request(self.subject(*tokens), body, timeout=timeout)).data)
            if error := reply.get("error"):
                if error.get("err_code") == STREAM_NOT_FOUND:
                    return False  # the stream of the consumer is gone
                code, err_code = error.get("code", 0), error.get("err_code", 0)
                raise ApiError(error.get("description", "unknown error"), code, err_code)
            names = reply.get(key) or []
            if name in names:
                return True
            offset += len(names)
            if not names or offset >= reply.get("total", 0):
                return False

    # -- streams -----------------------------------------------------------------------------

    def account_info(self) -> dict[str, Any]:
        return self.call(("INFO",), None, "JetStream account info")

    def stream_info(self, stream: str, deleted_details: bool = False) -> dict[str, Any]:
        """Stream info; with ``deleted_details`` its state lists the removed seqs above ``first_seq``."""
        return self.conn.run(self.stream_info_async(stream, deleted_details))

    async def stream_info_async(self, stream: str, deleted_details: bool = False) -> dict[str, Any]:
        body = {"deleted_details": True} if deleted_details else None
        return await self.call_async(("STREAM", "INFO", stream), body, f"Stream {stream!r}", stream)

    def stream_names(self, subject: str | None = None) -> list[str]:
        """The account's streams; with ``subject``, those whose subjects overlap it (wildcards too)."""
        return self.conn.run(self.stream_names_async(subject))

    async def stream_names_async(self, subject: str | None = None) -> list[str]:
        """``stream_names`` on the connection's loop."""
        names: list[str] = []
        while True:
            body: dict[str, Any] = {"offset": len(names)}
            if subject is not None:
                body["subject"] = subject
            page = await self.call_async(("STREAM", "NAMES"), body, "Listing streams")
            names += page.get("streams") or []
            if not page.get("streams") or len(names) >= page.get("total", 0):
                return names

    def subjects(self, stream: str, filter_subject: str) -> list[str]:
        """The subjects stored in ``stream`` that match ``filter_subject``."""
        info = self.call(("STREAM", "INFO", stream), {"subjects_filter": filter_subject}, f"Stream {stream!r}", stream)
        return sorted((info["state"].get("subjects") or {}).keys())

    def create_stream(self, config: dict[str, Any]) -> dict[str, Any]:
        return self.call(("STREAM", "CREATE", config["name"]), config, f"Creating stream {config['name']!r}")

    def delete_stream(self, stream: str) -> None:
        self.call(("STREAM", "DELETE", stream), None, f"Deleting stream {stream!r}", stream)

    def purge_stream(self, stream: str, keep_from_seq: int | None = None) -> None:
        body = {"seq": keep_from_seq} if keep_from_seq else None
        self.call(("STREAM", "PURGE", stream), body, f"Purging stream {stream!r}", stream)

    def purge_subjects(self, stream: str, subjects: str) -> int:
        """Remove every message on ``subjects`` (a filter, wildcards too); returns how many went."""
        reply = self.call(("STREAM", "PURGE", stream), {"filter": subjects}, f"Purging stream {stream!r}", stream)
        return int(reply.get("purged", 0))

    async def purge_below(self, stream: str, seq: int, subject: str = "") -> int:
        """Remove the messages below ``seq`` (matching ``subject`` if given); returns how many went."""
        body: dict[str, Any] = {"seq": seq}
        if subject:
            body["filter"] = subject
        reply = await self.call_async(("STREAM", "PURGE", stream), body, f"Purging stream {stream!r}", stream)
        return int(reply.get("purged", 0))

    # -- consumers ---------------------------------------------------------------------------

    def consumer_info(self, stream: str, consumer: str) -> dict[str, Any]:
        return self.call(("CONSUMER", "INFO", stream, consumer), None, f"Consumer {consumer!r}", stream, consumer)

    async def consumer_info_async(self, stream: str, consumer: str) -> dict[str, Any]:
        tokens = ("CONSUMER", "INFO", stream, consumer)
        return await self.call_async(tokens, None, f"Consumer {consumer!r}", stream, consumer)

    async def consumer_infos_async(self, stream: str, consumers: list[str]) -> dict[str, dict[str, Any] | None]:
        """Consumer info of each named consumer (None where it does not exist), asked all at once."""
        infos = await asyncio.gather(*(self.consumer_info_async(stream, c) for c in consumers), return_exceptions=True)
        for info in infos:
            if isinstance(info, BaseException) and not isinstance(info, ConsumerNotFoundError):
                raise info
        return {c: None if isinstance(i, BaseException) else i for c, i in zip(consumers, infos, strict=True)}

    def consumer_names(self, stream: str) -> list[str]:
        """Names of every consumer on the stream."""
        names: list[str] = []
        while True:
            page = self.call(
                ("CONSUMER", "NAMES", stream),
                {"offset": len(names)},
                f"Listing consumers of {stream!r}",
                stream,
            )
            names += page.get("consumers") or []
            if not page.get("consumers") or len(names) >= page.get("total", 0):
                return names

    def create_consumer(self, stream: str, config: dict[str, Any], action: str = "") -> dict[str, Any]:
        """Create or update a durable consumer; ``action`` is ``""``, ``"create"`` or ``"update"``."""
        return self.conn.run(self.create_consumer_async(stream, config, action))

    async def create_consumer_async(self, stream: str, config: dict[str, Any], action: str = "") -> dict[str, Any]:
        body: dict[str, Any] = {"stream_name": stream, "config": config}
        if action:
            body["action"] = action
        name = config.get("durable_name") or config["name"]  # a durable, or an ephemeral with a name
        what = f"Creating consumer {name!r} on {stream!r}"
        return await self.call_async(("CONSUMER", "CREATE", stream, name), body, what, stream)

    def delete_consumer(self, stream: str, consumer: str) -> None:
        self.conn.run(self.delete_consumer_async(stream, consumer))

    async def delete_consumer_async(self, stream: str, consumer: str) -> None:
        tokens = ("CONSUMER", "DELETE", stream, consumer)
        await self.call_async(tokens, None, f"Deleting consumer {consumer!r}", stream, consumer)

    async def unpin(self, stream: str, consumer: str, group: str = PRIORITY_GROUP) -> None:
        """Release the consumer's pin: a waiting pull of the old holder gets 423."""
        tokens = ("CONSUMER", "UNPIN", stream, consumer)
        await self.call_async(tokens, {"group": group}, f"Unpinning consumer {consumer!r}", stream, consumer)

    async def reset(self, stream: str, consumer: str, seq: int) -> dict[str, Any]:
        """Drop pending deliveries, deliver from ``seq`` on (ack floor = seq - 1); returns consumer info."""
        tokens = ("CONSUMER", "RESET", stream, consumer)
        what = f"Resetting consumer {consumer!r} to seq {seq}"
        return await self.call_async(tokens, {"seq": seq}, what, stream, consumer)
